//! The wire names the agents, the coordinator, the admission policies and the operator agree
//! on, in one place: the API group, the labels, annotations and finalizer, the Leases, the
//! field manager, and the condition types and reasons more than one module reads or writes.

/// The namespace of shim-agent's Leases (and its ServiceAccounts).
pub const NAMESPACE: &str = "shim-agent-system";

// The rollout slots (docs/design.md §5): the agents, the coordinator and the admission
// policies (api::policies) all read them.
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

/// Annotation on a Shim: a new value resumes a halted rollout.
pub const RESUME_ANNOTATION: &str = "containerd.x-k8s.io/resume-rollout";
/// The Node condition the agent keeps: the node's Shims are ready.
pub const SHIMS_READY: &str = "containerd.x-k8s.io/ShimsReady";
/// Annotation on the Node: the startup taint (`key:Effect`) the agent's settings name, to
/// come off once [`SHIMS_READY`] is True.
pub const STARTUP_TAINT_ANNOTATION: &str = "containerd.x-k8s.io/startup-taint";

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
