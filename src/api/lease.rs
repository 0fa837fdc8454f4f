//! `ShimLease`: a Lease for shim-agent's coordination (the coordinator election, and the
//! rollout slots), in [`NAMESPACE`].
//!
//! Why not `coordination.k8s.io/v1` Leases: the NodeRestriction admission plugin lets a
//! kubelet identity (`system:node:<name>`) write only its own Lease in `kube-node-lease`, so
//! an agent running with the node's credentials could never take a Lease elsewhere (the real
//! API server answers "can only access leases in the kube-node-lease system namespace"). A
//! custom kind is governed by RBAC alone. Its spec has the same fields and meaning as a
//! Lease's, so client-go's election semantics carry over unchanged.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The namespace of shim-agent's Leases (and its ServiceAccounts).
pub const NAMESPACE: &str = "shim-agent-system";

// The wire names of rollout slots (docs/design.md §5): the agents, the coordinator and the
// admission policies (api::policies) all read them.
/// Label on a slot Lease: the Shim it belongs to.
pub const SLOT_SHIM_LABEL: &str = "containerd.x-k8s.io/slot-of";
/// Label on a held slot Lease: its holder (so a node finds its own slots at start).
pub const SLOT_HOLDER_LABEL: &str = "containerd.x-k8s.io/slot-holder";
/// Annotation on a slot Lease: JSON failure note of the node holding it.
pub const SLOT_FAILED: &str = "containerd.x-k8s.io/slot-failed";
/// Annotation on a slot Lease: why nobody may take it now (`halted`, `retired`, `budget`).
pub const SLOT_CLOSED: &str = "containerd.x-k8s.io/slot-closed";
/// Annotation on a slot Lease the coordinator freed: the holder whose Node was deleted.
pub const SLOT_FREED: &str = "containerd.x-k8s.io/slot-freed-from";
/// Annotation on a slot Lease: N, the Shim's slot count the coordinator keeps now. A waiting
/// node that sees it differ from the N it chose its candidates by lists the slots again.
pub const SLOT_COUNT: &str = "containerd.x-k8s.io/slot-count";
/// Label on a slot Lease, written by the coordinator only: the node that takes the slot next.
/// Nobody else may take it while it is free; the node learns of it from its Node
/// ([`SLOT_RESERVATIONS_ANNOTATION`]) and watches that slot alone.
pub const SLOT_RESERVED_LABEL: &str = "containerd.x-k8s.io/slot-reserved-for";
/// Annotation on a Node, written by the coordinator only: which slot of each Shim is reserved
/// for that node (JSON, Shim name -> slot index). A hint, not an authority: it tells a waiting
/// node which one slot to watch (by name, which the API server's watch cache indexes, where a
/// label selector on the slots reaches every watcher), and the slot's [`SLOT_RESERVED_LABEL`]
/// still decides who may take it.
pub const SLOT_RESERVATIONS_ANNOTATION: &str = "containerd.x-k8s.io/slot-reservations";
/// Annotation on a slot Lease: how many nodes the Shim targeted when the coordinator created
/// the slot. A waiting node sizes its claim window by it until the Shim has a status.
pub const SLOT_TARGETED: &str = "containerd.x-k8s.io/slot-targeted";

/// The same fields as `coordination.k8s.io/v1` LeaseSpec.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[kube(
    group = "containerd.x-k8s.io",
    version = "v1alpha1",
    kind = "ShimLease",
    plural = "shimleases",
    singular = "shimlease",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "A lease used by shim-agent for the coordinator election and rollout slots (same fields as a coordination.k8s.io Lease).",
    printcolumn(name = "Holder", type_ = "string", json_path = ".spec.holderIdentity"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ShimLeaseSpec {
    /// The node that holds it; empty when free.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub holder_identity: Option<String>,
    /// How long the holder's claim lasts without renewal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration_seconds: Option<i32>,
    /// When the current holder took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<MicroTime>,
    /// When the holder last renewed it (informational: expiry is measured on each observer's
    /// own clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<MicroTime>,
    /// How many times the holder changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_transitions: Option<i32>,
}
