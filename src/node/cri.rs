//! [`CriClient`]: the [`RuntimeHealth`] port on containerd's CRI (`runtime.v1.RuntimeService`)
//! over its unix socket, and the pure parsers that turn a `Status` reply into a
//! [`CriStatus`].
//!
//! Where the handler list comes from:
//! - containerd ≥ 2.0 fills `StatusResponse.runtime_handlers`;
//! - containerd 1.x does not; its verbose `info["config"]` is the live CRI config as JSON,
//!   whose `containerd.runtimes` keys are the handlers ([`handlers_from_verbose_info`]).
//!
//! The messages are declared here with prost, field for field from cri-api's
//! `pkg/apis/runtime/v1/api.proto` (only the fields used; prost skips the rest). This avoids
//! compiling the whole generated CRI API and needing `protoc` at build time. Besides
//! `Version` and `Status`, the client has the pod-sandbox calls (`RunPodSandbox` with a
//! runtime handler, `PodSandboxStatus`, `ListPodSandbox`, `StopPodSandbox`,
//! `RemovePodSandbox`) with the minimal fields, which prove that a handler is really served.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::{CriStatus, NodeError, RuntimeHealth};

/// CRI API messages (cri-api `runtime.v1`), only the fields used.
pub mod proto {
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

    /// `ListPodSandboxRequest` (no filter: every sandbox).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {}

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
}

/// Where [`CriStatus::handlers`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandlerSource {
    /// `StatusResponse.runtime_handlers` (containerd ≥ 2.0).
    #[default]
    RuntimeHandlers,
    /// The verbose info's `config.containerd.runtimes` (containerd 1.x).
    VerboseConfig,
}

const STATUS_PATH: &str = "/runtime.v1.RuntimeService/Status";
const VERSION_PATH: &str = "/runtime.v1.RuntimeService/Version";
const RUN_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const STOP_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/StopPodSandbox";
const REMOVE_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/RemovePodSandbox";
const SANDBOX_STATUS_PATH: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
const LIST_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
/// The CRI API version the agent speaks.
const CRI_API_VERSION: &str = "v1";

/// Turn a `Status` reply into a [`CriStatus`] (pure).
pub fn status_from_response(resp: &proto::StatusResponse) -> Result<CriStatus, NodeError> {
    let conditions = resp
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
    let runtime = find("RuntimeReady");
    let runtime_ready = runtime.is_some_and(|c| c.status);
    let runtime_detail = match runtime {
        None => "no RuntimeReady condition".to_string(),
        Some(c) if !c.status => format!("{}: {}", c.reason, c.message),
        Some(_) => String::new(),
    };
    let (handlers, handler_source) = if resp.runtime_handlers.is_empty() {
        (
            handlers_from_verbose_info(&resp.info)?,
            HandlerSource::VerboseConfig,
        )
    } else {
        let mut names: Vec<String> = resp
            .runtime_handlers
            .iter()
            .filter(|h| !h.name.is_empty())
            .map(|h| h.name.clone())
            .collect();
        names.sort();
        names.dedup();
        (names, HandlerSource::RuntimeHandlers)
    };
    Ok(CriStatus {
        runtime_ready,
        runtime_detail,
        network_ready: find("NetworkReady").is_some_and(|c| c.status),
        handlers,
        handler_source,
    })
}

/// Handler names (sorted) from containerd 1.x's verbose info: the keys of
/// `info["config"]` → `containerd` → `runtimes` (pure).
pub fn handlers_from_verbose_info(
    info: &HashMap<String, String>,
) -> Result<Vec<String>, NodeError> {
    let raw = info.get("config").ok_or_else(|| NodeError::CriInfo {
        detail: "no `config` key in the verbose info (was verbose=true sent?)".to_string(),
    })?;
    let config: serde_json::Value = serde_json::from_str(raw).map_err(|e| NodeError::CriInfo {
        detail: format!("`config` is not JSON: {e}"),
    })?;
    let runtimes = config
        .get("containerd")
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.as_object())
        .ok_or_else(|| NodeError::CriInfo {
            detail: "`config` has no `containerd.runtimes` object".to_string(),
        })?;
    let mut names: Vec<String> = runtimes.keys().cloned().collect();
    names.sort();
    Ok(names)
}

/// containerd's CRI over its unix socket. Every call dials afresh: a restart of containerd
/// breaks old connections, and dialling a local socket costs well under a millisecond.
#[derive(Debug, Clone)]
pub struct CriClient {
    socket: PathBuf,
}

impl CriClient {
    /// A client for the socket at `socket` (a host path, e.g.
    /// `/run/containerd/containerd.sock`).
    pub fn new(socket: impl Into<PathBuf>) -> CriClient {
        CriClient {
            socket: socket.into(),
        }
    }

