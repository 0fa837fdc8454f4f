//! The `ShimExtension` custom resource (containerd.x-k8s.io/v1alpha1): an HTTPS endpoint that
//! other systems run to defer or block a node's containerd restart (docs/design.md §10).
//!
//! Cluster-scoped, generated into the CRD like [`Shim`](super::Shim). Every string has a
//! `maxLength` and every list a `maxItems`, so the CEL rules stay within the API server's cost
//! budget. The wire protocol of the calls is in `crate::hooks::wire`.

use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default and largest per-call timeout.
pub const DEFAULT_TIMEOUT_SECS: i32 = 10;
pub const MAX_TIMEOUT_SECS: i32 = 30;

/// An extension that shim-agent calls at points of a rollout.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "containerd.x-k8s.io",
    version = "v1alpha1",
    kind = "ShimExtension",
    plural = "shimextensions",
    singular = "shimextension",
    status = "ShimExtensionStatus",
    derive = "PartialEq",
    cel,
    doc = "An HTTPS endpoint shim-agent calls before a node restarts containerd (BeforeNodeRestart), before a rollout opens slots (BeforeRollout) and after a node's change (AfterNodeChange).",
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShimExtensionSpec {
    /// Where the extension listens.
    pub client_config: ClientConfig,
    /// The hooks this extension serves, each at most once.
    #[schemars(length(min = 1, max = 3))]
    #[x_kube(validation = Rule::new("self.all(h, self.exists_one(x, x.name == h.name))")
        .message("each hook may be listed only once"))]
    pub hooks: Vec<HookSpec>,
    /// Shims (by their labels) whose changes this extension is called for. Absent: every Shim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_selector: Option<LabelSelector>,
}

/// How to reach the extension: exactly one of `url` and `service`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("has(self.url) != has(self.service)")
        .message("clientConfig needs exactly one of url or service"),
)]
pub struct ClientConfig {
    /// `https://host[:port]/path`, reached from the node (the agent runs on the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('https://')").message("url must be an https:// URL"))]
    pub url: Option<String>,
    /// A Service, resolved through the API (its EndpointSlices), not cluster DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceRef>,
    /// PEM-encoded CA certificates the extension's serving certificate must chain to, as
    /// bytes: base64 in YAML and JSON, like `caBundle` of Kubernetes' admission webhooks.
    /// Absent: the system's roots (see the agent's `fetch.ca-file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", length(max = 87384), extend("format" = "byte"))]
    pub ca_bundle: Option<ByteString>,
}

/// A Service in the cluster; the certificate must name `<name>.<namespace>.svc`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceRef {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Service's port (default 443).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// URL path (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("service.path must start with /"))]
    pub path: Option<String>,
}

/// One hook the extension serves.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HookSpec {
    pub name: HookName,
    /// Per-call timeout, 1–30 s (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 30))]
    pub timeout_seconds: Option<i32>,
    /// What a timeout or an error means (default `Fail`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_policy: Option<FailurePolicy>,
}

impl HookSpec {
    pub fn timeout(&self) -> std::time::Duration {
        let s = self
            .timeout_seconds
            .unwrap_or(DEFAULT_TIMEOUT_SECS)
            .clamp(1, MAX_TIMEOUT_SECS);
        std::time::Duration::from_secs(s as u64)
    }

    pub fn policy(&self) -> FailurePolicy {
        self.failure_policy.unwrap_or(FailurePolicy::Fail)
    }
}

/// The points of a rollout an extension can be called at.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HookName {
    /// A node's agent holds its slot, before anything on the host changes; may defer or fail.
    BeforeNodeRestart,
    /// The coordinator, before it opens slots for a new Shim generation; may defer or halt.
    BeforeRollout,
    /// After a node's change was committed or rolled back; a notification.
    AfterNodeChange,
}

impl HookName {
    pub fn as_str(self) -> &'static str {
        match self {
            HookName::BeforeNodeRestart => "BeforeNodeRestart",
            HookName::BeforeRollout => "BeforeRollout",
            HookName::AfterNodeChange => "AfterNodeChange",
        }
    }
}

/// What happens when the extension cannot be reached, times out or answers badly.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// Proceed, with a Warning Event.
    Ignore,
    /// Treat it as the extension's `Failure`.
    #[default]
    Fail,
}

/// The last call's result of each hook, written by its caller beside the call (best effort):
/// a node's agent for `BeforeNodeRestart` and `AfterNodeChange`, the coordinator for
/// `BeforeRollout`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ShimExtensionStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub hooks: Vec<HookResult>,
}

/// Most Shims named in one [`HookResult`] (a batch may touch more; the rest are left out).
pub const MAX_RESULT_SHIMS: usize = 16;

/// One hook's last call.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HookResult {
    pub name: HookName,
    /// The call's result after its failure policy: `Success`, `Deferred`, `Failure` (the
    /// extension refused, or an error under `failurePolicy: Fail`) or `Ignored` (an error
    /// under `failurePolicy: Ignore`), as in the call's Event and metric.
    #[schemars(length(max = 32))]
    pub result: String,
    /// The extension's message, or what went wrong (a timeout, a malformed answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// When the call ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
    /// The node whose agent called (node hooks); absent for `BeforeRollout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// The Shims the call was about (at most 16 named).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 253)))]
    pub shims: Vec<String>,
    /// The Shim generation asked about (`BeforeRollout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
}
