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

// The wire names of the Leases live in `api::names`, with every other wire name.
pub use super::names::{
    NAMESPACE, SLOT_CLOSED, SLOT_COUNT, SLOT_FAILED, SLOT_FREED, SLOT_HOLDER_LABEL,
    SLOT_RESERVATIONS_ANNOTATION, SLOT_RESERVED_LABEL, SLOT_SHIM_LABEL, SLOT_TARGETED,
};

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
