//! [`NodeError`]: why a node edge failed, with a stable [`reason`](NodeError::reason).

use std::time::Duration;

use super::unit::UnitState;

/// Why a node edge failed. [`NodeError::reason`] is stable: it becomes the Shim condition's
/// `reason` and a metric label.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The restart job finished with a result other than `done`.
    #[error("restart of {unit} failed: job result `{job_result}`, unit now {}", .state.summary())]
    RestartFailed {
        /// The unit.
        unit: String,
        /// The job's result (`failed`, `timeout`, `canceled`, `dependency`, `skipped`).
        job_result: String,
        /// The unit's state after the job (boxed: keeps the error small).
        state: Box<UnitState>,
    },
    /// No `JobRemoved` for the restart job in time.
    #[error("restart of {unit} did not finish within {} s (job {job})", .timeout.as_secs_f64())]
    RestartTimeout {
        /// The unit.
        unit: String,
        /// The job's object path.
        job: String,
        /// The timeout that passed.
        timeout: Duration,
    },
    /// The start limit was hit again after `ResetFailedUnit` and one more restart.
    #[error(
        "restart of {unit} hit systemd's start limit even after ResetFailedUnit and one retry \
         (job result `{job_result}`, unit now {}); check StartLimitBurst/StartLimitIntervalSec",
        .state.summary()
    )]
    StartLimitHit {
        /// The unit.
        unit: String,
        /// The job's result of the retry.
        job_result: String,
        /// The unit's state after the retry.
        state: Box<UnitState>,
    },
    /// The CRI does not answer, or its RuntimeService is not there (the CRI plugin did not
    /// load).
    #[error("containerd's CRI on {socket} is not available: {detail}")]
    CriUnavailable {
        /// The socket dialled.
        socket: String,
        /// What happened (connect error, timeout, gRPC status).
        detail: String,
        /// True when containerd answered but the CRI service is unimplemented.
        plugin_not_loaded: bool,
    },
    /// The CRI answers but reports `RuntimeReady` false.
    #[error("containerd reports the CRI runtime not ready: {detail}")]
    RuntimeNotReady {
        /// The condition's reason and message.
        detail: String,
    },
    /// The CRI is ready but does not list the handler.
    #[error(
        "containerd does not serve runtime handler `{handler}` (it serves: {})",
        if .present.is_empty() { "none".to_string() } else { .present.join(", ") }
    )]
    HandlerMissing {
        /// The handler looked for.
        handler: String,
        /// The handlers containerd listed.
        present: Vec<String>,
    },
    /// The CRI is ready but still lists handlers that were removed.
    #[error("containerd still serves removed handler(s) {}", .handlers.join(", "))]
    HandlerStillServed {
        /// The removed handlers it still lists.
        handlers: Vec<String>,
    },
    /// The verbose CRI info could not be read.
    #[error("cannot read containerd's verbose CRI info: {detail}")]
    CriInfo {
        /// What was wrong with it.
        detail: String,
    },
    /// The node has no sandbox (pause) image and could not pull it: no pod at all can run on
    /// it, whatever the runtime. Not the runtime's fault.
    #[error(
        "this node has no sandbox image {image} and could not pull it ({detail}): no pod can \
         run on it, with any runtime, until containerd has that image (load it into the node \
         image, or let containerd reach its registry); the shim is not to blame"
    )]
    NoSandboxImage {
        /// The sandbox image containerd is configured with.
        image: String,
        /// Why it is not there (containerd's own words, clipped).
        detail: String,
    },
    /// A pod sandbox started through the handler failed or did not become ready.
    #[error("runtime handler `{handler}` could not run a pod sandbox: {detail}")]
    SandboxCheckFailed {
        /// The handler.
        handler: String,
        /// The runtime's own error, clipped.
        detail: String,
    },
    /// The check container's image could not be had (not in the node image, and no pull).
    #[error(
        "the check container's image {image} is not on the node and could not be pulled: \
         {detail}; pre-load it in the node image or make it pullable with containerd's \
         registry configuration"
    )]
    CheckImageUnavailable {
        /// The image.
        image: String,
        /// containerd's own words, clipped.
        detail: String,
    },
    /// The check container did not start, did not finish in time, exited with another code
    /// or did not print what it should.
    #[error("the check container of runtime handler `{handler}` did not succeed: {detail}")]
    ContainerCheckFailed {
        /// The handler.
        handler: String,
        /// What happened, with the runtime's own error or the container's output, clipped.
        detail: String,
    },
    /// The shim's preflight run (`-v`) shows it cannot run on this node.
    #[error("the shim {binary} does not run on this node: {detail}")]
    ShimDoesNotRun {
        /// The shim's path (as the node sees it).
        binary: String,
        /// Why: the loader's or the kernel's words, a signal, a timeout.
        detail: String,
    },
    /// A D-Bus call failed (no bus, access denied, no such unit, ...).
    #[error("D-Bus call {call} failed")]
    Dbus {
        /// The method and its main argument.
        call: String,
        /// zbus's error.
        #[source]
        source: zbus::Error,
    },
}

impl NodeError {
    /// True for the failures of the functional check after a restart (a sandbox, the check
    /// container, their images): the runtime could not be proven to work.
    pub fn is_check_failure(&self) -> bool {
        matches!(
            self,
            NodeError::NoSandboxImage { .. }
                | NodeError::SandboxCheckFailed { .. }
                | NodeError::CheckImageUnavailable { .. }
                | NodeError::ContainerCheckFailed { .. }
        )
    }

    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            NodeError::RestartFailed { .. } => "RestartFailed",
            NodeError::RestartTimeout { .. } => "RestartTimeout",
            NodeError::StartLimitHit { .. } => "StartLimitHit",
            NodeError::CriUnavailable { .. } => "CriUnavailable",
            NodeError::RuntimeNotReady { .. } => "RuntimeNotReady",
            NodeError::HandlerMissing { .. } => "HandlerMissing",
            NodeError::HandlerStillServed { .. } => "HandlerStillServed",
            NodeError::CriInfo { .. } => "CriInfo",
            NodeError::Dbus { .. } => "Dbus",
            NodeError::ShimDoesNotRun { .. } => "ShimDoesNotRun",
            NodeError::NoSandboxImage { .. } => "NoSandboxImage",
            NodeError::SandboxCheckFailed { .. } => "SandboxCheckFailed",
            NodeError::CheckImageUnavailable { .. } => "CheckImageUnavailable",
            NodeError::ContainerCheckFailed { .. } => "ContainerCheckFailed",
        }
    }
}
