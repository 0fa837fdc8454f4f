//! [`CriClient`]: the [`RuntimeHealth`] port on containerd's CRI (`runtime.v1.RuntimeService`)
//! over its unix socket, and the pure parsers that turn a `Status` reply into a
//! [`CriStatus`].
//!
//! Where the handler list comes from:
//! - containerd ≥ 2.0 fills `StatusResponse.runtime_handlers`;
//! - containerd 1.x does not; its verbose `info["config"]` is the live CRI config as JSON,
//!   whose `containerd.runtimes` keys are the handlers ([`handlers_from_verbose_info`]).
//!
//! The messages are declared in [`proto`] with prost, field for field from cri-api's
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

pub mod proto;

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
