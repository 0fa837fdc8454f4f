//! The agent's own configuration: `/etc/shim-agent/config.toml` plus
//! `/etc/shim-agent/config.d/*.toml` drop-ins.
//!
//! Layering: the main file first (absent = all defaults, unless its path was given
//! explicitly with `--config`), then every `config.d/*.toml` beside it in lexical order;
//! a later file overrides the keys it sets, tables merge key by key. Every setting is
//! optional. Each file is checked on its own, so an unknown key or a wrong type is reported
//! with the file that holds it; the merged result is then validated once more.

use std::path::{Path, PathBuf};

// JsonSchema: the doc comments and defaults of docs/reference/config.md
// (src/cli/reference/config.rs).
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use thiserror::Error;

mod signatures;
mod validate;

pub use signatures::{IdentitySetting, SignatureSettings};

/// Default location of the main file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/shim-agent/config.toml";

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

/// What can go wrong loading the settings.
#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl SettingsError {
    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            SettingsError::Read { .. } => "SettingsUnreadable",
            SettingsError::Invalid { .. } => "SettingsInvalid",
        }
    }
}

/// The files that make up the settings, in the order they apply.
pub fn config_files(main: &Path) -> Result<Vec<PathBuf>, SettingsError> {
    let mut files = Vec::new();
    if main.exists() {
        files.push(main.to_path_buf());
    }
    let dir = main.parent().unwrap_or(Path::new("/")).join("config.d");
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            let mut dropins: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
                .collect();
            dropins.sort();
            files.extend(dropins);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(SettingsError::Read {
                path: dir,
                source: e,
            });
        }
    }
    Ok(files)
}

/// Load the settings. `explicit` is true when the path came from `--config`: then the main
/// file must exist.
pub fn load(main: &Path, explicit: bool) -> Result<Settings, SettingsError> {
    if explicit && !main.exists() {
        return Err(SettingsError::Read {
            path: main.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let mut merged = toml_edit::DocumentMut::new();
    for path in config_files(main)? {
        let text = std::fs::read_to_string(&path).map_err(|e| SettingsError::Read {
            path: path.clone(),
            source: e,
        })?;
        let doc: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| SettingsError::Invalid {
                    path: path.clone(),
                    message: one_line(&e.to_string()),
                })?;
        // Check this file alone, so the error names it.
        toml_edit::de::from_document::<Settings>(doc.clone()).map_err(|e| {
            SettingsError::Invalid {
                path: path.clone(),
                message: one_line(&e.to_string()),
            }
        })?;
        merge_tables(merged.as_table_mut(), doc.as_table());
    }
    let settings: Settings =
        toml_edit::de::from_document(merged).map_err(|e| SettingsError::Invalid {
            path: main.to_path_buf(),
            message: one_line(&e.to_string()),
        })?;
    settings
        .validate()
        .map_err(|message| SettingsError::Invalid {
            path: main.to_path_buf(),
            message,
        })?;
    Ok(settings)
}

/// toml_edit's messages span several lines (a source excerpt); keep them readable in one log line.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn merge_tables(into: &mut toml_edit::Table, from: &toml_edit::Table) {
    for (key, item) in from.iter() {
        match (into.get_mut(key), item.as_table_like()) {
            (Some(existing), Some(from_table)) if existing.is_table_like() => {
                let mut t = toml_edit::Table::new();
                for (k, v) in from_table.iter() {
                    t.insert(k, v.clone());
                }
                if let Some(existing_table) = existing.as_table_mut() {
                    merge_tables(existing_table, &t);
                } else if let Some(inline) = existing.as_inline_table_mut() {
                    let mut as_table = inline.clone().into_table();
                    merge_tables(&mut as_table, &t);
                    *existing = toml_edit::Item::Table(as_table);
                }
            }
            _ => {
                into.insert(key, item.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commented config the packages ship says "these are the defaults": with its `#`
    /// taken off every key and table line, it is every setting, at its default.
    #[test]
    fn the_shipped_config_names_every_setting_at_its_default() {
        let shipped = include_str!("../../packaging/config.toml");
        let uncommented: String = shipped
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter(|l| {
                l.starts_with('[') || l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' '))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let parsed: serde_json::Value = toml_edit::de::from_str(&uncommented).unwrap();
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        assert_eq!(parsed, defaults, "packaging/config.toml:\n{uncommented}");
    }

    fn write(dir: &Path, rel: &str, text: &str) -> PathBuf {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn no_files_gives_the_defaults() {
        let d = tempfile::tempdir().unwrap();
        let s = load(&d.path().join("config.toml"), false).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.paths.state_dir, "/var/lib/shim-agent");
        assert!(!s.fetch.allow_unverified);
    }

    #[test]
    fn an_explicit_missing_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let e = load(&d.path().join("nope.toml"), true).unwrap_err();
        assert!(e.to_string().contains("nope.toml"), "{e}");
    }

    #[test]
    fn dropins_override_the_main_file_in_lexical_order() {
        let d = tempfile::tempdir().unwrap();
        let main = write(
            d.path(),
            "config.toml",
            "[containerd]\nunit = \"a.service\"\nverify-timeout-secs = 5\n[log]\nlevel = \"debug\"\n",
        );
        write(
            d.path(),
            "config.d/20-b.toml",
            "[containerd]\nunit = \"c.service\"\n",
        );
        write(
            d.path(),
            "config.d/10-a.toml",
            "[containerd]\nunit = \"b.service\"\nsocket = \"/x.sock\"\n",
        );
        write(d.path(), "config.d/ignored.txt", "garbage");
        let s = load(&main, true).unwrap();
        assert_eq!(s.containerd.unit, "c.service");
        assert_eq!(s.containerd.socket, "/x.sock");
        assert_eq!(s.containerd.verify_timeout_secs, 5);
        assert_eq!(s.log.level, "debug");
    }

    #[test]
    fn an_unknown_key_is_rejected_naming_the_file_and_key() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "");
        write(
            d.path(),
            "config.d/50-typo.toml",
            "[fetch]\nallow-unverifed = true\n",
        );
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("50-typo.toml"), "{e}");
        assert!(e.contains("allow-unverifed"), "{e}");
    }

    #[test]
    fn an_unknown_section_and_a_wrong_type_are_rejected() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "[contanerd]\nunit = \"x\"\n");
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("contanerd") && e.contains("config.toml"), "{e}");
        std::fs::write(&main, "[fetch]\nattempts = \"many\"\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("attempts") || e.contains("invalid type"), "{e}");
    }

    #[test]
    fn semantic_errors_are_named() {
        let d = tempfile::tempdir().unwrap();
        let main = write(
            d.path(),
            "config.toml",
            "[containerd]\nprofile = \"docker\"\n",
        );
        let e = load(&main, false).unwrap_err().to_string();
        assert!(
            e.contains("containerd.profile") && e.contains("docker"),
            "{e}"
        );
        std::fs::write(&main, "[paths]\nstate-dir = \"var/lib\"\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("paths.state-dir"), "{e}");
        std::fs::write(&main, "[fetch]\nattempts = 0\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("fetch.attempts"), "{e}");
        std::fs::write(
            &main,
            "[fetch]\ncredential-provider-config = \"/etc/kubernetes/cp.yaml\"\n",
        )
        .unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("credential-provider-bin-dir go together"), "{e}");
        std::fs::write(&main, "[fetch]\ncredential-provider-timeout-secs = 0\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("fetch.credential-provider-timeout-secs"), "{e}");
    }

    #[test]
    fn a_toml_syntax_error_names_file_line_and_column() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "[log]\nlevel = \n");
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("line 2"), "{e}");
    }
}
