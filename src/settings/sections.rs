//! The sections of the configuration file, with their defaults: what `load` merges the files
//! into, and what `validate` checks.

// JsonSchema: the doc comments and defaults of docs/reference/config.md
// (src/cli/reference/config.rs).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::signatures::SignatureSettings;

/// All settings, with defaults filled in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Settings {
    pub node: NodeSettings,
    pub containerd: ContainerdSettings,
    pub fetch: FetchSettings,
    pub check: CheckSettings,
    pub signatures: SignatureSettings,
    pub paths: PathSettings,
    pub kubernetes: KubernetesSettings,
    pub log: LogSettings,
    pub metrics: MetricsSettings,
}

/// Which node this agent is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct NodeSettings {
    /// Node name in Kubernetes; empty = the host name.
    pub name: String,
}

/// How containerd is found, restarted and verified.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct ContainerdSettings {
    /// Distro profile: `auto` (detect), `containerd`, `k3s`, `k3s-agent`, `rke2-server`,
    /// `rke2-agent`, `k0s`, `microk8s`.
    pub profile: String,
    /// containerd's main config file; empty = the profile's.
    pub config: String,
    /// Directory for drop-ins; empty = the profile's choice (or none).
    pub dropin_dir: String,
    /// systemd unit to restart; empty = the profile's.
    pub unit: String,
    /// containerd's gRPC socket.
    pub socket: String,
    /// How long a restart job may take before it counts as failed.
    pub restart_timeout_secs: u64,
    /// How long containerd may take to report the handler through CRI after a restart.
    pub verify_timeout_secs: u64,
    /// k3s and rke2: start a new config template from `{{ template "base" . }}` (their
    /// releases since September 2023); `false` starts it from a copy of the rendered config.
    pub template_base: bool,
}

impl Default for ContainerdSettings {
    fn default() -> Self {
        ContainerdSettings {
            profile: "auto".into(),
            config: String::new(),
            dropin_dir: String::new(),
            unit: String::new(),
            socket: "/run/containerd/containerd.sock".into(),
            restart_timeout_secs: 90,
            verify_timeout_secs: 30,
            template_base: true,
        }
    }
}

/// Download limits and policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct FetchSettings {
    /// Accept artifacts without a sha256 in the Shim (not recommended).
    pub allow_unverified: bool,
    /// Largest download accepted, in bytes.
    pub max_download_bytes: u64,
    /// Largest total size of the unpacked files, in bytes.
    pub max_unpacked_bytes: u64,
    /// Most entries accepted in one archive.
    pub max_entries: u64,
    /// How long connecting to an artifact's server or an OCI registry may take.
    pub connect_timeout_secs: u64,
    /// Longest pause in a download before it is abandoned.
    pub read_timeout_secs: u64,
    /// Attempts for transient failures (5xx, resets), including the first.
    pub attempts: u32,
    /// File holding a bearer token for OCI registries (empty: the node's credentials below,
    /// else anonymous pulls).
    pub registry_token_file: String,
    /// A Docker-style `config.json` with credentials for OCI registries, by host (empty:
    /// none). Used for a host no credential provider answers for.
    pub registry_config: String,
    /// The kubelet's `CredentialProviderConfig` (`--image-credential-provider-config`), whose
    /// plugins give credentials for the OCI registries they match (empty: none).
    pub credential_provider_config: String,
    /// The directory of those plugins (`--image-credential-provider-bin-dir`).
    pub credential_provider_bin_dir: String,
    /// How long a credential-provider plugin may take.
    pub credential_provider_timeout_secs: u64,
    /// Credentials for `anonymousHttp` artifact servers, by host (TOML: `[hosts."host[:port]"]`
    /// with `username` and `password`, or `bearer-token`; empty: none).
    pub http_credentials_file: String,
    /// PEM file of CA certificates trusted for https artifacts and OCI registries, beside
    /// the system's bundle (empty: the system's only). A node with neither can still fetch
    /// `file://` and `http://` artifacts.
    pub ca_file: String,
}

impl Default for FetchSettings {
    fn default() -> Self {
        FetchSettings {
            allow_unverified: false,
            max_download_bytes: 1 << 30,
            max_unpacked_bytes: 2 << 30,
            max_entries: 10_000,
            connect_timeout_secs: 10,
            read_timeout_secs: 30,
            attempts: 4,
            registry_token_file: String::new(),
            registry_config: String::new(),
            credential_provider_config: String::new(),
            credential_provider_bin_dir: String::new(),
            credential_provider_timeout_secs: 30,
            http_credentials_file: String::new(),
            ca_file: String::new(),
        }
    }
}

