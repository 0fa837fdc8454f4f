//! The coordinator: one agent at a time, elected on the [`COORDINATOR_LEASE`], does the
//! cluster-wide work for every Shim (docs/design.md §6):
//! - adds the [`FINALIZER`];
//! - server-side-applies the RuntimeClass (handler, and `scheduling.nodeSelector` on the
//!   node label) once a node serves the handler; a RuntimeClass of that name that the Shim
//!   does not own is left alone and reported (`RuntimeClassConflict`);
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
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use super::names::{COORDINATOR_LEASE, FIELD_MANAGER, FINALIZER, NAMESPACE};
use super::nodestate::parse_states;
use super::readiness;
use super::reservations::Reservations;
use super::slots::SLOT_SHIM_LABEL;
use super::watch::{Tasks, spawn_reflector};
use election::{LeaseLock, Timings, lead};
use slot_writes::Rollout;
use status::NodeView;

pub mod class;
pub mod election;
mod error;
mod hints;
pub mod plan;
pub mod slot_plan;
pub mod slot_writes;
pub mod status;
mod written;

pub use class::runtime_class;
pub use error::CoordinatorError;

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
        client,
        config,
        last_status_write: Default::default(),
        // the BeforeRollout calls run beside this loop; an answer nudges it
        rollout_hooks: RolloutHooks::new(hooks, recorder, tx),
        reservations: BTreeMap::new(),
        written: BTreeMap::new(),
        hinted: hints::Hinted::default(),
    };
    loop {
        let next = c.reconcile_all(&caches).await;
        tokio::select! {
            Some(()) = rx.recv() => settle(&mut rx).await,
            _ = async {
                match next {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
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
        let mut next: Option<Instant> = self
            .reservations
            .values()
            .filter_map(Reservations::next_due)
            .chain(self.written.values().filter_map(written::Written::next_due))
            .min();
        // then each Shim's finalizer, RuntimeClass and status, all Shims side by side
        let (this, views) = (&*self, &views);
        let shims: Vec<&Shim> = all.iter().map(|s| &**s).collect();
        let rivals = class::rivals_for_class(&shims);
        let rivals = &rivals;
        let reconciles = all.iter().zip(kept).map(|(shim, rollout)| async move {
            let rivals = rivals.get(&shim.name_any()).map_or(&[][..], Vec::as_slice);
            (
                shim,
                this.reconcile(shim, views, &caches.classes, rivals, rollout)
                    .await,
            )
        });
        for (shim, r) in futures_util::future::join_all(reconciles).await {
            let due = match r {
                Ok(due) => due,
                Err(e) => {
                    e.record(&format!("Shim {}", shim.name_any()));
                    Some(Instant::now() + e.retry_after())
                }
            };
            next = match (next, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        next
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
    /// When each Shim's status was last written (the Shims' reconciles run side by side;
    /// the lock is never held across an await).
    last_status_write: std::sync::Mutex<BTreeMap<String, Instant>>,
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

    /// Reconcile one Shim whose slots were kept: gather the facts, plan
    /// ([`plan::plan_shim`]), execute. Returns when it wants to be looked at again (a
    /// deferral, a throttled status).
    async fn reconcile(
        &self,
        shim: &Shim,
        nodes: &[NodeView],
        classes: &Store<RuntimeClass>,
        rivals: &[String],
        (rollout, hold): (Rollout, Hold),
    ) -> Result<Option<Instant>, CoordinatorError> {
        let name = shim.name_any();
        let rc = classes.get(&ObjectRef::new(&shim.spec.runtime_class.name));
        let time = Time(k8s_openapi::jiff::Timestamp::now());
        let with_rollout = |st| rollout.status(st, shim.status.as_ref(), &time);
        let actions = plan::plan_shim(&plan::ShimFacts {
            shim,
            nodes,
            runtime_class: rc.as_deref(),
            rivals,
            with_rollout: &with_rollout,
            hold: &hold,
            approved: self.rollout_hooks.approved(shim),
            last_status_write: self.status_written().get(&name).copied(),
            status_interval: self.config.status_interval,
            now: Instant::now(),
            time: &time,
        });
        self.execute(shim, actions).await
    }

    /// Carry out a Shim's [`ShimActions`](plan::ShimActions), in order: the finalizer in, the
    /// RuntimeClass, the status, the finalizer out.
    async fn execute(
        &self,
        shim: &Shim,
        actions: plan::ShimActions,
    ) -> Result<Option<Instant>, CoordinatorError> {
        use CoordinatorError as E;
        let shims = Api::<Shim>::all(self.client.clone());
        if actions.add_finalizer {
            let mut finalizers = shim.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            set_finalizers(&shims, shim, finalizers)
                .await
                .map_err(E::finalizer)?;
        }
        self.write_class(shim, actions.runtime_class)
            .await
            .map_err(E::runtime_class)?;
        if let plan::StatusAction::Write(status) = actions.status {
            write_status(&shims, shim, &status)
                .await
                .map_err(E::status)?;
            self.status_written()
                .insert(shim.name_any(), Instant::now());
        }
        if actions.remove_finalizer {
            let finalizers = shim.finalizers().iter().filter(|f| *f != FINALIZER);
            set_finalizers(&shims, shim, finalizers.cloned().collect())
                .await
                .map_err(E::finalizer)?;
            self.status_written().remove(&shim.name_any());
            tracing::info!(shim = %shim.name_any(), "every node is clean; finalizer removed");
        }
        Ok(actions.due)
    }

    /// When each Shim's status was last written; a poisoned lock (a panic elsewhere, which
    /// the daemon forbids) still yields the map.
    fn status_written(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Instant>> {
        self.last_status_write
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Shim's RuntimeClass as `action` says: kept, deleted, or server-side applied.
    async fn write_class(&self, shim: &Shim, action: plan::ClassAction) -> Result<(), kube::Error> {
        let name = shim.name_any();
        let rc_api = Api::<RuntimeClass>::all(self.client.clone());
        let rc_name = &shim.spec.runtime_class.name;
        match action {
            plan::ClassAction::Keep => {}
            plan::ClassAction::Delete => {
                tracing::info!(shim = %name, runtime_class = %rc_name, "deleting the RuntimeClass (its Shim is going, or its handler changed)");
                delete_ignoring_missing(&rc_api, rc_name).await?;
            }
            plan::ClassAction::Apply(rc) => {
                let pp = PatchParams::apply(FIELD_MANAGER).force();
                rc_api.patch(rc_name, &pp, &Patch::Apply(&*rc)).await?;
                tracing::info!(shim = %name, runtime_class = %rc_name, "RuntimeClass applied");
            }
        }
        Ok(())
    }
}

/// A Shim's status, merge-patched.
async fn write_status(
    shims: &Api<Shim>,
    shim: &Shim,
    status: &crate::api::ShimStatus,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({ "status": status });
    tracing::debug!(shim = %shim.name_any(), "status changed; writing it");
    shims
        .patch_status(
            &shim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
}

/// Replace a Shim's finalizers, guarded by the resourceVersion it was read at (a 409 when
/// someone changed it meanwhile; the next round reads it again).
async fn set_finalizers(
    shims: &Api<Shim>,
    shim: &Shim,
    finalizers: Vec<String>,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": shim.resource_version(),
    }});
    shims
        .patch(
            &shim.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

async fn delete_ignoring_missing(api: &Api<RuntimeClass>, name: &str) -> Result<(), kube::Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
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
