//! The coordinator: one agent at a time, elected on the [`COORDINATOR_LEASE`], does the
//! cluster-wide work for every Shim (docs/design.md §6):
//! - adds the [`FINALIZER`];
//! - server-side-applies the RuntimeClass (handler, and `scheduling.nodeSelector` on the
//!   node label) as soon as the Shim exists: a pod of it waits Pending, where an autoscaler
//!   sees it, until a node serves the handler and carries the label; a RuntimeClass of that
//!   name that the Shim does not own is left alone and reported (`RuntimeClassConflict`);
//! - writes `status` from the Nodes' labels and annotations, only when it changed and at
//!   most once per `status_interval` per Shim;
//! - on delete, removes the RuntimeClass, then the finalizer once no node carries the
//!   Shim's label or state.
//!
//! Every write is idempotent; finalizer edits are guarded by resourceVersion.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use super::nodestate::parse_states;
use super::readiness;
use super::slots::SLOT_SHIM_LABEL;
use super::watch::{Tasks, spawn_reflector};
use crate::api::names::{COORDINATOR_LEASE, FIELD_MANAGER, NAMESPACE};
use election::{LeaseLock, Timings, lead};
use reservations::Reservations;
use shim_writes::ShimWriter;
use slot_writes::Rollout;
use status::NodeView;
use tokio::task::JoinSet;

/// What a Shim's writes come to: when to look at it again, or the error.
type WriteResult = Result<Option<Instant>, CoordinatorError>;

pub mod class;
pub mod election;
mod error;
mod hints;
pub mod plan;
pub mod reservations;
mod shim_writes;
pub mod slot_plan;
pub mod slot_writes;
pub mod status;
mod written;

pub use class::runtime_class;
pub use error::CoordinatorError;
pub use shim_writes::{CLASS_WRITES_AT_ONCE, SHIM_WRITES_AT_ONCE};

/// After a change the coordinator waits until its caches were quiet this long, so that one
/// round answers a burst (a new Shim's creation and its first node states)...
const ROUND_QUIET: Duration = Duration::from_millis(10);
/// ...but no longer than this: under a steady stream of changes, a round every 50 ms.
const ROUND_QUIET_MAX: Duration = Duration::from_millis(50);

/// Wait for the caches to be quiet for [`ROUND_QUIET`], at most [`ROUND_QUIET_MAX`] in all.
async fn settle(rx: &mut mpsc::Receiver<()>) {
    let until = Instant::now() + ROUND_QUIET_MAX;
    loop {
        tokio::time::sleep(ROUND_QUIET.min(until.saturating_duration_since(Instant::now()))).await;
        let mut more = false;
        while rx.try_recv().is_ok() {
            more = true;
        }
        if !more || Instant::now() >= until {
            return;
        }
    }
}

use crate::api::Shim;
use crate::api::lease::ShimLease;
use crate::hooks::rollout::{Hold, RolloutHooks};

/// Coordinator settings.
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorConfig {
    pub timings: Timings,
    /// Least time between two status writes of one Shim.
    pub status_interval: Duration,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            timings: Timings::default(),
            status_interval: Duration::from_secs(2),
        }
    }
}

/// Take part in the election until `stop` turns true (or its sender is gone); lead while
/// elected.
pub async fn run(
    client: Client,
    identity: String,
    config: CoordinatorConfig,
    stop: tokio_watch::Receiver<bool>,
) {
    let api = Api::<ShimLease>::namespaced(client.clone(), NAMESPACE);
    let mut lock = LeaseLock::new(api, COORDINATOR_LEASE, &identity, config.timings);
    loop {
        let c = client.clone();
        lead(&mut lock, stop.clone(), || duties(c, config)).await;
        crate::telemetry::coordinator_stepped_down();
        if election::stopping(&stop) {
            if let Err(e) = lock.release().await {
                tracing::debug!(error = %e, "cannot release the coordinator lease");
            }
            return;
        }
    }
}

