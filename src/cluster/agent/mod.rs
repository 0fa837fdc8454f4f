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
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use crate::reconciler::memory::Memory;
use crate::state::{NodeState, StateStore};
use crate::statics::Adoption;
use crate::txn::retain::RETAIN_CHECK_SECS;
use crate::txn::{HealthCheck, Node, Restarter};
use caches::{Caches, fingerprint, quiet, sleep_until_opt};
use gate::{GateTimings, SlotGate};
use node_sync::NodeSync;
use outcome::Outcomes;
use round::Rounds;

mod caches;
pub mod gate;
mod node_sync;
mod outcome;
pub mod reported;
mod round;
mod round_events;
pub mod shim_cache;
mod view;

pub use caches::{ROUND_QUIET_MAX_MILLIS, ROUND_QUIET_MILLIS};
pub use reported::NODE_SYNC_RETRY_SECS;

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Shutdown,
    /// The credentials on disk changed: connect again.
    Reconnect,
}

/// One agent session against one client: its settings, and the session's loop. The rounds,
/// the watch caches, the Node's writes and the rounds' Events are each a type of the file
/// that owns the concern (`round`, `caches`, `node_sync`, `outcome`).
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
}

impl<'n, 'a, R: Restarter, H: HealthCheck> Agent<'n, 'a, R, H> {
    pub fn new(node: &'n Node<'a, R, H>, client: Client, node_name: String) -> Self {
        Agent {
            node,
            client,
            node_name,
            node_wait: Duration::from_secs(60),
            credential_check: Duration::from_secs(super::connect::CREDENTIAL_CHECK_SECS),
            gate_timings: GateTimings::default(),
            startup_taint: None,
        }
    }

    /// The rounds of this session, with an empty memory; they stop when `shutdown` turns.
    fn rounds(&self, shutdown: &tokio_watch::Receiver<bool>) -> Rounds<'n, 'a, R, H> {
        let (client, name) = (self.client.clone(), self.node_name.clone());
        Rounds {
            node: self.node,
            gate_timings: self.gate_timings,
            shutdown: shutdown.clone(),
            memory: Memory::default(),
            sync: NodeSync::new(client.clone(), name.clone(), self.startup_taint.clone()),
            tell: Outcomes::new(client.clone(), name.clone()),
            client,
            node_name: name,
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
        let mut rounds = self.rounds(&shutdown);
        let crashed = rounds.memory.count_crashes(store, state);
        if !crashed.is_empty() {
            tracing::error!(shims = ?crashed, "the agent stopped during a round working on {}: counted as a crash of each", crashed.join(", "));
        }
        let mut adoption = Adoption::default();
        adoption.run_if_due(&self.node.health, store, state).await?;
        crate::telemetry::settled(state.shims.len(), Vec::new());
        crate::telemetry::doing(Some("connecting to the cluster".into()));
        let (nudge_tx, mut nudge) = mpsc::channel::<()>(1);
        let caches = Caches::start(&self.client, &self.node_name, &nudge_tx);
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
        self.watching(state, &rounds.memory).await;
        let mut last_fp = None;
        let mut retain_due = Instant::now() + Duration::from_secs(RETAIN_CHECK_SECS);
        loop {
            if self
                .housekeep(store, state, &mut adoption, &mut retain_due)
                .await?
            {
                last_fp = None; // the node's report changes
            }
            let due = next_due(&rounds, state, retain_due);
            let timer_fired = due.is_some_and(|d| d <= Instant::now());
            let fp = fingerprint(&caches);
            if timer_fired || last_fp != Some(fp) || rounds.memory.take_rerun() {
                last_fp = Some(fp);
                rounds.round(store, state, &caches).await;
                crate::telemetry::settled(state.shims.len(), rounds.memory.failing());
                if rounds.memory.wants_rerun() {
                    continue;
                }
            }
            let due = earliest(next_due(&rounds, state, retain_due), adoption.next_due());
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

    /// Wait until the watches synced and this node's Node exists. Credentials that change
    /// meanwhile (a certificate the API server refused, replaced on disk) end the wait with
    /// [`Exit::Reconnect`].
    async fn wait_for_caches(
        &self,
        caches: &Caches,
        shutdown: &mut tokio_watch::Receiver<bool>,
        cred_check: &mut tokio::time::Interval,
        credentials_changed: &mut impl FnMut() -> bool,
    ) -> anyhow::Result<Option<Exit>> {
        let mut ready = std::pin::pin!(caches.ready());
        let deadline = tokio::time::sleep(self.node_wait);
        let mut deadline = std::pin::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut ready => return Ok(None),
                _ = shutdown.changed() => return Ok(Some(Exit::Shutdown)),
                _ = cred_check.tick() => {
                    if credentials_changed() {
                        tracing::info!("credentials changed on disk; reconnecting");
                        return Ok(Some(Exit::Reconnect));
                    }
                }
                _ = &mut deadline => {
                    caches.not_synced_yet(&self.client, &self.node_name, self.node_wait).await?;
                    deadline.as_mut().reset(Instant::now() + self.node_wait);
                }
            }
        }
    }

    /// The caches are filled: ready, the slots a crash left given back.
    async fn watching(&self, state: &NodeState, memory: &Memory) {
        tracing::info!(node = %self.node_name, "watching Shims, this Node and its pods");
        crate::telemetry::doing(None);
        crate::telemetry::settled(state.shims.len(), memory.failing());
        crate::telemetry::ready();
        SlotGate::release_leftovers(self.client.clone(), &self.node_name).await;
    }

    /// What is due between rounds: pre-baked shims that failed their check are checked again,
    /// replaced versions no task uses any more are collected. True when the node's report
    /// may change.
    async fn housekeep(
        &self,
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

    /// Collect the replaced versions no task uses any more; true when some went.
    fn collect_retained(&self, store: &StateStore, state: &mut NodeState) -> bool {
        let before = state.retained.clone();
        if let Err(e) = self.node.collect_retained(store, state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
        state.retained != before
    }
}

/// The next timer of the rounds: a failure's or a wait's retry, a failed Node write's retry,
/// the next check of retained versions (while there are any).
fn next_due<R, H>(
    rounds: &Rounds<'_, '_, R, H>,
    state: &NodeState,
    retain: Instant,
) -> Option<Instant> {
    let retained = (!state.retained.is_empty()).then_some(retain);
    let other = earliest(retained, rounds.sync.due());
    rounds.memory.next_due(other)
}

/// The earlier of two due times, either of which may be absent.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}
