//! The node agent: watch the cluster's Shims (their metadata; the spec is read per generation,
//! [`shim_cache`]), this Node and the pods on it; make the node
//! match (one transaction, one restart for every change that is ready); then label the
//! Node, publish the per-node state and emit Events.
//!
//! # Guarantees
//! - The label of a Shim is set only after containerd served its handler (the transaction
//!   verified it through CRI); it is removed *before* an uninstall starts, and an uninstall
//!   does not start unless that removal succeeded.
//! - An uninstall waits while pods on the node use the Shim's RuntimeClass (`Blocked`).
//! - A transaction finishes locally even when the API server is gone; the label and the state
//!   annotation are recomputed from the local state every round, so they arrive once it is
//!   back.
//! - A failing Shim is retried with capped exponential backoff; a new spec retries at once.
//!   When a batch of several changes fails without naming its culprit, each change is retried
//!   alone, so one bad Shim does not hold back the others.
//! - Rounds run on relevant changes only (Shim generations, this Node's labels, pods, files in
//!   `shims.d`), not on status or heartbeat updates.

use std::time::Duration;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use crate::api::names::FIELD_MANAGER;
use crate::reconciler::memory::Memory;
use crate::state::{NodeState, StateStore};
use crate::statics::Adoption;
use crate::txn::retain::RETAIN_CHECK_SECS;
use crate::txn::{HealthCheck, Node, Restarter};
use caches::{fingerprint, quiet, sleep_until_opt};
use gate::{GateTimings, SlotGate};
use reported::Reported;

mod caches;
pub mod gate;
mod node_sync;
mod outcome;
pub mod reported;
mod round;
mod round_events;
pub mod shim_cache;
mod view;

pub use reported::NODE_SYNC_RETRY_SECS;
/// Quiet time after a watch event before a round starts, so changes that arrive together
/// share one transaction (and one restart): the round waits until nothing it reads changed for
/// this long...
pub const ROUND_QUIET_MILLIS: u64 = 25;
/// ...but no longer than this after the first one.
pub const ROUND_QUIET_MAX_MILLIS: u64 = 500;

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Shutdown,
    /// The credentials on disk changed: connect again.
    Reconnect,
}

/// One agent session against one client.
pub struct Agent<'n, 'a, R, H> {
    pub node: &'n Node<'a, R, H>,
    pub client: Client,
    pub node_name: String,
    /// How long to wait for this node's Node object before giving up.
    pub node_wait: Duration,
    /// How often rotated credentials are looked for.
    pub credential_check: Duration,
    /// How this node waits for rollout slots.
    pub gate_timings: GateTimings,
    /// The startup taint this node names on its Node (`kubernetes.startup-taint`).
    pub startup_taint: Option<crate::cluster::readiness::StartupTaint>,
    pub(super) shutdown: Option<tokio_watch::Receiver<bool>>,
    /// What it remembers between rounds (the reconciler core's memory, as in `run` without a
    /// cluster).
    memory: Memory,
    /// What it has told the cluster, and its Node writes' retry.
    reported: Reported,
    recorder: Recorder,
    /// Publishes the rounds' Events in the background.
    events: crate::events::Sender,
    /// The round's Events, published at its end.
    outbox: round_events::RoundEvents,
}

