//! The Kubernetes side of the agent (docs/design.md §1, §2, §6, §7).
//!
//! - [`target`]: pure: which Shims this node should run, and what to change now;
//! - [`nodestate`]: pure: the per-node state annotation and the Node label patch;
//! - [`round`]: pure: real work in a batch, failure reasons, backoff;
//! - [`status`]: pure: a Shim's status and conditions from the Nodes' labels and annotations;
//! - [`connect`]: kubeconfig discovery, client certificates that rotate on disk, the node name;
//! - [`election`]: a Lease-based leader election with client-go's semantics;
//! - [`gate`]: the agent's rollout slots (acquire, renew, release, failure);
//! - [`agent`]: the node agent: watches, transactions, labels, per-node state, events;
//! - [`rollout`]: the coordinator's slot Leases and the rollout part of a Shim's status;
//! - [`coordinator`]: the elected agent's cluster-wide work: finalizer, RuntimeClass, status;
//! - [`slots`]: pure: rollout slots (how many, the coordinator's writes, halts, candidates);
//! - [`session`]: `shim-agent run` with a cluster: agent plus election, reconnecting on rotation;
//! - [`watch`]: reflectors that nudge a round on change.
//!
//! Agents never write a Shim's spec or status per node: every agent watches every Shim, so
//! per-node writes there would cost N² watch events. Per-node state lives on the agent's own
//! Node; only the coordinator writes a Shim (its finalizer and status).

pub mod agent;
pub mod connect;
pub mod coordinator;
pub mod election;
pub mod gate;
pub mod nodestate;
pub mod rollout;
pub mod round;
pub mod session;
pub mod slots;
pub mod status;
pub mod target;
pub mod watch;

/// The API group of the Shim kind; also the prefix of the agent's labels and annotations.
pub const GROUP: &str = "containerd.x-k8s.io";
/// Annotation on the Node: JSON map Shim name → [`nodestate::ShimNodeState`].
pub const STATE_ANNOTATION: &str = "containerd.x-k8s.io/shim-state";
/// Finalizer the coordinator puts on every Shim, removed once every node is clean.
pub const FINALIZER: &str = "containerd.x-k8s.io/cleanup";
/// Namespace of the Leases.
pub const NAMESPACE: &str = "shim-agent-system";
/// The coordinator's Lease in [`NAMESPACE`].
pub const COORDINATOR_LEASE: &str = "shim-agent-coordinator";
/// Field manager of every write.
pub const FIELD_MANAGER: &str = "shim-agent";
/// Nodes with this label are not targeted by a Shim without a nodeSelector.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Label on RuntimeClasses the coordinator manages (beside the ownerReference to the Shim).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

/// The node label that says "this node serves the Shim's handler".
pub fn node_label(shim: &str) -> String {
    format!("{GROUP}/{shim}")
}