    /// The socket dialled.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn unavailable(&self, detail: String, plugin_not_loaded: bool) -> NodeError {
        NodeError::CriUnavailable {
            socket: self.socket.display().to_string(),
            detail,
            plugin_not_loaded,
        }
    }

    async fn channel(&self) -> Result<Channel, NodeError> {
        let path = self.socket.clone();
        // The URI is required by tonic but never used: the connector dials the socket.
        Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }))
            .await
            .map_err(|e| self.unavailable(format!("cannot connect: {}", error_chain(&e)), false))
    }

    async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, NodeError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        let mut grpc = tonic::client::Grpc::new(self.channel().await?);
        grpc.ready()
            .await
            .map_err(|e| self.unavailable(format!("not ready: {}", error_chain(&e)), false))?;
        let codec = tonic_prost::ProstCodec::<Req, Resp>::default();
        let uri_path = http::uri::PathAndQuery::from_static(path);
        match grpc.unary(tonic::Request::new(req), uri_path, codec).await {
            Ok(r) => Ok(r.into_inner()),
            Err(s) if s.code() == tonic::Code::Unimplemented => Err(self.unavailable(
                format!(
                    "{path} is unimplemented: the CRI plugin did not load (see `ctr plugins ls` \
                     and containerd's journal)"
                ),
                true,
            )),
            Err(s) => Err(self.unavailable(
                format!("{path} failed: {:?}: {}", s.code(), s.message()),
                false,
            )),
        }
    }

    async fn with_timeout<T>(
        &self,
        timeout: Duration,
        fut: impl Future<Output = Result<T, NodeError>>,
    ) -> Result<T, NodeError> {
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| {
                Err(self.unavailable(
                    format!("no answer within {} ms", timeout.as_millis()),
                    false,
                ))
            })
    }

    /// The raw `Status{verbose: true}` reply (for diagnostics and fixtures).
    pub async fn status_raw(&self, timeout: Duration) -> Result<proto::StatusResponse, NodeError> {
        let req = proto::StatusRequest { verbose: true };
        self.with_timeout(timeout, self.unary(STATUS_PATH, req))
            .await
    }

    /// The CRI `Version` call: which runtime and version answers.
    pub async fn version(&self, timeout: Duration) -> Result<proto::VersionResponse, NodeError> {
        let req = proto::VersionRequest {
            version: CRI_API_VERSION.to_string(),
        };
        self.with_timeout(timeout, self.unary(VERSION_PATH, req))
            .await
    }

    /// `RunPodSandbox` with `runtime_handler` (as the kubelet does for a pod whose
    /// RuntimeClass names that handler): the started sandbox's ID.
    pub async fn run_pod_sandbox(
        &self,
        config: proto::PodSandboxConfig,
        runtime_handler: &str,
        timeout: Duration,
    ) -> Result<String, NodeError> {
        let req = proto::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        let resp: proto::RunPodSandboxResponse = self
            .with_timeout(timeout, self.unary(RUN_SANDBOX_PATH, req))
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    /// `StopPodSandbox` (idempotent).
    pub async fn stop_pod_sandbox(&self, id: &str, timeout: Duration) -> Result<(), NodeError> {
        let req = proto::PodSandboxIdRequest {
            pod_sandbox_id: id.to_string(),
        };
        let _: proto::Empty = self
            .with_timeout(timeout, self.unary(STOP_SANDBOX_PATH, req))
            .await?;
        Ok(())
    }

    /// `RemovePodSandbox` (idempotent).
    pub async fn remove_pod_sandbox(&self, id: &str, timeout: Duration) -> Result<(), NodeError> {
        let req = proto::PodSandboxIdRequest {
            pod_sandbox_id: id.to_string(),
        };
        let _: proto::Empty = self
            .with_timeout(timeout, self.unary(REMOVE_SANDBOX_PATH, req))
            .await?;
        Ok(())
    }

    /// `PodSandboxStatus{verbose: true}`.
    pub async fn pod_sandbox_status(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<proto::PodSandboxStatusResponse, NodeError> {
        let req = proto::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: true,
        };
        self.with_timeout(timeout, self.unary(SANDBOX_STATUS_PATH, req))
            .await
    }

    /// `ListPodSandbox` without a filter: every sandbox.
    pub async fn list_pod_sandboxes(
        &self,
        timeout: Duration,
    ) -> Result<Vec<proto::PodSandbox>, NodeError> {
        let resp: proto::ListPodSandboxResponse = self
            .with_timeout(
                timeout,
                self.unary(LIST_SANDBOX_PATH, proto::ListPodSandboxRequest {}),
            )
            .await?;
        Ok(resp.items)
    }
}

impl RuntimeHealth for CriClient {
    async fn status(&self, timeout: Duration) -> Result<CriStatus, NodeError> {
        status_from_response(&self.status_raw(timeout).await?)
    }
}

/// An error and its sources on one line (tonic's transport errors hide the cause).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
