//! CRI API messages (cri-api `runtime.v1`), only the fields used.

use std::collections::HashMap;

/// `VersionRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionRequest {
    /// Version of the kubelet's CRI API.
    #[prost(string, tag = "1")]
    pub version: String,
}

/// `VersionResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct VersionResponse {
    /// Version of the kubelet runtime API.
    #[prost(string, tag = "1")]
    pub version: String,
    /// Name of the container runtime (`containerd`).
    #[prost(string, tag = "2")]
    pub runtime_name: String,
    /// Version of the container runtime (`1.6.20~ds1`, `v2.0.0`).
    #[prost(string, tag = "3")]
    pub runtime_version: String,
    /// API version of the container runtime (`v1`).
    #[prost(string, tag = "4")]
    pub runtime_api_version: String,
}

/// `StatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusRequest {
    /// Ask for the `info` map.
    #[prost(bool, tag = "1")]
    pub verbose: bool,
}

/// `RuntimeCondition`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeCondition {
    /// `RuntimeReady`, `NetworkReady`, ...
    #[prost(string, tag = "1")]
    pub r#type: String,
    /// Whether the condition holds.
    #[prost(bool, tag = "2")]
    pub status: bool,
    /// Machine-readable reason.
    #[prost(string, tag = "3")]
    pub reason: String,
    /// Human-readable message.
    #[prost(string, tag = "4")]
    pub message: String,
}

/// `RuntimeStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeStatus {
    /// The runtime's conditions.
    #[prost(message, repeated, tag = "1")]
    pub conditions: Vec<RuntimeCondition>,
}

/// `RuntimeHandler` (CRI ≥ 1.30, containerd ≥ 2.0).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RuntimeHandler {
    /// Handler name; empty for the default handler.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `StatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StatusResponse {
    /// Conditions.
    #[prost(message, optional, tag = "1")]
    pub status: Option<RuntimeStatus>,
    /// Verbose info: JSON strings by key (`config`, `cniconfig`, `golang`, ...).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
    /// Runtime handlers (containerd ≥ 2.0).
    #[prost(message, repeated, tag = "3")]
    pub runtime_handlers: Vec<RuntimeHandler>,
}

/// `NamespaceMode::POD`: a namespace of the pod's own.
pub const NAMESPACE_POD: i32 = 0;
/// `NamespaceMode::CONTAINER`: a namespace of the container's own (the kubelet's pid default).
pub const NAMESPACE_CONTAINER: i32 = 1;
/// `NamespaceMode::NODE`: the node's namespace (`hostNetwork: true` for the network).
pub const NAMESPACE_NODE: i32 = 2;
/// `PodSandboxState::SANDBOX_READY`.
pub const SANDBOX_READY: i32 = 0;
/// `PodSandboxState::SANDBOX_NOTREADY`.
pub const SANDBOX_NOTREADY: i32 = 1;

/// `PodSandboxMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxMetadata {
    /// Pod name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Pod UID.
    #[prost(string, tag = "2")]
    pub uid: String,
    /// Pod namespace.
    #[prost(string, tag = "3")]
    pub namespace: String,
    /// Attempt number of creating the sandbox.
    #[prost(uint32, tag = "4")]
    pub attempt: u32,
}

/// `NamespaceOption` (the modes are `NamespaceMode` values: [`NAMESPACE_POD`],
/// [`NAMESPACE_NODE`], ...).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamespaceOption {
    /// Network namespace mode.
    #[prost(int32, tag = "1")]
    pub network: i32,
    /// PID namespace mode.
    #[prost(int32, tag = "2")]
    pub pid: i32,
    /// IPC namespace mode.
    #[prost(int32, tag = "3")]
    pub ipc: i32,
}

/// `LinuxSandboxSecurityContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxSandboxSecurityContext {
    /// The sandbox's namespaces.
    #[prost(message, optional, tag = "1")]
    pub namespace_options: Option<NamespaceOption>,
}