impl<'n, 'a, R: Restarter, H: HealthCheck> Agent<'n, 'a, R, H> {
    pub fn new(node: &'n Node<'a, R, H>, client: Client, node_name: String) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(node_name.clone()),
        };
        let recorder = Recorder::new(client.clone(), reporter);
        Agent {
            node,
            events: crate::events::Sender::new(recorder.clone()),
            recorder,
            client,
            node_name,
            node_wait: Duration::from_secs(60),
            credential_check: Duration::from_secs(super::connect::CREDENTIAL_CHECK_SECS),
            gate_timings: GateTimings::default(),
            startup_taint: None,
            shutdown: None,
            memory: Memory::default(),
            reported: Reported::default(),
            outbox: round_events::RoundEvents::default(),
        }
    }

    /// Run until `shutdown` turns true or the credentials change. `files` nudges a round
    /// when `shims.d` or containerd's files change.
    pub async fn run(
        &mut self,
        store: &StateStore,
        state: &mut NodeState,
        mut shutdown: tokio_watch::Receiver<bool>,
        files: &mut mpsc::Receiver<()>,
        mut credentials_changed: impl FnMut() -> bool,
    ) -> anyhow::Result<Exit> {
        let crashed = self.memory.count_crashes(store, state);
        if !crashed.is_empty() {
            tracing::error!(shims = ?crashed, "the agent stopped during a round working on {}: counted as a crash of each", crashed.join(", "));
        }
        let mut adoption = Adoption::default();
        adoption.run_if_due(&self.node.health, store, state).await?;
        crate::telemetry::settled(state.shims.len(), Vec::new());
        crate::telemetry::doing(Some("connecting to the cluster".into()));
        let (nudge_tx, mut nudge) = mpsc::channel::<()>(1);
        let caches = self.start_watches(&nudge_tx);
        let mut cred_check = tokio::time::interval(self.credential_check);
        if let Some(exit) = self
            .wait_for_caches(
                &caches,
                &mut shutdown,
                &mut cred_check,
                &mut credentials_changed,
            )
            .await?
        {
            return Ok(exit);
        }
        self.watching(state, &shutdown).await;
        let mut last_fp = None;
        let mut retain_due = Instant::now() + Duration::from_secs(RETAIN_CHECK_SECS);
        loop {
            if self
                .housekeep(store, state, &mut adoption, &mut retain_due)
                .await?
            {
                last_fp = None; // the node's report changes
            }
            let due = self.next_due(state, retain_due);
            let timer_fired = due.is_some_and(|d| d <= Instant::now());
            let fp = fingerprint(&caches);
            if timer_fired || last_fp != Some(fp) || self.memory.take_rerun() {
                last_fp = Some(fp);
                self.round(store, state, &caches).await;
                crate::telemetry::settled(state.shims.len(), self.memory.failing());
                if self.memory.wants_rerun() {
                    continue;
                }
            }
            let due = earliest(self.next_due(state, retain_due), adoption.next_due());
            tokio::select! {
                _ = shutdown.changed() => return Ok(Exit::Shutdown),
                Some(()) = nudge.recv() => {
                    let reading = || caches.shims_reading.load(std::sync::atomic::Ordering::SeqCst);
                    quiet(&mut nudge, || fingerprint(&caches), reading).await
                }
                Some(()) = files.recv() => {
                    tokio::time::sleep(Duration::from_millis(crate::statics::FILE_SETTLE_MILLIS)).await;
                    while files.try_recv().is_ok() {}
                    last_fp = None;
                }
                _ = sleep_until_opt(due) => {}
                _ = cred_check.tick() => {
                    if credentials_changed() {
                        tracing::info!("credentials changed on disk; reconnecting");
                        return Ok(Exit::Reconnect);
                    }
                }
            }
        }
    }

    /// The caches are filled: ready, the slots a crash left given back.
    async fn watching(&mut self, state: &NodeState, shutdown: &tokio_watch::Receiver<bool>) {
        tracing::info!(node = %self.node_name, "watching Shims, this Node and its pods");
        crate::telemetry::doing(None);
        crate::telemetry::settled(state.shims.len(), self.memory.failing());
        crate::telemetry::ready();
        SlotGate::release_leftovers(self.client.clone(), &self.node_name).await;
        self.shutdown = Some(shutdown.clone());
    }

    /// What is due between rounds: pre-baked shims that failed their check are checked again,
    /// replaced versions no task uses any more are collected. True when the node's report
    /// may change.
    async fn housekeep(
        &mut self,
        store: &StateStore,
        state: &mut NodeState,
        adoption: &mut Adoption,
        retain_due: &mut Instant,
    ) -> anyhow::Result<bool> {
        let mut changed = false;
        if adoption.next_due().is_some_and(|d| d <= Instant::now()) {
            adoption.run_if_due(&self.node.health, store, state).await?;
            changed = true;
        }
        if !state.retained.is_empty() && *retain_due <= Instant::now() {
            *retain_due = Instant::now() + Duration::from_secs(RETAIN_CHECK_SECS);
            changed |= self.collect_retained(store, state);
        }
        Ok(changed)
    }

    /// The next timer of the rounds: a failure's or a wait's retry, a failed Node write's
    /// retry, the next check of retained versions (while there are any).
    fn next_due(&self, state: &NodeState, retain_due: Instant) -> Option<Instant> {
        let retained = (!state.retained.is_empty()).then_some(retain_due);
        let other = earliest(retained, self.reported.node_sync_due());
        self.memory.next_due(other)
    }

    /// Collect the replaced versions no task uses any more; true when some went.
    fn collect_retained(&self, store: &StateStore, state: &mut NodeState) -> bool {
        let before = state.retained.clone();
        if let Err(e) = self.node.collect_retained(store, state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
        state.retained != before
    }
}

/// The earlier of two due times, either of which may be absent.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
