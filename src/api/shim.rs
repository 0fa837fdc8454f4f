//! The `Shim` custom resource (containerd.x-k8s.io/v1alpha1), exactly as docs/design.md §1 gives it.
//!
//! The CRD is generated from these types (`shim-agent crd`); the committed copy in
//! `deploy/crd.yaml` is checked against it by a test. Validation lives in the schema as CEL
//! rules with messages a user understands, so `kubectl apply` rejects a bad Shim; the same
//! rules run client-side ([`Shim::validate`]) for offline installs and static Shims.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::runtime_class::RuntimeClassRef;

/// DNS-1123 label: what Kubernetes accepts in label names and RuntimeClass handlers.
pub const DNS1123_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Desired state of a containerd shim on the nodes it selects.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "containerd.x-k8s.io",
    version = "v1alpha1",
    kind = "Shim",
    plural = "shims",
    singular = "shim",
    status = "ShimStatus",
    derive = "PartialEq",
    cel,
    doc = "A containerd shim that shim-agent installs on the nodes it selects, registering its runtime handler and a RuntimeClass.",
    printcolumn(name = "RuntimeClass", type_ = "string", json_path = ".spec.runtimeClass.name"),
    printcolumn(name = "Targeted", type_ = "integer", json_path = ".status.nodes.targeted"),
    printcolumn(name = "Installed", type_ = "integer", json_path = ".status.nodes.installed"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.nodes.failed"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Slots", type_ = "string", json_path = ".status.rollout.summary"),
    printcolumn(name = "Halted", type_ = "string", json_path = ".status.conditions[?(@.type==\"RolloutHalted\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and ending with a letter or digit (it is used in node label keys)"),
    validation = Rule::new("!has(self.spec.runtimeClass.scheduling) || !has(self.spec.runtimeClass.scheduling.nodeSelector) || !(('containerd.x-k8s.io/' + self.metadata.name) in self.spec.runtimeClass.scheduling.nodeSelector)")
        .field_path(".spec.runtimeClass.scheduling.nodeSelector")
        .message("runtimeClass.scheduling.nodeSelector may not name the Shim's own node label containerd.x-k8s.io/<metadata.name>: shim-agent selects it (\"true\") itself, on the nodes that serve the handler"),
    validation = Rule::new("!has(self.spec.signature) || self.spec.signature.from != 'oci' || (self.spec.fetchStrategy.type == 'oci' && has(self.spec.fetchStrategy.oci) && self.spec.fetchStrategy.oci.reference.contains('@sha256:'))")
        .field_path(".spec.signature.from")
        .message("signature.from: oci needs fetchStrategy.type oci with a reference pinned by digest (registry/repo@sha256:...): the signature is over that manifest"),
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ShimSpec {
    /// Nodes to install on. Absent: every node without `node-role.kubernetes.io/control-plane`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Where the shim comes from and how it is verified.
    pub fetch_strategy: FetchStrategy,
    /// The RuntimeClass that points pods at this shim.
    pub runtime_class: RuntimeClassRef,
    /// How containerd runs the shim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeSettings>,
    /// How many nodes restart containerd at the same time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
    /// How a node proves the installed shim works, beyond a pod sandbox. Not part of the
    /// spec hash: changing only the check reinstalls nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckSpec>,
    /// Who must have signed the shim, and where the signature is; checked before anything
    /// changes on the node. Not part of the spec hash: a new policy applies at the next
    /// install or upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<super::signature::SignatureSpec>,
}

