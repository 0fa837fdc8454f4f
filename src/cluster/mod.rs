//! The Kubernetes side of the agent (docs/design.md §1, §2, §5, §6, §7), by role.
//!
//! - [`agent`]: the node's agent: watches, rounds (plan, gate, transact, report), its memory,
//!   the Node's labels and state, and its rollout slot gate ([`agent::gate`]);
//! - [`coordinator`]: the cluster-wide work of the elected coordinator: election, the pure
//!   plan of each Shim, status, and the slot writes;
//! - the protocol both share, here: [`slots`] (pure: slot rules), [`lease_edits`] (every
//!   edit of a slot Lease), [`nodestate`] (the per-node state annotation), [`target`] (which
//!   Shims a node runs), [`connect`] (kubeconfig, node name, rotating credentials),
//!   [`watch`] (reflectors that nudge a round), and [`session`] (`shim-agent run` with a
//!   cluster: the agent, and the coordinator when this node has a coordinator identity).
//!
//! Agents never write a Shim's spec or status per node: every agent watches every Shim, so
//! per-node writes there would cost N² watch events. Per-node state lives on the agent's own
//! Node; only the coordinator writes a Shim (its finalizer and status).

pub mod agent;
pub mod connect;
pub mod coordinator;
pub mod lease_edits;
pub mod nodestate;
pub mod session;
pub mod slots;
pub mod target;
pub mod watch;

pub use agent::gate;
pub use coordinator::{election, status};

/// The API group of the Shim kind; also the prefix of the agent's labels and annotations.
pub const GROUP: &str = "containerd.x-k8s.io";
/// Annotation on the Node: JSON map Shim name → [`nodestate::ShimNodeState`].
pub const STATE_ANNOTATION: &str = "containerd.x-k8s.io/shim-state";
/// Finalizer the coordinator puts on every Shim, removed once every node is clean.
pub const FINALIZER: &str = "containerd.x-k8s.io/cleanup";
pub use crate::api::lease::NAMESPACE;
/// The coordinator's Lease in [`NAMESPACE`].
pub const COORDINATOR_LEASE: &str = "shim-agent-coordinator";
/// Field manager of every write.
pub const FIELD_MANAGER: &str = "shim-agent";
/// Nodes with this label are not targeted by a Shim without a nodeSelector.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Label on RuntimeClasses the coordinator manages (beside the ownerReference to the Shim).
pub const MANAGED_BY_LABEL: &str = crate::api::MANAGED_BY_LABEL;

/// The node label that says "this node serves the Shim's handler".
pub fn node_label(shim: &str) -> String {
    format!("{GROUP}/{shim}")
}
