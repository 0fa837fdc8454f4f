//! What a check is, as plain data: the labels and the CRI namespace of its sandboxes, what it
//! checks for one handler, where it writes, and what a passed one took.

use std::path::PathBuf;
use std::time::Duration;

/// Label on every check sandbox (value `"true"`): what `sweep` looks for.
pub const CHECK_LABEL: &str = "containerd.x-k8s.io/runtime-check";
/// Label with the check's own id (its sandbox's uid).
pub const CHECK_ID_LABEL: &str = "containerd.x-k8s.io/runtime-check-id";
/// Label naming the handler checked.
pub const CHECK_HANDLER_LABEL: &str = "containerd.x-k8s.io/runtime-check-handler";
/// The CRI metadata namespace of check sandboxes (not a Kubernetes namespace).
pub const CHECK_NAMESPACE: &str = "shim-agent-check";
/// Longest part of a runtime's own error kept in a failure.
pub const DETAIL_MAX_BYTES: usize = 600;

/// What to check for one handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerCheck {
    pub handler: String,
    /// The Shim's check container, when it names one.
    pub container: Option<ContainerCheck>,
}

/// A check container, as plain data (from the Shim's `spec.check.container`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCheck {
    pub image: String,
    pub command: Vec<String>,
    pub args: Vec<String>,
    pub exit_code: i32,
    /// Text its output must contain.
    pub output_contains: Option<String>,
    /// For pulling its image, running it and reading its output.
    pub timeout: Duration,
}

/// Where a check writes and how long its sandbox may take.
#[derive(Debug, Clone)]
pub struct CheckPlace {
    /// The directory, as containerd sees it on the node, under which each check gets a log
    /// directory (`<state-dir>/checks`).
    pub logs_node: String,
    /// The same directory as this process reaches it.
    pub logs_local: PathBuf,
    /// For the sandbox image, `RunPodSandbox` and its status.
    pub sandbox_timeout: Duration,
}

/// What a passed check took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub handler: String,
    /// From `RunPodSandbox` to the sandbox seen ready.
    pub sandbox: Duration,
    /// The check container, from its image to its judged output.
    pub container: Option<Duration>,
    /// The whole check, cleanup included.
    pub total: Duration,
}