/// How the agent fetches the shim artifact.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("self.type != 'anonymousHttp' || (has(self.anonHttp) && has(self.anonHttp.location)) != has(self.platforms)")
        .message("fetchStrategy of type anonymousHttp needs exactly one of anonHttp.location or platforms"),
    validation = Rule::new("self.type != 'oci' || has(self.oci)")
        .message("fetchStrategy of type oci needs fetchStrategy.oci.reference"),
    validation = Rule::new("!has(self.platforms) || self.platforms.size() > 0")
        .message("fetchStrategy.platforms must list at least one platform when set"),
    validation = Rule::new("!has(self.platforms) || self.platforms.all(p, self.platforms.exists_one(q, q.os == p.os && q.arch == p.arch && (has(q.containerd) ? q.containerd : '') == (has(p.containerd) ? p.containerd : '')))")
        .message("fetchStrategy.platforms must not list two entries with the same os, arch and containerd: the second would never be chosen"),
)]
pub struct FetchStrategy {
    /// `anonymousHttp` (http, https or file:// URL) or `oci` (an artifact in a registry).
    #[serde(rename = "type")]
    pub type_: FetchType,
    /// Location and digest for `anonymousHttp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_http: Option<AnonHttp>,
    /// Registry reference for `oci`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,
    /// Per-platform artifacts, picked by the node's OS and architecture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub platforms: Option<Vec<PlatformArtifact>>,
}

/// Known fetch strategies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum FetchType {
    /// Plain download over http, https, or from a file:// path.
    AnonymousHttp,
    /// Pull from an OCI registry.
    Oci,
}

/// An artifact at a URL.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AnonHttp {
    /// `http://`, `https://` or `file:///` URL of a .tar.gz, .tar or the shim binary itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://') || self.startsWith('file:///')")
        .message("location must be an http://, https:// or file:/// URL"))]
    #[schemars(length(max = 4096))]
    pub location: Option<String>,
    /// SHA-256 of the downloaded bytes, 64 hex characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-fA-F0-9]{64}$')")
        .message("sha256 must be 64 hexadecimal characters"))]
    #[schemars(length(max = 128))]
    pub sha256: Option<String>,
}

/// An artifact in an OCI registry.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OciSource {
    /// Image or artifact reference; pin it by digest (`registry/repo@sha256:...`).
    #[x_kube(validation = Rule::new("self.size() > 0").message("oci.reference must not be empty"))]
    #[schemars(length(max = 4096))]
    pub reference: String,
    /// Digest of the layer holding the shim when the manifest has several; default: the only layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<String>,
}

/// A per-platform artifact location.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlatformArtifact {
    /// Operating system, as Go names it (`linux`).
    #[schemars(length(max = 64))]
    pub os: String,
    /// Architecture, in either spelling: Go's and Kubernetes' (`amd64`, `arm64`, `386`,
    /// `arm`, `ppc64le`, `s390x`, `riscv64`), or the kernel's, as runwasi and spin name their
    /// assets (`uname -m`: `x86_64`, `aarch64`, `i686`, `armv7l`). Both name the same
    /// platform; the first entry that matches the node wins.
    #[schemars(length(max = 64))]
    pub arch: String,
    /// URL of the artifact for this platform.
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://') || self.startsWith('file:///')")
        .message("location must be an http://, https:// or file:/// URL"))]
    #[schemars(length(max = 4096))]
    pub location: String,
    /// SHA-256 of the artifact for this platform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.matches('^[a-fA-F0-9]{64}$')")
        .message("sha256 must be 64 hexadecimal characters"))]
    #[schemars(length(max = 128))]
    pub sha256: Option<String>,
    /// The containerd releases this build is for (shims speak a versioned bootstrap
    /// protocol with containerd, changed in 2.3): comparators separated by commas, each an
    /// operator (`>=`, `>`, `<=`, `<`, `=`) and a version `MAJOR[.MINOR[.PATCH]]`, e.g.
    /// `"<2.3"`, `">=1.6, <2.3"`, `"=2.2"` (2.2.x). A node takes the first entry for its
    /// os/arch whose range includes its containerd; absent: any containerd.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(CONTAINERD_RANGE_RULE).message(CONTAINERD_RANGE_MESSAGE))]
    #[schemars(length(max = 128))]
    pub containerd: Option<String>,
}

