//! The agent's own Node: its Shim labels and state annotation moved to what the local state
//! says (retried with backoff while the API server is away), and offline installs adopted.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use super::reported::NodeWrites;
use super::view::RoundView;
use crate::api::names::{FIELD_MANAGER, STATE_ANNOTATION, node_label};
use crate::cluster::nodestate::{self, NodeStates};
use crate::cluster::readiness::{self, STARTUP_TAINT_ANNOTATION, StartupTaint};
use crate::cluster::target::{self, NodePlan};
use crate::reconciler::memory::FailureNote;
use crate::state::{NodeState, Origin, StateStore};

/// The failure notes of the reconciler core's memory, as the Node's report shows them.
pub(super) type Notes = BTreeMap<String, FailureNote>;

/// Shims the cluster wants that were installed offline (or by the CLI) become the cluster's:
/// from now on the cluster also removes them.
pub(super) fn adopt_into_cluster(
    store: &StateStore,
    state: &mut NodeState,
    view: &RoundView<'_>,
    labels: &BTreeMap<String, String>,
) {
    let wanted: Vec<String> = target::wanted_from_cluster(&view.inputs(labels, state))
        .iter()
        .map(|s| s.name().to_string())
        .collect();
    let mut changed = false;
    for name in wanted {
        if let Some(rec) = state.shims.get_mut(&name)
            && matches!(rec.origin, Origin::Offline | Origin::Cli)
        {
            rec.origin = Origin::Cluster;
            changed = true;
        }
    }
    if changed && let Err(e) = store.save(state) {
        tracing::error!("cannot record adopted shims: {e}");
    }
}

/// The writes of the agent's own Node, and their retry.
pub(super) struct NodeSync {
    client: Client,
    node_name: String,
    /// The startup taint this node names on its Node.
    startup_taint: Option<StartupTaint>,
    writes: NodeWrites,
}

impl NodeSync {
    pub(super) fn new(
        client: Client,
        node_name: String,
        startup_taint: Option<StartupTaint>,
    ) -> Self {
        NodeSync {
            client,
            node_name,
            startup_taint,
            writes: NodeWrites::default(),
        }
    }

    /// When a failed Node write is tried again.
    pub(super) fn due(&self) -> Option<Instant> {
        self.writes.node_sync_due()
    }

    /// A Node write failed: the Node is written again later, backing off.
    pub(super) fn write_failed(&mut self) {
        self.writes.node_sync_failed(Instant::now());
    }

    /// What the Node should say: the Shims that target it, the Shim labels and the report
    /// (state annotation entries).
    fn wanted_report(
        &self,
        current: &KubeNode,
        view: &RoundView<'_>,
        state: &NodeState,
        plan: &NodePlan,
        notes: &Notes,
    ) -> (Vec<String>, BTreeSet<String>, NodeStates) {
        let labels_now = current.labels().clone();
        let inputs = view.inputs(&labels_now, state);
        let previous = nodestate::parse_states(current.metadata.annotations.as_ref());
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let states = nodestate::states_wanted(&inputs, plan, notes, &previous, &now);
        let wanted = target::wanted_from_cluster(&inputs)
            .iter()
            .map(|s| s.name().to_string())
            .collect();
        (wanted, target::labels_wanted(&inputs), states)
    }

    /// The patch that moves the Node's labels and state annotation to what the local state
    /// says, and names the startup taint; `None` when the Node is there already.
    pub(super) fn node_sync_patch(
        &self,
        current: &KubeNode,
        view: &RoundView<'_>,
        state: &NodeState,
        plan: &NodePlan,
        notes: &Notes,
    ) -> Option<serde_json::Value> {
        let (wanted, mut labels, states) = self.wanted_report(current, view, state, plan, notes);
        labels.extend(self.kept_prelabels(current, &wanted));
        let annotations = current.metadata.annotations.as_ref();
        let previous: NodeStates = nodestate::parse_states(annotations);
        let present = annotations.is_some_and(|a| a.contains_key(STATE_ANNOTATION));
        let mut patch =
            nodestate::node_patch(current.labels(), &previous, present, &labels, &states);
        let taint = self.startup_taint.as_ref().map(StartupTaint::text);
        let named = annotations.and_then(|a| a.get(STARTUP_TAINT_ANNOTATION));
        if let Some(taint) = taint.filter(|t| named != Some(t)) {
            let p = patch.get_or_insert_with(|| serde_json::json!({"metadata": {}}));
            p["metadata"]["annotations"][STARTUP_TAINT_ANNOTATION] = taint.into();
        }
        patch
    }

    /// Shim labels a node provisioner set in advance (so that an autoscaler sees the
    /// RuntimeClass's nodeSelector met by the node it launches), kept while the Node still
    /// carries this agent's startup taint: the taint keeps pods off until the Shims are
    /// ready. Without a startup taint a label means "served", and goes until it is.
    fn kept_prelabels(&self, current: &KubeNode, wanted: &[String]) -> Vec<String> {
        let Some(taint) = &self.startup_taint else {
            return Vec::new();
        };
        if !taint.is_on(current) {
            return Vec::new();
        }
        wanted
            .iter()
            .filter(|n| current.labels().get(&node_label(n)).map(String::as_str) == Some("true"))
            .cloned()
            .collect()
    }

    /// Set the Node's `containerd.x-k8s.io/ShimsReady` condition to what the report says,
    /// when it says something else; a failed write is retried as a failed label write is.
    async fn sync_readiness(
        &mut self,
        current: &KubeNode,
        view: &RoundView<'_>,
        state: &NodeState,
        plan: &NodePlan,
        notes: &Notes,
    ) {
        let (wanted, _, states) = self.wanted_report(current, view, state, plan, notes);
        let r = readiness::readiness(&wanted, &states);
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let Some(patch) = readiness::condition_patch(current, &r, &now) else {
            return;
        };
        let api = Api::<KubeNode>::all(self.client.clone());
        match api
            .patch_status(
                &self.node_name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => tracing::info!(
                ready = r.ready,
                reason = r.reason,
                "ShimsReady: {}",
                r.message
            ),
            Err(e) => {
                tracing::warn!("cannot set the Node's ShimsReady condition; retrying: {e}");
                self.write_failed();
            }
        }
    }

    /// Move the Node's labels and state annotation to what the local state says.
    pub(super) async fn sync_node(
        &mut self,
        current: KubeNode,
        view: &RoundView<'_>,
        state: &NodeState,
        plan: &NodePlan,
        notes: &Notes,
    ) -> KubeNode {
        let Some(patch) = self.node_sync_patch(&current, view, state, plan, notes) else {
            self.writes.node_synced();
            self.sync_readiness(&current, view, state, plan, notes)
                .await;
            return current;
        };
        match self.patch_node(patch).await {
            Ok(n) => {
                self.writes.node_synced();
                self.sync_readiness(&n, view, state, plan, notes).await;
                n
            }
            Err(e) => {
                tracing::warn!("cannot update the Node's Shim labels and state; retrying: {e}");
                self.write_failed();
                current
            }
        }
    }

    pub(super) async fn patch_node(
        &self,
        patch: serde_json::Value,
    ) -> Result<KubeNode, kube::Error> {
        Api::<KubeNode>::all(self.client.clone())
            .patch(
                &self.node_name,
                &PatchParams::apply(FIELD_MANAGER),
                &Patch::Merge(&patch),
            )
            .await
    }
}
