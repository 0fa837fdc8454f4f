//! [`CriClient`]: the [`RuntimeHealth`] port on containerd's CRI (`runtime.v1.RuntimeService`
//! and `ImageService`) over its unix socket; the pure parsers that turn a `Status` reply into
//! a [`CriStatus`] are in [`status`].
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
//! `RemovePodSandbox`), the container calls of one short-lived container and the image
//! lookup and pull, with the minimal fields ([`containers`]): what the functional check of a
//! new handler needs ([`crate::node::check`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::error::NodeError;
use super::ports::{CriStatus, RuntimeHealth};
use crate::text::error_chain;

pub mod containers;
pub mod proto;
mod status;

pub use status::{
    handlers_from_verbose_info, sandbox_image_from_verbose_info, status_from_response,
};

const STATUS_PATH: &str = "/runtime.v1.RuntimeService/Status";
const VERSION_PATH: &str = "/runtime.v1.RuntimeService/Version";
const RUN_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/RunPodSandbox";
const STOP_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/StopPodSandbox";
const REMOVE_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/RemovePodSandbox";
const SANDBOX_STATUS_PATH: &str = "/runtime.v1.RuntimeService/PodSandboxStatus";
const LIST_SANDBOX_PATH: &str = "/runtime.v1.RuntimeService/ListPodSandbox";
const CREATE_CONTAINER_PATH: &str = "/runtime.v1.RuntimeService/CreateContainer";
const START_CONTAINER_PATH: &str = "/runtime.v1.RuntimeService/StartContainer";
const STOP_CONTAINER_PATH: &str = "/runtime.v1.RuntimeService/StopContainer";
const REMOVE_CONTAINER_PATH: &str = "/runtime.v1.RuntimeService/RemoveContainer";
const CONTAINER_STATUS_PATH: &str = "/runtime.v1.RuntimeService/ContainerStatus";
const IMAGE_STATUS_PATH: &str = "/runtime.v1.ImageService/ImageStatus";
const PULL_IMAGE_PATH: &str = "/runtime.v1.ImageService/PullImage";
/// The CRI API version the agent speaks.
const CRI_API_VERSION: &str = "v1";