/// `platforms[].containerd`: the grammar `artifact::ContainerdRange` parses, spaces allowed.
const CONTAINERD_RANGE_RULE: &str = "self.size() <= 128 && self.matches('^ *(>=|>|<=|<|=) *[0-9]{1,9}([.][0-9]{1,9}){0,2} *(, *(>=|>|<=|<|=) *[0-9]{1,9}([.][0-9]{1,9}){0,2} *)*$')";
const CONTAINERD_RANGE_MESSAGE: &str = "platforms[].containerd must be a containerd version range of at most 128 characters: comparators separated by commas, each an operator (>=, >, <=, <, =) and a version MAJOR[.MINOR[.PATCH]] of up to 9 digits each, e.g. \"<2.3\", \">=1.6, <2.3\" or \"=2.2\"";

/// How containerd runs the shim.
///
/// The whole artifact is installed, as one tree, at
/// `/opt/shim-agent/shims/<name>/<sha256>/`; the handler runs `binary` inside it, and
/// `optionPaths` name other files of the tree in its `options` without the operator knowing
/// that path. (That `options` and `optionPaths` set different options is checked by the
/// agent: CEL cannot look into the free-form `options`.)
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeSettings {
    /// The shim in the artifact's tree: a file name (searched in the whole tree, e.g.
    /// `containerd-shim-runc-v2`) or a relative path (`opt/kata/bin/containerd-shim-kata-v2`);
    /// default: the one `containerd-shim-*-v*` file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && !self.startsWith('/') && !self.matches('(^|/)[.][.](/|$)')")
        .message("runtime.binary must be a file name or a relative path inside the artifact, without '..'"))]
    #[schemars(length(max = 4096))]
    pub binary: Option<String>,
    /// Free-form table copied to the handler's `options` in containerd's config.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub options: Option<serde_json::Map<String, serde_json::Value>>,
    /// Options that name files of the installed artifact: option name → relative path in
    /// the artifact's tree. Each is written to the handler's `options` as that file's
    /// absolute installed path, e.g. gVisor's `{ConfigPath: runsc.toml}` becomes
    /// `ConfigPath = "/opt/shim-agent/shims/<name>/<sha256>/runsc.toml"` (what gVisor's and
    /// kata's shims read; containerd's runc shim takes no options there, so `BinaryName`
    /// cannot point it at another runtime). The file must be in the artifact, and the option
    /// must not be in `options` too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self.all(k, k.size() > 0 && k.size() <= 128 && k.matches('^[A-Za-z0-9_][-A-Za-z0-9_]*$'))")
            .message("runtime.optionPaths keys must be option names: letters, digits, '_' and '-', at most 128 characters"),
        validation = Rule::new("self.all(k, self[k].size() > 0 && self[k].size() <= 4096 && !self[k].startsWith('/') && !self[k].matches('(^|/)[.][.](/|$)'))")
            .message("runtime.optionPaths values must be relative paths inside the artifact, without '..'"),
    )]
    #[schemars(schema_with = "option_paths_schema")]
    pub option_paths: Option<BTreeMap<String, String>>,
    /// Pod annotations passed through to the shim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<Vec<String>>,
    /// Run privileged pods without the host's devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privileged_without_host_devices: Option<bool>,
}

/// How a node checks an installed shim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckSpec {
    /// A container run in a pod sandbox of the new handler, for shims whose sandbox proves
    /// too little (a Wasm shim's sandbox is an ordinary Linux container; its engine runs
    /// only when a Wasm container starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<CheckContainer>,
}

