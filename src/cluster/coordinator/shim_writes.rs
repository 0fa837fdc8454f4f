//! A Shim's own writes, as a round planned them ([`plan::ShimActions`]): the finalizer in
//! beside the RuntimeClass, then the status, the finalizer out. They run off the
//! coordinator's loop, one Shim's at a time, so that a slow reply (a RuntimeClass apply took
//! 200-500 ms under a batch) never holds back the next round's slots: those are what nodes
//! wait on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::error::CoordinatorError;
use super::plan;
use crate::api::Shim;
use crate::api::names::{FIELD_MANAGER, FINALIZER};

/// Finalizer and status writes made at once; the others wait their turn, in name order. A
/// batch of 50 new Shims sent its 150 finalizer, RuntimeClass and status writes side by side
/// with its 50 slot creates, and the API server answered some of those slots 0.4 s late; a
/// controller keeps its writes in bounds (client-go: 5 a second, bursts of 10). Under one
/// limit of eight for all three kinds, the RuntimeClasses of a 50-Shim batch waited behind
/// the finalizers and statuses of the Shims before them: all 50 applied a median 1.18 s
/// after the creates, 0.96 s apart (BENCHMARKS.md, the daemon benchmark).
pub const SHIM_WRITES_AT_ONCE: usize = 2;
/// RuntimeClass writes made at once, apart from the others: a pod of the class is refused
/// at admission until its class exists, so a class never waits behind another Shim's
/// finalizer or status.
pub const CLASS_WRITES_AT_ONCE: usize = 8;

/// Makes the Shims' writes; cloned into each Shim's task.
#[derive(Clone)]
pub(super) struct ShimWriter {
    client: Client,
    /// When each Shim's status was last written (the lock is never held across an await).
    last_status_write: Arc<Mutex<BTreeMap<String, Instant>>>,
    /// [`SHIM_WRITES_AT_ONCE`] turns for finalizer and status writes, shared by the
    /// tasks...
    turns: Arc<Semaphore>,
    /// ...and [`CLASS_WRITES_AT_ONCE`] for RuntimeClass writes.
    class_turns: Arc<Semaphore>,
}

impl ShimWriter {
    pub(super) fn new(client: Client) -> Self {
        ShimWriter {
            client,
            last_status_write: Default::default(),
            turns: Arc::new(Semaphore::new(SHIM_WRITES_AT_ONCE)),
            class_turns: Arc::new(Semaphore::new(CLASS_WRITES_AT_ONCE)),
        }
    }

    /// Carry out a Shim's actions, in order; when it wants to be looked at again.
    pub(super) async fn execute(
        &self,
        shim: &Shim,
        actions: plan::ShimActions,
    ) -> Result<Option<Instant>, CoordinatorError> {
        use CoordinatorError as E;
        let shims = Api::<Shim>::all(self.client.clone());
        // the finalizer and the class side by side: neither needs the other (the class is
        // the Shim's by its owner reference, which the garbage collector follows without
        // the finalizer), and a Shim's writes take one round trip less
        let finalizer = async {
            if !actions.add_finalizer {
                return Ok(());
            }
            let _turn = self.turns.acquire().await;
            let mut finalizers = shim.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            set_finalizers(&shims, shim, finalizers)
                .await
                .map_err(E::finalizer)
        };
        let class = async {
            if matches!(actions.runtime_class, plan::ClassAction::Keep) {
                return Ok(());
            }
            let _turn = self.class_turns.acquire().await;
            self.write_class(shim, actions.runtime_class)
                .await
                .map_err(E::runtime_class)
        };
        let (finalizer, class) = tokio::join!(finalizer, class);
        finalizer?;
        class?;
        if let plan::StatusAction::Write(status) = actions.status {
            let _turn = self.turns.acquire().await;
            write_status(&shims, shim, &status)
                .await
                .map_err(E::status)?;
            self.status_written()
                .insert(shim.name_any(), Instant::now());
        }
        if actions.remove_finalizer {
            let _turn = self.turns.acquire().await;
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
    pub(super) fn status_written(&self) -> MutexGuard<'_, BTreeMap<String, Instant>> {
        self.last_status_write
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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

/// Whether `actions` write nothing (only, perhaps, a time to look again).
pub(super) fn writes_nothing(actions: &plan::ShimActions) -> bool {
    !actions.add_finalizer
        && !actions.remove_finalizer
        && matches!(actions.runtime_class, plan::ClassAction::Keep)
        && !matches!(actions.status, plan::StatusAction::Write(_))
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
