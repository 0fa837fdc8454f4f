//! The wire names the agents, the coordinator, the admission policies and the operator agree
//! on, in one place: the API group and version, the labels, annotations and finalizer, the
//! Leases, the field manager, the condition types and reasons ([`condition`], [`reason`]), and
//! the reasons of the Events the agent writes ([`event`]).
//!
//! The labels of the runtime check's CRI sandboxes stay in `node::check`, below `api` in the
//! layer map (docs/design.md §11): containerd sees them, never the API server. The `group` of the
//! `kube` derives (`Shim`, `ShimLease`, `ShimExtension`) is a literal the derive needs; a
//! test below holds it to [`GROUP`].

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
/// The version of [`GROUP`] the Shim, ShimLease and ShimExtension kinds are served at.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of a Shim: [`GROUP`]/[`VERSION`].
pub const API_VERSION: &str = "containerd.x-k8s.io/v1alpha1";
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
/// Label on RuntimeClasses the coordinator manages (beside the ownerReference to the Shim),
/// with the value [`FIELD_MANAGER`] (docs/design.md §7); a Shim may not set it.
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";

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

/// The reasons of the Shim's conditions, and of a node's entry in the
/// [`STATE_ANNOTATION`](super::STATE_ANNOTATION) (shown in `Degraded`).
pub mod reason {
    /// `Ready` False: the Shim is being removed from its nodes.
    pub const DELETING: &str = "Deleting";
    /// `Ready` False: the Shim selects no node.
    pub const NO_TARGETED_NODES: &str = "NoTargetedNodes";
    /// `Ready` True: every targeted node serves the handler.
    pub const ALL_NODES_READY: &str = "AllNodesReady";
    /// `Ready` False: some node failed at the current generation.
    pub const NODES_FAILED: &str = "NodesFailed";
    /// `Ready` False, `Progressing` True: nodes still have work to do.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// `Progressing` False: no node has work left.
    pub const COMPLETE: &str = "Complete";
    /// `Degraded` False.
    pub const NO_FAILURES: &str = "NoFailures";
    /// `Degraded` True for a failed node whose report names no reason.
    pub const FAILED: &str = "Failed";
    /// `RolloutHalted` True: failures holding slots exceed maxFailures.
    pub const TOO_MANY_FAILURES: &str = "TooManyFailures";
    /// `RolloutHalted` False.
    pub const WITHIN_FAILURE_BUDGET: &str = "WithinFailureBudget";
    /// `RolloutHalted` because a BeforeRollout extension refused the generation (the
    /// coordinator writes it; a new coordinator reads it to keep the refusal).
    pub const EXTENSION_REFUSED: &str = "ExtensionRefused";
    /// `RolloutDeferred` True: a BeforeRollout extension defers the rollout.
    pub const EXTENSION_DEFERRED: &str = "ExtensionDeferred";
    /// `RolloutDeferred` False, once it was True.
    pub const NOT_DEFERRED: &str = "NotDeferred";

    /// A node's state: a static Shim of that name in shims.d runs instead of the cluster's
    /// (also the reason of the Event saying so).
    pub const STATIC_SHIM_WINS: &str = "StaticShimWins";
    /// A node's state: the uninstall waits for pods that use the Shim's RuntimeClass.
    pub const PODS_USE_RUNTIME_CLASS: &str = "PodsUseRuntimeClass";
    /// A node's state: a removed version is kept while containerd tasks run through it.
    pub const TASKS_RUN_THROUGH_IT: &str = "TasksRunThroughIt";
    /// `Ready` False: the Shim's RuntimeClass exists and is not its own, or another Shim
    /// names it too.
    pub const RUNTIME_CLASS_CONFLICT: &str = "RuntimeClassConflict";
    /// A node's state: the Shim is set aside after the agent crashed twice during its
    /// rounds at one spec.
    pub const AGENT_CRASHED: &str = "AgentCrashed";

    /// The Node's `ShimsReady` condition: every Shim that targets it serves its handler.
    pub const SHIMS_INSTALLED: &str = "ShimsInstalled";
    /// The Node's `ShimsReady` condition: a Shim that targets it failed.
    pub const SHIMS_FAILED: &str = "ShimsFailed";
    /// The Node's `ShimsReady` condition: Shims that target it are still on their way.
    pub const SHIMS_PENDING: &str = "ShimsPending";
}

/// The reasons of the Events the agent writes on a Shim and its Node.
pub mod event {
    pub use super::reason::STATIC_SHIM_WINS;

    /// A Shim new on the node serves its handler.
    pub const INSTALLED: &str = "Installed";
    /// A Shim's new version serves its handler.
    pub const UPGRADED: &str = "Upgraded";
    /// A Shim was removed from the node.
    pub const UNINSTALLED: &str = "Uninstalled";
    /// A Shim's uninstall waits for pods that use its RuntimeClass.
    pub const UNINSTALL_BLOCKED: &str = "UninstallBlocked";
    /// An install failed (nothing changed on the node).
    pub const INSTALL_FAILED: &str = "InstallFailed";
    /// An upgrade failed (the previous version stays).
    pub const UPGRADE_FAILED: &str = "UpgradeFailed";
    /// An uninstall failed.
    pub const UNINSTALL_FAILED: &str = "UninstallFailed";
    /// A change failed after touching the node and was rolled back.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// The node's files drifted from the journal in a way the agent cannot repair.
    pub const DRIFT_UNREPAIRABLE: &str = "DriftUnrepairable";
}
