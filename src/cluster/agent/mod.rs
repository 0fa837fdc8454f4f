//! The node agent: watch the cluster's Shims, this Node and the pods on it; make the node
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

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use super::FIELD_MANAGER;
use super::gate::{GateTimings, SlotGate};
use super::nodestate::{self, FailureNote};
use super::round::{UNINSTALL_KEY, change_name, pod_use, spec_key};
use super::target::{self, Inputs, NodePlan, PodUse};
use crate::api::Shim;
use crate::daemon::{adopt_pending, read_static_shims};
use crate::state::{NodeState, StateStore};
use crate::txn::{Change, HealthCheck, Node, Restarter};
use caches::{Caches, fingerprint, quiet, sleep_until_opt};

mod caches;
mod isolation;
mod node_sync;
mod outcome;

/// Retry of a Node write (label, annotation) that failed, e.g. while the API server is down.
pub const NODE_SYNC_RETRY_SECS: u64 = 5;
/// Quiet time after an event before a round starts, so changes that arrive together share
/// one transaction (and one restart): the round waits until nothing it reads changed for
/// this long...
pub const DEBOUNCE_MILLIS: u64 = 25;
/// ...but no longer than this after the first one.
pub const DEBOUNCE_MAX_MILLIS: u64 = 500;

/// A failing change and when to try it again.
#[derive(Debug, Clone)]
struct Failure {
    note: FailureNote,
    /// The spec it failed at (a new spec retries at once).
    spec_key: String,
    attempts: u32,
    /// When the change may run again; `None` once that time came (the note stays until the
    /// change succeeds or fails anew).
    retry_at: Option<Instant>,
}

/// Why a session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Exit {
    Shutdown,
    /// The credentials on disk changed: connect again.
    Reconnect,
}

/// What a round read from the caches and `shims.d`.
struct RoundView<'r> {
    cluster: &'r [Shim],
    statics: &'r [Shim],
    statics_ok: bool,
    pods: &'r [PodUse],
    held: &'r BTreeSet<String>,
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
    pub(super) shutdown: Option<tokio_watch::Receiver<bool>>,
    failures: BTreeMap<String, Failure>,
    solo: BTreeSet<String>,
    blocked_seen: BTreeMap<String, Vec<String>>,
    conflicts_seen: BTreeSet<String>,
    /// Shims set aside after crashes, already reported.
    aside_seen: BTreeSet<String>,
    node_sync_due: Option<Instant>,
    node_sync_failures: u32,
    /// A change failed (or a batch was split): run the next round at once for the others.
    rerun_now: bool,
    recorder: Recorder,
}

