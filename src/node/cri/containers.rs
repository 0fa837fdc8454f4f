//! CRI API messages (cri-api `runtime.v1`) for images and containers, only the fields the
//! functional check uses ([`crate::node::check`]): an image looked up and pulled as the
//! kubelet does, and one container created, started, watched and removed in a sandbox.

use std::collections::HashMap;

use super::proto::{NamespaceOption, PodSandboxConfig};

/// `ContainerState::CONTAINER_CREATED`.
pub const CONTAINER_CREATED: i32 = 0;
/// `ContainerState::CONTAINER_RUNNING`.
pub const CONTAINER_RUNNING: i32 = 1;
/// `ContainerState::CONTAINER_EXITED`.
pub const CONTAINER_EXITED: i32 = 2;

/// `ImageSpec`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageSpec {
    /// The image reference (a name, a digest or an image id).
    #[prost(string, tag = "1")]
    pub image: String,
}

/// `ImageStatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusRequest {
    /// The image.
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
}

/// `Image`: only its id.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Image {
    /// Image id.
    #[prost(string, tag = "1")]
    pub id: String,
}

/// `ImageStatusResponse`: `image` is absent when the node does not have it.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ImageStatusResponse {
    /// The image, when present.
    #[prost(message, optional, tag = "1")]
    pub image: Option<Image>,
}

/// `PullImageRequest`: no credentials (containerd's own registry configuration applies).
#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageRequest {
    /// The image.
    #[prost(message, optional, tag = "1")]
    pub image: Option<ImageSpec>,
    /// The sandbox the image is pulled for.
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

/// `PullImageResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PullImageResponse {
    /// Reference of the pulled image.
    #[prost(string, tag = "1")]
    pub image_ref: String,
}

/// `ContainerMetadata`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMetadata {
    /// Container name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Attempt number.
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
}

/// `LinuxContainerSecurityContext`: only the namespaces.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerSecurityContext {
    /// The container's namespaces.
    #[prost(message, optional, tag = "3")]
    pub namespace_options: Option<NamespaceOption>,
}

/// `LinuxContainerConfig`: only the security context.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LinuxContainerConfig {
    /// Security attributes.
    #[prost(message, optional, tag = "2")]
    pub security_context: Option<LinuxContainerSecurityContext>,
}

/// `ContainerConfig`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerConfig {
    /// Identity of the container in its sandbox.
    #[prost(message, optional, tag = "1")]
    pub metadata: Option<ContainerMetadata>,
    /// The image.
    #[prost(message, optional, tag = "2")]
    pub image: Option<ImageSpec>,
    /// Entrypoint.
    #[prost(string, repeated, tag = "3")]
    pub command: Vec<String>,
    /// Arguments.
    #[prost(string, repeated, tag = "4")]
    pub args: Vec<String>,
    /// Labels.
    #[prost(map = "string, string", tag = "9")]
    pub labels: HashMap<String, String>,
    /// Log file, relative to the sandbox's `log_directory`.
    #[prost(string, tag = "11")]
    pub log_path: String,
    /// Linux settings.
    #[prost(message, optional, tag = "15")]
    pub linux: Option<LinuxContainerConfig>,
}

/// `CreateContainerRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerRequest {
    /// The sandbox to create it in.
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    /// The container.
    #[prost(message, optional, tag = "2")]
    pub config: Option<ContainerConfig>,
    /// The sandbox's config, as given to `RunPodSandbox`.
    #[prost(message, optional, tag = "3")]
    pub sandbox_config: Option<PodSandboxConfig>,
}

/// `CreateContainerResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CreateContainerResponse {
    /// ID of the created container.
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// `StartContainerRequest`, `RemoveContainerRequest` (same shape).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerIdRequest {
    /// ID of the container.
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// `StopContainerRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StopContainerRequest {
    /// ID of the container.
    #[prost(string, tag = "1")]
    pub container_id: String,
    /// Seconds before it is killed (0: at once).
    #[prost(int64, tag = "2")]
    pub timeout: i64,
}

/// `ContainerStatusRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusRequest {
    /// ID of the container.
    #[prost(string, tag = "1")]
    pub container_id: String,
}

/// `ContainerStatus`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatus {
    /// ID of the container.
    #[prost(string, tag = "1")]
    pub id: String,
    /// [`CONTAINER_CREATED`], [`CONTAINER_RUNNING`], [`CONTAINER_EXITED`] or unknown (3).
    #[prost(int32, tag = "3")]
    pub state: i32,
    /// Exit code, once exited.
    #[prost(int32, tag = "7")]
    pub exit_code: i32,
    /// Why it is in its state (`Completed`, `Error`, `OOMKilled`, ...).
    #[prost(string, tag = "10")]
    pub reason: String,
    /// Details.
    #[prost(string, tag = "11")]
    pub message: String,
    /// Its log file on the host.
    #[prost(string, tag = "15")]
    pub log_path: String,
}

/// `ContainerStatusResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerStatusResponse {
    /// The status.
    #[prost(message, optional, tag = "1")]
    pub status: Option<ContainerStatus>,
}
