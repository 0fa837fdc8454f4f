//! What a transaction runs on and what every step shares: the [`Node`] (its host root,
//! settings, profile and ports), the [`Report`] of a transaction, the changes prepared for
//! it, the host's facts for [`classify`](super::classify), and the journal's one way forward
//! ([`Node::event`], through [`machine`](super::machine), saved before the next side effect).
//!
//! # Failpoints
//! With the `failpoints` feature, `txn::<phase>` fires right after each phase is journalled
//! (before the next side effect), e.g. `FAILPOINTS=txn::applied=panic`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;

use super::classify::HostFacts;
use super::machine::{self, Event, Next};
use super::notices;
use super::ports::{HealthCheck, Restarter};
use crate::artifact::Platform;
use crate::containerd::{Current, DropinPolicy, Plan, RuntimeSpec};
use crate::hostroot::HostRoot;
use crate::profile::Profile;
use crate::settings::Settings;
use crate::state::{InstalledShim, Journal, NodeState, Origin, Phase, StateStore};

/// What a transaction did, with the time of each phase (for the overhead benchmark).
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub installed: Vec<String>,
    pub removed: Vec<String>,
    pub unchanged: Vec<String>,
    pub restarts: u32,
    /// (phase reached, time the step leading to it took)
    pub phases: Vec<(Phase, Duration)>,
}

impl Report {
    /// A step ended in `phase` after `took`: kept for the caller and logged at debug level,
    /// so a timeline shows where a transaction's time went.
    pub(super) fn reached(&mut self, phase: Phase, took: Duration) {
        tracing::debug!(
            ?phase,
            took_us = took.as_micros() as u64,
            "transaction step done"
        );
        self.phases.push((phase, took));
    }
}

/// The node: where things are and how to reach the world.
pub struct Node<'a, R, H> {
    pub root: &'a HostRoot,
    pub settings: &'a Settings,
    pub profile: Profile,
    pub platform: Platform,
    pub origin: Origin,
    pub restarter: R,
    pub health: H,
}

/// What one transaction changes, ready to journal.
#[derive(Clone, Copy)]
pub(super) struct Steps<'a> {
    pub(super) prepared: &'a [Prepared],
    pub(super) removes: &'a [InstalledShim],
    pub(super) plan: &'a Plan,
    /// Every change only repairs drift.
    pub(super) repair: bool,
}

impl Steps<'_> {
    /// The Shims of the transaction: those installed, then those removed.
    pub(super) fn names(&self) -> Vec<String> {
        self.prepared
            .iter()
            .map(|p| p.record.name.clone())
            .chain(self.removes.iter().map(|r| r.name.clone()))
            .collect()
    }
}

/// A change after fetching: everything needed to apply it.
pub(super) struct Prepared {
    pub(super) record: InstalledShim,
    /// The stored artifact's tree, installed whole.
    pub(super) tree_src: PathBuf,
    pub(super) previous: Option<InstalledShim>,
    pub(super) runtime: RuntimeSpec,
}

pub(super) use crate::faults::point as failpoint;

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    pub(super) fn state_dir(&self) -> anyhow::Result<PathBuf> {
        Ok(self.root.resolve(&self.settings.paths.state_dir)?)
    }

    /// What the host looks like for [`classify`]: the handlers `current` defines and the
    /// installed binaries that exist.
    pub(super) fn host_facts_of(&self, current: &Current, state: &NodeState) -> HostFacts {
        HostFacts {
            handlers: current.handlers().unwrap_or_default(),
            binaries: state
                .shims
                .values()
                .filter(|r| self.root.resolve(&r.binary).is_ok_and(|p| p.exists()))
                .map(|r| r.binary.clone())
                .collect(),
        }
    }

    /// What the host looks like now (see [`classify`]); an unreadable config defines no
    /// handler.
    pub fn host_facts(&self, state: &NodeState) -> HostFacts {
        match self.load_config() {
            Ok(current) => self.host_facts_of(&current, state),
            Err(_) => HostFacts::default(),
        }
    }

    /// The node's containerd config as it is now, through the profile's layout.
    pub(super) fn load_config(&self) -> anyhow::Result<Current> {
        Ok(self.profile.layout().load(self.root)?)
    }

    /// True when the config loads and parses.
    pub(super) fn load_config_ok(&self) -> bool {
        self.load_config().is_ok_and(|c| c.handlers().is_ok())
    }

    pub(super) fn dropin_policy(&self) -> DropinPolicy {
        match &self.profile.dropin_dir {
            Some(d) => DropinPolicy::Dir(PathBuf::from(d)),
            None => DropinPolicy::Auto,
        }
    }

    /// The state store and state, with a journal left open still open (the caller recovers
    /// it with [`Node::recover_gated`]).
    pub fn open_unrecovered(&self) -> anyhow::Result<(StateStore, NodeState)> {
        let store = StateStore::open(&self.state_dir()?)?;
        let state = store.load()?.state;
        Ok((store, state))
    }

    pub(super) fn event(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        event: Event,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.as_mut() else {
            bail!("no open transaction for {event:?}")
        };
        match machine::next(j.phase, &event)? {
            Next::Phase(p) => j.phase = p,
            Next::Abort { reason } => bail!("transaction aborted: {reason}"),
        }
        if let Event::Failed { reason } = &event {
            j.reason = Some(reason.clone());
        }
        let phase = j.phase;
        store.save(state)?;
        failpoint(&format!("txn::{}", notices::phase_name(phase)));
        Ok(())
    }

    /// A step before anything on the host changed failed: the machine says the transaction
    /// aborts, and the journal closes.
    pub(super) fn abort(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: &str,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.as_ref() else {
            bail!("no open transaction to abort")
        };
        let failed = Event::Failed {
            reason: reason.to_string(),
        };
        match machine::next(j.phase, &failed)? {
            Next::Abort { .. } => {
                state.journal = None;
                store.save(state)?;
                Ok(())
            }
            Next::Phase(p) => bail!(
                "a transaction at {:?} cannot abort (it goes to {p:?})",
                j.phase
            ),
        }
    }

    pub(super) async fn verify_journal(&self, j: &Journal) -> Result<(), crate::node::NodeError> {
        let present: Vec<String> = j.pending.iter().map(|r| r.handler.clone()).collect();
        let absent: Vec<String> = j.removing.clone();
        self.health.verify(&present, &absent).await
    }
}