/// Why a CRI call has no answer: containerd could not be reached (or its CRI did not load),
/// it refused the call with a gRPC status (the runtime's own error is in its message), or no
/// answer came in time.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The CRI is not available.
    #[error(transparent)]
    Unavailable(#[from] NodeError),
    /// The call reached containerd and failed there.
    #[error("{path} failed: {code}: {message}")]
    Refused {
        /// The method.
        path: &'static str,
        /// The gRPC status code (`Unknown`, `NotFound`, ...).
        code: String,
        /// containerd's message (untrusted text: the runtime's own words).
        message: String,
    },
    /// No answer within the time given.
    #[error("{path}: no answer within {} ms", after.as_millis())]
    TimedOut {
        /// The method.
        path: &'static str,
        /// The time given.
        after: Duration,
    },
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

    /// One unary call: its answer, or why it has none ([`CallError`]).
    async fn call<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, CallError>
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
            Err(s) if s.code() == tonic::Code::Unimplemented => Err(self
                .unavailable(
                    format!(
                        "{path} is unimplemented: the CRI plugin did not load (see `ctr plugins ls` \
                         and containerd's journal)"
                    ),
                    true,
                )
                .into()),
            Err(s) => Err(CallError::Refused {
                path,
                code: format!("{:?}", s.code()),
                message: s.message().to_string(),
            }),
        }
    }

    /// [`call`](Self::call) where a refusal is one more way of being unavailable.
    async fn unary<Req, Resp>(&self, path: &'static str, req: Req) -> Result<Resp, NodeError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        self.call(path, req).await.map_err(|e| match e {
            CallError::Unavailable(e) => e,
            refused => self.unavailable(refused.to_string(), false),
        })
    }

    /// [`call`](Self::call) within `timeout`.
    async fn call_within<Req, Resp>(
        &self,
        timeout: Duration,
        path: &'static str,
        req: Req,
    ) -> Result<Resp, CallError>
    where
        Req: prost::Message + Send + Sync + 'static,
        Resp: prost::Message + Default + Send + Sync + 'static,
    {
        match tokio::time::timeout(timeout, self.call(path, req)).await {
            Ok(answer) => answer,
            Err(_) => Err(CallError::TimedOut {
                path,
                after: timeout,
            }),
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
                self.unary(
                    LIST_SANDBOX_PATH,
                    proto::ListPodSandboxRequest { filter: None },
                ),
            )
            .await?;
        Ok(resp.items)
    }

    /// `ListPodSandbox` of the sandboxes that carry every label of `labels`.
    pub async fn list_labelled_sandboxes(
        &self,
        labels: HashMap<String, String>,
        timeout: Duration,
    ) -> Result<Vec<proto::PodSandbox>, CallError> {
        let filter = proto::PodSandboxFilter {
            label_selector: labels,
        };
        let req = proto::ListPodSandboxRequest {
            filter: Some(filter),
        };
        let resp: proto::ListPodSandboxResponse =
            self.call_within(timeout, LIST_SANDBOX_PATH, req).await?;
        Ok(resp.items)
    }

    /// `RunPodSandbox`, its refusal kept apart from an unreachable CRI.
    pub async fn try_run_pod_sandbox(
        &self,
        config: proto::PodSandboxConfig,
        runtime_handler: &str,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let req = proto::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_string(),
        };
        let resp: proto::RunPodSandboxResponse =
            self.call_within(timeout, RUN_SANDBOX_PATH, req).await?;
        Ok(resp.pod_sandbox_id)
    }

    /// `PodSandboxStatus` (not verbose).
    pub async fn try_pod_sandbox_status(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<proto::PodSandboxStatusResponse, CallError> {
        let req = proto::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        };
        self.call_within(timeout, SANDBOX_STATUS_PATH, req).await
    }

    /// `StopPodSandbox`, then `RemovePodSandbox` (both idempotent).
    pub async fn stop_and_remove_sandbox(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let req = || proto::PodSandboxIdRequest {
            pod_sandbox_id: id.to_string(),
        };
        let _: proto::Empty = self.call_within(timeout, STOP_SANDBOX_PATH, req()).await?;
        let _: proto::Empty = self
            .call_within(timeout, REMOVE_SANDBOX_PATH, req())
            .await?;
        Ok(())
    }

    /// `ImageStatus`: whether the node has `image` (its id), as the kubelet asks before a pull.
    pub async fn image_id(
        &self,
        image: &str,
        timeout: Duration,
    ) -> Result<Option<String>, CallError> {
        let req = containers::ImageStatusRequest {
            image: Some(image_spec(image)),
        };
        let resp: containers::ImageStatusResponse =
            self.call_within(timeout, IMAGE_STATUS_PATH, req).await?;
        Ok(resp.image.map(|i| i.id).filter(|id| !id.is_empty()))
    }

    /// `PullImage` with containerd's own registry configuration (no credentials of ours).
    pub async fn pull_image(
        &self,
        image: &str,
        sandbox: Option<proto::PodSandboxConfig>,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let req = containers::PullImageRequest {
            image: Some(image_spec(image)),
            sandbox_config: sandbox,
        };
        let resp: containers::PullImageResponse =
            self.call_within(timeout, PULL_IMAGE_PATH, req).await?;
        Ok(resp.image_ref)
    }

    /// `CreateContainer` in sandbox `sandbox_id`: the new container's ID.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: containers::ContainerConfig,
        sandbox: proto::PodSandboxConfig,
        timeout: Duration,
    ) -> Result<String, CallError> {
        let req = containers::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox),
        };
        let resp: containers::CreateContainerResponse = self
            .call_within(timeout, CREATE_CONTAINER_PATH, req)
            .await?;
        Ok(resp.container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &str, timeout: Duration) -> Result<(), CallError> {
        let req = containers::ContainerIdRequest {
            container_id: id.to_string(),
        };
        let _: proto::Empty = self.call_within(timeout, START_CONTAINER_PATH, req).await?;
        Ok(())
    }

    /// `ContainerStatus`.
    pub async fn container_status(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<containers::ContainerStatus, CallError> {
        let req = containers::ContainerStatusRequest {
            container_id: id.to_string(),
        };
        let resp: containers::ContainerStatusResponse = self
            .call_within(timeout, CONTAINER_STATUS_PATH, req)
            .await?;
        Ok(resp.status.unwrap_or_default())
    }

    /// `StopContainer` at once, then `RemoveContainer` (both idempotent).
    pub async fn stop_and_remove_container(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<(), CallError> {
        let stop = containers::StopContainerRequest {
            container_id: id.to_string(),
            timeout: 0,
        };
        let _: proto::Empty = self.call_within(timeout, STOP_CONTAINER_PATH, stop).await?;
        let remove = containers::ContainerIdRequest {
            container_id: id.to_string(),
        };
        let _: proto::Empty = self
            .call_within(timeout, REMOVE_CONTAINER_PATH, remove)
            .await?;
        Ok(())
    }
}

impl RuntimeHealth for CriClient {
    async fn status(&self, timeout: Duration) -> Result<CriStatus, NodeError> {
        status_from_response(&self.status_raw(timeout).await?)
    }
}

fn image_spec(image: &str) -> containers::ImageSpec {
    containers::ImageSpec {
        image: image.to_string(),
    }
}