/// The leader's loop: watch Shims, Nodes and RuntimeClasses; reconcile every Shim on change.
async fn duties(client: Client, config: CoordinatorConfig) {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let (caches, exts) = Caches::start(&client, &tx);
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: FIELD_MANAGER.into(),
            instance: None,
        },
    );
    let hooks = std::sync::Arc::new(crate::hooks::Hooks::new(client.clone(), exts));
    caches.wait_until_ready().await;
    let mut c = Coordinator {
        writer: ShimWriter::new(client.clone()),
        client,
        config,
        executing: JoinSet::new(),
        busy: BTreeMap::new(),
        passed_over: BTreeSet::new(),
        due: BTreeMap::new(),
        // the BeforeRollout calls run beside this loop; an answer nudges it
        rollout_hooks: RolloutHooks::new(hooks, recorder, tx),
        reservations: BTreeMap::new(),
        written: BTreeMap::new(),
        hinted: hints::Hinted::default(),
    };
    let mut next = c.reconcile_all(&caches).await;
    loop {
        tokio::select! {
            Some(()) = rx.recv() => settle(&mut rx).await,
            // a Shim's writes ended: no round for that, only its next look
            Some(done) = c.executing.join_next_with_id() => {
                next = earliest(next, c.finished(done));
                continue;
            }
            _ = async {
                match next {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        next = c.reconcile_all(&caches).await;
    }
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// What the coordinator watches; a change to any nudges its loop.
struct Caches {
    shims: Store<Shim>,
    nodes: Store<KubeNode>,
    classes: Store<RuntimeClass>,
    leases: Store<ShimLease>,
    _tasks: Tasks,
}

impl Caches {
    /// The watches, and the extensions' cache for the BeforeRollout calls.
    fn start(
        client: &Client,
        tx: &mpsc::Sender<()>,
    ) -> (Self, Store<crate::api::extension::ShimExtension>) {
        let cfg = watcher::Config::default;
        let (shims, t1) = spawn_reflector(
            Api::<Shim>::all(client.clone()),
            cfg(),
            "coordinator shims",
            tx.clone(),
        );
        let (nodes, t2) = spawn_reflector(
            Api::<KubeNode>::all(client.clone()),
            cfg(),
            "coordinator nodes",
            tx.clone(),
        );
        let (classes, t3) = spawn_reflector(
            Api::<RuntimeClass>::all(client.clone()),
            cfg(),
            "runtimeclasses",
            tx.clone(),
        );
        let (leases, t4) = spawn_reflector(
            Api::<ShimLease>::namespaced(client.clone(), NAMESPACE),
            cfg().labels(SLOT_SHIM_LABEL),
            "slots",
            tx.clone(),
        );
        let (exts, t5) = spawn_reflector(
            Api::<crate::api::extension::ShimExtension>::all(client.clone()),
            cfg(),
            "coordinator shimextensions",
            tx.clone(),
        );
        let caches = Caches {
            shims,
            nodes,
            classes,
            leases,
            _tasks: Tasks(vec![t1, t2, t3, t4, t5]),
        };
        (caches, exts)
    }

    async fn wait_until_ready(&self) {
        let _ = self.shims.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.classes.wait_until_ready().await;
        let _ = self.leases.wait_until_ready().await;
    }
}

impl Coordinator {
    /// Reconcile every Shim; the earliest time one asked to be looked at again (a failed
    /// step retries after a pause that depends on the API's answer:
    /// [`retry_delay`](error::retry_delay)).
    async fn reconcile_all(&mut self, caches: &Caches) -> Option<Instant> {
        self.release_startup_taints(&caches.nodes).await;
        let views = node_views(&caches.nodes);
        let all = caches.shims.state();
        // the statuses as written (read back through the cache): a new leader reports
        // them at once, though it writes none until one changes
        crate::telemetry::shim_statuses(all.iter().map(|s| rollout_of(s)));
        self.rollout_hooks
            .retain(|n| all.iter().any(|s| s.name_any() == n));
        self.reservations
            .retain(|n, _| all.iter().any(|s| s.name_any() == *n));
        // every Shim's slots first: a batch of new Shims gets all its slots before the
        // finalizers, RuntimeClasses and statuses, so its nodes can take them at once
        // (side by side: a batch of K Shims costs one round trip, not K)
        let kept: Vec<(Rollout, Hold)> = all
            .iter()
            .map(|shim| self.rollout_of(shim, &views, &caches.leases))
            .collect();
        let existing_nodes: BTreeSet<String> = views.iter().map(|n| n.name.clone()).collect();
        let now = Instant::now();
        let mut written: Vec<written::Written> = all
            .iter()
            .zip(&kept)
            .map(|(shim, (rollout, _))| {
                let mut w = self.written.remove(&shim.name_any()).unwrap_or_default();
                let plain: Vec<_> = rollout.slots.iter().map(|(s, _)| s.clone()).collect();
                w.observe(&plain, now);
                w
            })
            .collect();
        let writes =
            all.iter()
                .zip(&kept)
                .zip(written.iter_mut())
                .map(|((shim, (rollout, hold)), w)| {
                    rollout.keep_slots(&self.client, shim, &existing_nodes, *hold != Hold::Go, w)
                });
        futures_util::future::join_all(writes).await;
        self.written = all.iter().map(|s| s.name_any()).zip(written).collect();
        // each Node pointed at the slots reserved for it (as the cache shows them)
        hints::point_nodes(
            &self.client,
            &caches.nodes,
            &caches.leases,
            &mut self.hinted,
        )
        .await;
        // a reservation that runs out is moved at that time, and a write held back is made
        // again once its hold ends
        let next: Option<Instant> = self
            .reservations
            .values()
            .filter_map(Reservations::next_due)
            .chain(self.written.values().filter_map(written::Written::next_due))
            .min();
        // then each Shim's finalizer, RuntimeClass and status, all Shims side by side, off
        // the loop: the next round's slots never wait for them
        let shims: Vec<&Shim> = all.iter().map(|s| &**s).collect();
        let rivals = class::rivals_for_class(&shims);
        self.due
            .retain(|n, _| all.iter().any(|s| s.name_any() == *n));
        for (shim, rollout) in all.iter().zip(kept) {
            let rivals = rivals.get(&shim.name_any()).map_or(&[][..], Vec::as_slice);
            self.start_writes(shim, &views, &caches.classes, rivals, rollout);
        }
        earliest(next, self.due.values().min().copied())
    }

    /// Plan a Shim and start its writes, unless its last ones are still under way (it is
    /// planned again when they end).
    fn start_writes(
        &mut self,
        shim: &std::sync::Arc<Shim>,
        views: &[NodeView],
        classes: &Store<RuntimeClass>,
        rivals: &[String],
        rollout: (Rollout, Hold),
    ) {
        let name = shim.name_any();
        if self.busy.contains_key(&name) {
            self.passed_over.insert(name);
            return;
        }
        let actions = self.plan(shim, views, classes, rivals, rollout);
        self.due.remove(&name);
        if shim_writes::writes_nothing(&actions) {
            if let Some(d) = actions.due {
                self.due.insert(name, d);
            }
            return;
        }
        let (writer, shim) = (self.writer.clone(), shim.clone());
        let task = self
            .executing
            .spawn(async move { writer.execute(&shim, actions).await });
        self.busy.insert(name, task.id());
    }

    /// A Shim's writes ended: when to look at it again. A Shim a round passed over meanwhile
    /// is looked at after the quiet time its writes' own events need to reach the caches.
    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, WriteResult), tokio::task::JoinError>,
    ) -> Option<Instant> {
        let (id, result) = match done {
            Ok((id, r)) => (id, Some(r)),
            Err(e) => (e.id(), None),
        };
        let name = self.busy.iter().find(|(_, t)| **t == id)?.0.clone();
        self.busy.remove(&name);
        let mut due = match result {
            Some(Ok(due)) => due,
            Some(Err(e)) => {
                e.record(&format!("Shim {name}"));
                Some(Instant::now() + e.retry_after())
            }
            // ended without an answer (only a task aborted, or a bug): look again soon
            None => Some(Instant::now() + ROUND_QUIET_MAX),
        };
        if self.passed_over.remove(&name) {
            due = earliest(due, Some(Instant::now() + ROUND_QUIET_MAX));
        }
        if let Some(d) = due {
            self.due.insert(name, d);
        }
        due
    }
}

impl Coordinator {
    /// Take each startup taint off its Node once the Node's Shims are ready
    /// ([`readiness::taint_removal`] decides; the node-taints policy holds the coordinator
    /// to that). A failure is retried at the next round: the Node's next change brings one.
    async fn release_startup_taints(&self, nodes: &Store<KubeNode>) {
        let api = Api::<KubeNode>::all(self.client.clone());
        for node in nodes.state() {
            let Some(patch) = readiness::taint_removal(&node) else {
                continue;
            };
            let name = node.name_any();
            match api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(node = %name, "startup taint removed: the node's Shims are ready")
                }
                Err(e) => CoordinatorError::StartupTaint(e).record(&format!("node {name}")),
            }
        }
    }
}