/// `LinuxPodSandboxConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxPodSandboxConfig {
    /// Parent cgroup (cgroupfs syntax); empty = the runtime's default.
    #[prost(string, tag = "1")]
    pub cgroup_parent: String,
    /// Security attributes.
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxSandboxSecurityContext>,
}

/// `PodSandboxConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxConfig {
    /// Identity of the sandbox.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<PodSandboxMetadata>,
    /// Host name; may be empty only with the node's network namespace.
    #[prost(string, tag = "2")]
    pub hostname: String,
    /// Directory for the containers' logs; empty = none.
    #[prost(string, tag = "3")]
    pub log_directory: String,
    /// Labels.
    #[prost(map = "string, string", tag = "6")]
    pub labels: HashMap<String, String>,
    /// Linux settings.
    #[prost(message, optional, tag = "8")]
    pub linux: Option<LinuxPodSandboxConfig>,
}

/// `RunPodSandboxRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxRequest {
    /// The sandbox to create and start.
    #[prost(message, optional, tag = "1")]
    pub config: Option<PodSandboxConfig>,
    /// Runtime handler (a RuntimeClass's `handler`); empty = the default runtime.
    #[prost(string, tag = "2")]
    pub runtime_handler: String,
}

/// `RunPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RunPodSandboxResponse {
    /// ID of the started sandbox.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// `StopPodSandboxRequest` and `RemovePodSandboxRequest` (same shape).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxIdRequest {
    /// ID of the sandbox.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
}

/// `StopPodSandboxResponse` and `RemovePodSandboxResponse` (both empty).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

/// `PodSandboxStatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusRequest {
    /// ID of the sandbox.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// Ask for the `info` map.
    #[prost(bool, tag = "2")]
    pub verbose: bool,
}

/// `PodSandboxStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatus {
    /// ID of the sandbox.
    #[prost(string, tag = "1")]
    pub id: String,
    /// Identity of the sandbox.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// [`SANDBOX_READY`] or [`SANDBOX_NOTREADY`].
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Creation time, in nanoseconds.
    #[prost(int64, tag = "4")]
    pub created_at: i64,
    /// Runtime handler the sandbox runs with (not filled by every runtime).
    #[prost(string, tag = "9")]
    pub runtime_handler: String,
}

/// `PodSandboxStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxStatusResponse {
    /// The status.
    #[prost(message, optional, tag = "1")]
    pub status: Option<PodSandboxStatus>,
    /// Verbose info: JSON strings by key (containerd 1.x: `info`, with the runtime type).
    #[prost(map = "string, string", tag = "2")]
    pub info: HashMap<String, String>,
}

/// `PodSandboxFilter`: only the label selector is used (`MatchLabels`, ANDed).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandboxFilter {
    /// Labels every listed sandbox has.
    #[prost(map = "string, string", tag = "3")]
    pub label_selector: HashMap<String, String>,
}

/// `ListPodSandboxRequest` (no filter: every sandbox).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxRequest {
    /// Which sandboxes; none: every one.
    #[prost(message, optional, tag = "1")]
    pub filter: Option<PodSandboxFilter>,
}

/// `PodSandbox`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodSandbox {
    /// ID of the sandbox.
    #[prost(string, tag = "1")]
    pub id: String,
    /// Identity of the sandbox.
    #[prost(message, optional, tag = "2")]
    pub metadata: Option<PodSandboxMetadata>,
    /// [`SANDBOX_READY`] or [`SANDBOX_NOTREADY`].
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Labels.
    #[prost(map = "string, string", tag = "5")]
    pub labels: HashMap<String, String>,
    /// Runtime handler the sandbox runs with.
    #[prost(string, tag = "7")]
    pub runtime_handler: String,
}

/// `ListPodSandboxResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodSandboxResponse {
    /// The sandboxes.
    #[prost(message, repeated, tag = "1")]
    pub items: Vec<PodSandbox>,
}
