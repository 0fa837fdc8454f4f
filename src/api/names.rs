//! The wire names the agents, the coordinator, the admission policies and the operator agree
//! on, in one place: the API group, the labels, annotations and finalizer, the Leases, the
//! field manager, and the condition types and reasons more than one module reads or writes.

pub use super::lease::NAMESPACE;

/// The API group of the Shim kind; also the prefix of the agent's labels and annotations.
pub const GROUP: &str = "containerd.x-k8s.io";
/// Annotation on the Node: JSON map Shim name → the Shim's state on that node.
pub const STATE_ANNOTATION: &str = "containerd.x-k8s.io/shim-state";
/// Finalizer the coordinator puts on every Shim, removed once every node is clean.
pub const FINALIZER: &str = "containerd.x-k8s.io/cleanup";
/// The coordinator's Lease in [`NAMESPACE`].
pub const COORDINATOR_LEASE: &str = "shim-agent-coordinator";
/// Field manager of every write.
pub const FIELD_MANAGER: &str = "shim-agent";
/// Nodes with this label are not targeted by a Shim without a nodeSelector.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Label on RuntimeClasses the coordinator manages (beside the ownerReference to the Shim).
pub const MANAGED_BY_LABEL: &str = super::MANAGED_BY_LABEL;

/// The node label that says "this node serves the Shim's handler".
pub fn node_label(shim: &str) -> String {
    format!("{GROUP}/{shim}")
}

/// The Shim's condition types (docs/design.md §1).
pub mod condition {
    /// Every targeted node serves the handler.
    pub const READY: &str = "Ready";
    /// The rollout is under way.
    pub const PROGRESSING: &str = "Progressing";
    /// Some node failed and rolled back.
    pub const DEGRADED: &str = "Degraded";
    /// Failures exceeded maxFailures, or a BeforeRollout extension refused the generation.
    pub const ROLLOUT_HALTED: &str = "RolloutHalted";
    /// A BeforeRollout extension holds the generation's rollout.
    pub const ROLLOUT_DEFERRED: &str = "RolloutDeferred";
}

/// Condition reasons that one module writes and another reads.
pub mod reason {
    /// `RolloutHalted` because a BeforeRollout extension refused the generation (the
    /// coordinator writes it; a new coordinator reads it to keep the refusal).
    pub const EXTENSION_REFUSED: &str = "ExtensionRefused";
}