fn node_views(nodes: &Store<KubeNode>) -> Vec<NodeView> {
    nodes
        .state()
        .iter()
        .map(|n| NodeView {
            name: n.name_any(),
            labels: n.labels().clone(),
            states: parse_states(n.metadata.annotations.as_ref()),
        })
        .collect()
}

struct Coordinator {
    client: Client,
    config: CoordinatorConfig,
    /// Makes each Shim's finalizer, RuntimeClass and status writes, off the loop.
    writer: ShimWriter,
    /// The Shims' writes under way, one task per Shim at most; dropped with the
    /// leadership, which ends them.
    executing: JoinSet<WriteResult>,
    /// The Shims whose writes are under way, and their tasks.
    busy: BTreeMap<String, tokio::task::Id>,
    /// Busy Shims a round passed over: planned again once their writes end.
    passed_over: BTreeSet<String>,
    /// When each Shim asked to be looked at again (a deferral, a throttled status, a retry).
    due: BTreeMap<String, Instant>,
    rollout_hooks: RolloutHooks,
    /// Each Shim's reservations between rounds (the coordinator's own clock).
    reservations: BTreeMap<String, Reservations>,
    /// Each Shim's slot writes the cache has not shown yet.
    written: BTreeMap<String, written::Written>,
    /// The reservation hints written that the Node cache may not show yet.
    hinted: hints::Hinted,
}