/// How a new shim is proven to work before it is committed (docs/design.md §3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct CheckSettings {
    /// Start a pod sandbox through every new handler (and the Shim's check container) before
    /// the commit. `false` takes containerd listing the handler as enough: a shim that
    /// cannot run is then labelled and every pod sent to the node fails (not recommended).
    pub sandbox: bool,
    /// How long getting the sandbox image, `RunPodSandbox` and its status may take.
    pub sandbox_timeout_secs: u64,
    /// How long the shim may take to answer `-v` in the preflight.
    pub version_timeout_secs: u64,
}

impl Default for CheckSettings {
    fn default() -> Self {
        CheckSettings {
            sandbox: true,
            sandbox_timeout_secs: 120,
            version_timeout_secs: 10,
        }
    }
}

/// Where the agent keeps its files (host paths; resolved under `--root` offline).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct PathSettings {
    /// State, journal and the content-addressed store.
    pub state_dir: String,
    /// Static Shims for nodes without a cluster.
    pub static_shims_dir: String,
}

impl Default for PathSettings {
    fn default() -> Self {
        PathSettings {
            state_dir: "/var/lib/shim-agent".into(),
            static_shims_dir: "/etc/shim-agent/shims.d".into(),
        }
    }
}

/// How to reach the cluster, and the coordinator election's timings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct KubernetesSettings {
    /// kubeconfig to use; empty = the kubelet's (`/etc/kubernetes/kubelet.conf`, then
    /// `/var/lib/kubelet/kubeconfig`), else in-cluster; none of them: static Shims only.
    pub kubeconfig: String,
    /// kubeconfig of a coordinator identity (group `containerd.x-k8s.io:coordinators`): with
    /// it, this agent also stands for the coordinator election and, elected, does the
    /// cluster-wide work (RuntimeClasses, Shim status, slots). Empty: it does not. Give it to
    /// trusted nodes only (a node's own credential never carries the coordinator's verbs).
    pub coordinator_kubeconfig: String,
    /// How long the coordinator Lease is valid without renewal.
    pub lease_duration_secs: u64,
    /// How long the coordinator keeps trying to renew before it steps down.
    pub renew_deadline_secs: u64,
    /// Pause between election attempts and renewals.
    pub retry_period_secs: u64,
    /// Least time between two status writes of one Shim.
    pub status_interval_secs: u64,
    /// How long to wait at start for this node's Node object.
    pub node_wait_secs: u64,
    /// Longest a ShimExtension may defer this node's restart while it holds its rollout slot;
    /// then the slot is given back and the node waits for another (docs/design.md §10).
    pub max_deferral_secs: u64,
    /// The taint node provisioners put on new nodes until their Shims are ready, as
    /// `KEY:EFFECT` with the key under `containerd.x-k8s.io/` (for example
    /// `containerd.x-k8s.io/shims-pending:NoSchedule`). Empty: none. The agent names it on its
    /// Node; the coordinator removes it once the Node's `containerd.x-k8s.io/ShimsReady`
    /// condition is True, and nothing adds it back (docs/design.md §7).
    pub startup_taint: String,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            kubeconfig: String::new(),
            coordinator_kubeconfig: String::new(),
            lease_duration_secs: 15,
            renew_deadline_secs: 10,
            retry_period_secs: 2,
            status_interval_secs: 2,
            node_wait_secs: 60,
            max_deferral_secs: 300,
            startup_taint: String::new(),
        }
    }
}

/// Logging.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct LogSettings {
    /// `error`, `warn`, `info`, `debug` or `trace` (or a tracing filter directive).
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            level: "info".into(),
        }
    }
}

/// Where Prometheus metrics are served (`GET /metrics`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct MetricsSettings {
    /// Unix socket (empty: none). Its directory is the unit's RuntimeDirectory.
    pub socket: String,
    /// TCP address such as `127.0.0.1:9464` (empty: none).
    pub address: String,
}

impl Default for MetricsSettings {
    fn default() -> Self {
        MetricsSettings {
            socket: "/run/shim-agent/metrics.sock".into(),
            address: String::new(),
        }
    }
}