/// The check container: it must exit as `success` says within `timeoutSeconds`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckContainer {
    /// An image containerd can get: pre-loaded in the node image, or pulled by containerd
    /// with its own registry configuration.
    #[x_kube(validation = Rule::new(r"self.size() > 0 && self.size() <= 4096 && !self.matches('[ \\t\\n\\r\\f\\v]')")
        .message("check.container.image must be an image reference of 1 to 4096 characters, without whitespace"))]
    #[schemars(length(max = 4096))]
    pub image: String,
    /// The container's command (its entrypoint), e.g. `["/hello.wasm"]`.
    #[x_kube(validation = Rule::new("self.size() >= 1 && self.size() <= 64 && self.all(c, c.size() > 0 && c.size() <= 4096)")
        .message("check.container.command must list 1 to 64 items, each of 1 to 4096 characters"))]
    #[schemars(length(min = 1, max = 64), inner(length(max = 4096)))]
    pub command: Vec<String>,
    /// Arguments after the command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 64 && self.all(a, a.size() <= 4096)")
        .message("check.container.args must list at most 64 items, each of at most 4096 characters"))]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub args: Option<Vec<String>>,
    /// What counts as success; default: exit code 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub success: Option<CheckSuccess>,
    /// Seconds for pulling the image, creating, running and reading the output: 1 to 600,
    /// default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 600")
        .message("check.container.timeoutSeconds must be from 1 to 600"))]
    pub timeout_seconds: Option<i32>,
}

/// What the check container must do to pass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CheckSuccess {
    /// The exit code expected, 0 to 255; default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 255")
        .message("check.container.success.exitCode must be from 0 to 255"))]
    pub exit_code: Option<i32>,
    /// Text that must appear in the container's output (stdout and stderr).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() > 0 && self.size() <= 4096")
        .message("check.container.success.outputContains must be 1 to 4096 characters when set"))]
    #[schemars(length(max = 4096))]
    pub output_contains: Option<String>,
}

impl CheckContainer {
    /// The check's time limit when `timeoutSeconds` is absent.
    pub const DEFAULT_TIMEOUT_SECS: u64 = 60;

    /// The exit code that passes (`success.exitCode`, default 0).
    pub fn exit_code(&self) -> i32 {
        self.success.as_ref().and_then(|s| s.exit_code).unwrap_or(0)
    }

    /// The text the output must contain, if any (`success.outputContains`).
    pub fn output_contains(&self) -> Option<&str> {
        self.success.as_ref()?.output_contains.as_deref()
    }

    /// The time limit (`timeoutSeconds`, default 60 s; a value below 1 counts as 1).
    pub fn timeout(&self) -> std::time::Duration {
        let secs = self
            .timeout_seconds
            .map_or(Self::DEFAULT_TIMEOUT_SECS, |s| {
                s.max(1).unsigned_abs().into()
            });
        std::time::Duration::from_secs(secs)
    }
}

/// How the change rolls out across nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RolloutStrategy {
    /// `rolling` (at most maxUpdate nodes at once) or `recreate` (no limit).
    #[serde(rename = "type")]
    pub type_: RolloutType,
    /// Settings for `rolling`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolling: Option<RollingUpdate>,
}

/// Known rollout strategies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum RolloutType {
    /// A limited number of nodes restart containerd at the same time.
    Rolling,
    /// Every node at once.
    Recreate,
}

/// Limits of a rolling rollout.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollingUpdate {
    /// Nodes restarting containerd at the same time: an integer ≥ 1 or a percentage "1%".."100%".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("string(self).matches('^[1-9][0-9]*$') ? self == int(string(self)) : string(self).matches('^(100|[1-9][0-9]?)%$')")
        .message("maxUpdate must be an integer of at least 1 or a percentage from 1% to 100%"))]
    pub max_update: Option<IntOrString>,
    /// Failed nodes tolerated before the rollout halts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 0").message("maxFailures must not be negative"))]
    pub max_failures: Option<i32>,
}

/// Observed state, written by the coordinator only.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ShimStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Node counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeCounts>,
    /// Ready, Progressing, Degraded, RolloutHalted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    /// The rollout's slots (docs/design.md §5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// The newest generation whose rollout the BeforeRollout extensions approved
    /// (docs/design.md §10); a new coordinator does not ask them again for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_generation: Option<i64>,
    /// The newest generation whose rollout a BeforeRollout extension refused (the
    /// `RolloutHalted` condition, reason `ExtensionRefused`, carries its message); a new
    /// coordinator keeps that generation halted without asking again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_generation: Option<i64>,
}