impl Coordinator {
    /// A Shim's rollout as its slots show it now (the status is computed from it), and
    /// whether its slots may open: no slot opens for a generation its BeforeRollout
    /// extensions hold (or are asked about: the calls run beside this loop).
    fn rollout_of(
        &mut self,
        shim: &Shim,
        nodes: &[NodeView],
        leases: &Store<ShimLease>,
    ) -> (Rollout, Hold) {
        let memory = self.reservations.entry(shim.name_any()).or_default();
        let rollout = Rollout::of(shim, nodes, leases, memory, Instant::now());
        let hold = if shim.metadata.deletion_timestamp.is_some() {
            Hold::Go
        } else {
            self.rollout_hooks.check(shim)
        };
        (rollout, hold)
    }

    /// Plan one Shim whose slots were kept: gather the facts, then [`plan::plan_shim`].
    fn plan(
        &self,
        shim: &Shim,
        nodes: &[NodeView],
        classes: &Store<RuntimeClass>,
        rivals: &[String],
        (rollout, hold): (Rollout, Hold),
    ) -> plan::ShimActions {
        let name = shim.name_any();
        let rc = classes.get(&ObjectRef::new(&shim.spec.runtime_class.name));
        let time = Time(k8s_openapi::jiff::Timestamp::now());
        let with_rollout = |st| rollout.status(st, shim.status.as_ref(), &time);
        plan::plan_shim(&plan::ShimFacts {
            shim,
            nodes,
            runtime_class: rc.as_deref(),
            rivals,
            with_rollout: &with_rollout,
            hold: &hold,
            approved: self.rollout_hooks.approved(shim),
            last_status_write: self.writer.status_written().get(&name).copied(),
            status_interval: self.config.status_interval,
            now: Instant::now(),
            time: &time,
        })
    }
}

/// `shim`'s rollout as its status says it, for the coordinator's gauges.
fn rollout_of(shim: &Shim) -> crate::telemetry::ShimRollout {
    let status = shim.status.as_ref();
    let counts = status.and_then(|s| s.nodes.clone()).unwrap_or_default();
    let halted = status.and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter()
            .any(|c| c.type_ == crate::api::names::condition::ROLLOUT_HALTED && c.status == "True")
    });
    crate::telemetry::ShimRollout {
        shim: shim.name_any(),
        targeted: counts.targeted,
        installed: counts.installed,
        failed: counts.failed,
        updating: counts.updating,
        halted,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lone_change_is_answered_after_the_quiet_time_and_a_stream_after_the_most() {
        let (tx, mut rx) = mpsc::channel::<()>(1);
        let t0 = Instant::now();
        settle(&mut rx).await;
        assert_eq!(t0.elapsed(), ROUND_QUIET, "nothing more came");
        // a change every 5 ms: the round waits the most, no longer
        let feed = tokio::spawn(async move {
            loop {
                let _ = tx.try_send(());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        let t0 = Instant::now();
        settle(&mut rx).await;
        assert_eq!(t0.elapsed(), ROUND_QUIET_MAX);
        feed.abort();
    }
}