impl<'n, 'a, R: Restarter, H: HealthCheck> Agent<'n, 'a, R, H> {
    pub fn new(node: &'n Node<'a, R, H>, client: Client, node_name: String) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(node_name.clone()),
        };
        Agent {
            node,
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node_name,
            node_wait: Duration::from_secs(60),
            credential_check: Duration::from_secs(super::connect::CREDENTIAL_CHECK_SECS),
            gate_timings: GateTimings::default(),
            shutdown: None,
            failures: BTreeMap::new(),
            solo: BTreeSet::new(),
            blocked_seen: BTreeMap::new(),
            conflicts_seen: BTreeSet::new(),
            aside_seen: BTreeSet::new(),
            node_sync_due: None,
            node_sync_failures: 0,
            rerun_now: false,
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
        self.count_crash(store, state);
        adopt_pending(&self.node.health, store, state).await?;
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
        tracing::info!(node = %self.node_name, "watching Shims, this Node and its pods");
        crate::telemetry::doing(None);
        crate::telemetry::settled(state.shims.len(), self.failing());
        crate::telemetry::ready();
        SlotGate::release_leftovers(self.client.clone(), &self.node_name).await;
        self.shutdown = Some(shutdown.clone());
        let mut last_fp = None;
        let retain_every = Duration::from_secs(crate::txn::retain::RETAIN_CHECK_SECS);
        let mut retain_due = Instant::now() + retain_every;
        loop {
            if !state.retained.is_empty() && retain_due <= Instant::now() {
                let before = state.retained.clone();
                if let Err(e) = self.node.collect_retained(store, state) {
                    tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
                }
                retain_due = Instant::now() + retain_every;
                if state.retained != before {
                    last_fp = None; // the node's report changes
                }
            }
            let due = self.next_due(&*state, retain_due);
            let timer_fired = due.is_some_and(|d| d <= Instant::now());
            let fp = fingerprint(&caches);
            if timer_fired || last_fp != Some(fp) || std::mem::take(&mut self.rerun_now) {
                last_fp = Some(fp);
                self.round(store, state, &caches).await;
                crate::telemetry::settled(state.shims.len(), self.failing());
                if self.rerun_now || !self.solo.is_empty() {
                    self.rerun_now = true;
                    continue;
                }
            }
            let due = self.next_due(&*state, retain_due);
            tokio::select! {
                _ = shutdown.changed() => return Ok(Exit::Shutdown),
                Some(()) = nudge.recv() => quiet(&mut nudge, || fingerprint(&caches)).await,
                Some(()) = files.recv() => {
                    tokio::time::sleep(Duration::from_millis(crate::daemon::DEBOUNCE_MILLIS)).await;
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

    /// The Shims whose last change failed (for the status line).
    fn failing(&self) -> Vec<String> {
        self.failures.keys().cloned().collect()
    }

    /// The next timer: a failure's retry, a Node write's retry, or the next check of
    /// retained versions (while there are any).
    fn next_due(&self, state: &NodeState, retain_due: Instant) -> Option<Instant> {
        self.failures
            .values()
            .filter_map(|f| f.retry_at)
            .chain(self.node_sync_due)
            .chain((!state.retained.is_empty()).then_some(retain_due))
            .min()
    }

    /// One round: plan, unlabel, transaction, report.
    async fn round(&mut self, store: &StateStore, state: &mut NodeState, caches: &Caches) {
        let Some(kube_node) = caches.node.state().first().map(|n| (**n).clone()) else {
            return;
        };
        let mut current = kube_node;
        let cluster: Vec<Shim> = caches.shims.state().iter().map(|s| (**s).clone()).collect();
        let dir = self
            .node
            .root
            .resolve(&self.node.settings.paths.static_shims_dir)
            .ok();
        let (statics, errors) = dir.map(|d| read_static_shims(&d)).unwrap_or_default();
        for e in &errors {
            tracing::error!("ignoring a static Shim file until it is fixed: {e}");
        }
        let pods: Vec<PodUse> = caches.pods.state().iter().map(|p| pod_use(p)).collect();
        let now = Instant::now();
        self.forget_stale_failures(&cluster);
        let mut held = BTreeSet::new();
        for (name, f) in &mut self.failures {
            match f.retry_at {
                Some(t) if t > now => {
                    held.insert(name.clone());
                }
                _ => f.retry_at = None,
            }
        }
        held.extend(self.set_aside(store, state, &cluster, &current).await);
        let labels = current.labels().clone();
        let mut plan = {
            let inputs = Inputs {
                node_labels: &labels,
                cluster: &cluster,
                statics: &statics,
                statics_ok: errors.is_empty(),
                state,
                pods: &pods,
                held: &held,
            };
            target::plan_node(&inputs)
        };
        self.restrict_to_solo(&mut plan, state);

        // Labels off before any uninstall; no uninstall if that failed.
        if let Some(patch) = nodestate::unlabel_patch(&labels, &plan.unlabel) {
            match self.patch_node(patch).await {
                Ok(n) => current = n,
                Err(e) => {
                    tracing::warn!("cannot remove Shim labels from the Node; uninstalls wait: {e}");
                    plan.changes.retain(|c| !matches!(c, Change::Uninstall(_)));
                    self.schedule_node_sync();
                }
            }
        }
        let work = crate::txn::real_work(&plan.changes, state, &self.node.host_facts(state));
        let view = RoundView {
            cluster: &cluster,
            statics: &statics,
            statics_ok: errors.is_empty(),
            pods: &pods,
            held: &held,
        };
        self.begin_work(store, state, &work, &cluster);
        // Announce what is under way (best effort), while the transaction runs.
        let announce = if work.is_empty() {
            None
        } else {
            self.node_sync_patch(&current, &view, state, &plan)
        };
        let before = state.clone();
        let gate = SlotGate::new(
            self.client.clone(),
            &self.node_name,
            &current.uid().unwrap_or_default(),
            &cluster,
            self.gate_timings,
        )
        .live(caches.shims.clone());
        let gate = match &self.shutdown {
            Some(s) => gate.until(s.clone()),
            None => gate,
        }
        .except(statics.iter().map(|s| s.name().to_string()));
        let report = crate::hooks::Report {
            recorder: self.recorder.clone(),
            refs: vec![current.object_ref(&())],
        };
        let changes = crate::hooks::gate::changes_of(&plan.changes, state);
        let gate = crate::hooks::HookGate::new(
            gate,
            caches.hooks.clone(),
            &self.node_name,
            &cluster,
            changes,
            self.gate_timings.max_deferral,
            report,
        );
        let gate = match &self.shutdown {
            Some(s) => gate.until(s.clone()),
            None => gate,
        };
        let (announced, result) = {
            let agent: &Self = self;
            tokio::join!(
                async {
                    match announce {
                        Some(p) => Some(agent.patch_node(p).await),
                        None => None,
                    }
                },
                agent
                    .node
                    .apply_gated(store, state, plan.changes.clone(), false, &gate),
            )
        };
        if let Some(Ok(n)) = announced {
            current = n;
        }
        match result {
            Ok(report) => self.succeeded(&report, &before, &cluster, &current).await,
            Err(e) => self.failed(e, &work, &before, &cluster, &current).await,
        }
        self.adopt_into_cluster(store, state, &cluster, &statics, &labels);
        self.report_blocked_and_conflicts(&plan, &cluster, &current)
            .await;
        self.sync_node(current, &view, state, &plan).await;
        self.end_work(store, state, &work);
    }

    /// After a batch failed without naming its culprit, run one change at a time.
    fn restrict_to_solo(&mut self, plan: &mut NodePlan, state: &NodeState) {
        if self.solo.is_empty() {
            return;
        }
        let work = crate::txn::real_work(&plan.changes, state, &self.node.host_facts(state));
        let Some(first) = work.iter().find(|n| self.solo.contains(*n)).cloned() else {
            self.solo.clear();
            return;
        };
        self.solo.remove(&first);
        plan.changes.retain(|c| {
            let n = change_name(c);
            n == first || !work.iter().any(|w| w == n)
        });
    }

    fn forget_stale_failures(&mut self, cluster: &[Shim]) {
        self.failures.retain(|name, f| {
            match cluster.iter().find(|s| s.name() == name) {
                // a new spec: try at once
                Some(s) => f.spec_key == spec_key(s) || f.spec_key == UNINSTALL_KEY,
                None => f.spec_key == UNINSTALL_KEY,
            }
        });
    }
}