/// Where the rollout stands: slots, who holds them, failures.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// N, the slots nodes restart containerd under (absent: no limit, `recreate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slots: Option<i32>,
    /// Slots held now (nodes mid-update, and failed nodes keeping theirs).
    pub in_use: i32,
    /// Nodes whose failure holds a slot (the first 20).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_nodes: Vec<String>,
    /// True while failures exceed maxFailures: no node takes a new slot.
    pub halted: bool,
    /// "in use/N" (or "in use/-" without a limit), for `kubectl get shims`.
    pub summary: String,
}

/// How many nodes are in which state.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeCounts {
    pub targeted: i32,
    pub installed: i32,
    pub updating: i32,
    pub failed: i32,
}

/// A Cluster API style condition.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Ready, Progressing, Degraded or RolloutHalted.
    #[serde(rename = "type")]
    pub type_: String,
    /// "True", "False" or "Unknown".
    pub status: String,
    /// Error, Warning or Info (only when status is False).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<String>,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    /// A CamelCase machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `runtime.optionPaths`: bounded, so that its CEL rules stay within the API server's cost
/// budget.
fn option_paths_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 4096},
    })
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

impl Shim {
    /// The containerd runtime handler: `spec.runtimeClass.handler`, default `metadata.name`.
    pub fn handler(&self) -> &str {
        self.spec
            .runtime_class
            .handler
            .as_deref()
            .or(self.metadata.name.as_deref())
            .unwrap_or_default()
    }

    /// The object's name (empty when unset, which validation rejects).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// Hash of everything that, when it changes, means a new install on a node: the
    /// handler, the artifact and the runtime settings (not the targeting or the rollout).
    pub fn spec_hash(&self) -> String {
        use sha2::Digest;
        let v = serde_json::json!({
            "handler": self.handler(),
            "fetch": self.spec.fetch_strategy,
            "runtime": self.spec.runtime,
        });
        hex::encode(sha2::Sha256::digest(v.to_string().as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim(yaml: &str) -> Shim {
        serde_yaml::from_str(yaml).unwrap()
    }

    const BASE: &str = "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {name: wasm}\nspec:\n  fetchStrategy: {type: anonymousHttp, anonHttp: {location: https://x/a.tgz}}\n  runtimeClass: {name: wasm}\n";

    #[test]
    fn changing_only_the_check_changes_no_spec_hash() {
        let plain = shim(BASE);
        let checked = shim(&format!(
            "{BASE}  check:\n    container: {{image: hello:v1, command: [/hello.wasm], success: {{outputContains: hello}}}}\n"
        ));
        let other = shim(&format!(
            "{BASE}  check: {{container: {{image: other:v2, command: [/x], timeoutSeconds: 5}}}}\n"
        ));
        assert_ne!(plain.spec, checked.spec);
        assert_eq!(plain.spec_hash(), checked.spec_hash());
        assert_eq!(checked.spec_hash(), other.spec_hash());
    }

    #[test]
    fn a_shim_without_containerd_ranges_keeps_its_spec_hash() {
        // an absent field is not serialized: hashes of existing Shims do not move
        let text = serde_json::to_string(&shim(BASE).spec.fetch_strategy).unwrap();
        assert!(!text.contains("containerd"), "{text}");
    }

    #[test]
    fn every_kind_is_served_at_the_api_version_of_the_wire_names() {
        use kube::Resource;

        use crate::api::extension::ShimExtension;
        use crate::api::lease::ShimLease;
        use crate::api::names::{API_VERSION, GROUP, VERSION};

        assert_eq!(API_VERSION, format!("{GROUP}/{VERSION}"));
        assert_eq!(Shim::api_version(&()), API_VERSION);
        assert_eq!(ShimLease::api_version(&()), API_VERSION);
        assert_eq!(ShimExtension::api_version(&()), API_VERSION);
    }
}
