//! The documents inside the state store: installed shims and the open transaction.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Everything the agent knows about its node.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeState {
    /// Installed shims by Shim name.
    #[serde(default)]
    pub shims: BTreeMap<String, InstalledShim>,
    /// The transaction in progress, if any (at most one per node).
    #[serde(default)]
    pub journal: Option<Journal>,
    /// Installed versions that a transaction replaced or removed, kept on disk while
    /// containerd tasks still run through them (`txn::retain`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained: Vec<RetainedVersion>,
    /// The Shims the agent's current round works on, recorded before its risky steps and
    /// cleared when it ends: found at start, it names the Shims the agent crashed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working: Option<Working>,
    /// Crashes of the agent during a Shim's rounds, by Shim name (crash isolation).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub crashes: BTreeMap<String, CrashRecord>,
}

/// A round under way: each Shim with the spec it works on (`spec_key`: a new spec is a new
/// attempt).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Working {
    /// Shim name → spec key.
    pub shims: BTreeMap<String, String>,
    /// Unix time the round began.
    pub since: u64,
}

/// How often the agent crashed while working on one Shim at one spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrashRecord {
    pub spec_key: String,
    /// Crashes during rounds that worked on this Shim at `spec_key`.
    pub crashes: u32,
    /// Of those, crashes during rounds that worked on it alone.
    pub alone: u32,
    /// Unix time of the last one.
    pub last: u64,
}

/// A replaced or removed version of a shim, kept on disk because containerd tasks were
/// started through its files: containerd reloads each task through that path at its next
/// restart, and drops the task when the file is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetainedVersion {
    /// Shim name.
    pub name: String,
    /// SHA-256 of the artifact (the version's directory name).
    pub digest: String,
    /// Host path of the version's installed tree.
    pub dir: String,
    /// Unix time it was replaced or removed.
    pub since: u64,
    /// Tasks (`namespace/id`) that used it at the last check, at most
    /// [`RETAINED_TASKS_LISTED`]; `task_count` has them all.
    #[serde(default)]
    pub tasks: Vec<String>,
    #[serde(default)]
    pub task_count: usize,
}

/// Most task names recorded per retained version.
pub const RETAINED_TASKS_LISTED: usize = 16;

/// Format 1 of the state document: no journal.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct NodeStateV1 {
    #[serde(default)]
    pub shims: BTreeMap<String, InstalledShim>,
}

/// Where a Shim came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Origin {
    /// `shim-agent install --root DIR` into an image.
    Offline,
    /// `shim-agent install -f` on a live node.
    Cli,
    /// `/etc/shim-agent/shims.d/*.yaml`.
    Static,
    /// A Shim object in the cluster.
    Cluster,
}

/// Lifecycle of an installed shim on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShimState {
    /// Files and config are in place but containerd was not restarted (offline install):
    /// the agent verifies and adopts it on first boot.
    PendingVerification,
    /// containerd serves the handler.
    Installed,
    /// The last transaction for it failed and was rolled back.
    Failed,
}

impl std::fmt::Display for ShimState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ShimState::PendingVerification => "pending-verification",
            ShimState::Installed => "installed",
            ShimState::Failed => "failed",
        })
    }
}

/// A config file the agent changed, by content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigRecord {
    /// Host path of the file.
    pub path: String,
    /// SHA-256 of the bytes before the change; `None` when the agent created the file.
    pub sha256_before: Option<String>,
    /// SHA-256 of the bytes the agent wrote; `None` when the agent deleted the file.
    pub sha256_after: Option<String>,
}

/// One shim installed on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstalledShim {
    /// Shim name (metadata.name).
    pub name: String,
    /// containerd runtime handler.
    pub handler: String,
    /// `runtime_type` registered for the handler.
    pub runtime_type: String,
    /// SHA-256 of the artifact it came from.
    pub artifact_sha256: String,
    /// URL or OCI reference of the artifact.
    pub source: String,
    /// Host path of the installed shim binary.
    pub binary: String,
    /// Hash of the desired state it was installed from (artifact + runtime settings):
    /// a different hash means an upgrade.
    pub spec_hash: String,
    /// containerd config files changed for it.
    pub config_files: Vec<ConfigRecord>,
    pub state: ShimState,
    pub origin: Origin,
    /// The RuntimeClass that sends pods to it (`spec.runtimeClass.name`), so an uninstall can
    /// wait for its pods even after the Shim object is gone. Absent in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class: Option<String>,
    /// Unix time of the install.
    pub installed_at: u64,
    /// What the shim said of its own version (`-v`), when it said it (format 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_version: Option<String>,
    /// The check container it is proven with, from its Shim (format 4): a recovery or a
    /// first boot proves it from the record alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<CheckRecord>,
    /// The registry host that served it without its certificate being verified
    /// (containerd's `skip_verify` for that host; format 5). The digest still decided what
    /// was installed; what was sent to that host (the node's credentials) was not protected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_source: Option<String>,
    /// Whose signature was verified before it was installed, and when it was signed
    /// (format 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<SignatureRecord>,
}

/// A verified signature, as the state records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignatureRecord {
    /// The signed file: a path inside the artifact, or the artifact.
    pub file: String,
    /// The signer: a certificate identity, or `key sha256:<hex>`.
    pub signed_by: String,
    /// The OIDC issuer that vouched for the identity (keyless).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer: Option<String>,
    /// Unix time of the signed time (a transparency log entry's, or a timestamp authority's
    /// RFC 3161 token's); absent: no signed time was checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed_time: Option<i64>,
    /// Whether the node's own policy (`signatures.require`) checked it too.
    pub node_policy: bool,
}

impl SignatureRecord {
    /// How a verified signature reads: the file, who signed, and when (or that no signed time
    /// was checked).
    pub fn describe(&self) -> String {
        let by = match &self.issuer {
            Some(issuer) => format!("{} (issuer {issuer})", self.signed_by),
            None => self.signed_by.clone(),
        };
        let when = match self
            .signed_time
            .and_then(|t| k8s_openapi::jiff::Timestamp::from_second(t).ok())
        {
            Some(t) => {
                format!("signed at {t} (as a transparency log or timestamp authority signed)")
            }
            None => "with no signed time checked".to_string(),
        };
        let node = if self.node_policy {
            ", trusted by the node's policy too"
        } else {
            ""
        };
        format!("{}: verified, signed by {by}, {when}{node}", self.file)
    }
}

/// A Shim's check container as the state records it (`spec.check.container`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRecord {
    pub image: String,
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_contains: Option<String>,
    pub timeout_secs: u64,
}

/// What a transaction does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TxnKind {
    Install,
    Upgrade,
    Uninstall,
}

/// Phases of the node transaction (docs/design.md §3). The journal records a phase *before*
/// the side effect that follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Planned,
    Fetched,
    SlotAcquired,
    Staged,
    Applied,
    Restarted,
    Verified,
    /// Every new handler ran a pod sandbox (and its check container): format 4.
    Proven,
    Committed,
    RollingBack,
    RolledBack,
    Broken,
}

/// A file saved before the transaction touched it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backup {
    /// Host path of the file the transaction changes.
    pub path: String,
    /// Host path of the saved copy; `None` when the file did not exist before.
    pub saved_as: Option<String>,
    /// SHA-256 of the original bytes (`None`: did not exist).
    pub sha256: Option<String>,
}

/// The open transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Journal {
    /// Unique id (used in backup file names).
    pub id: String,
    pub kind: TxnKind,
    /// Shim names in this transaction (several changes may share one restart).
    pub shims: Vec<String>,
    pub phase: Phase,
    /// Files saved in the Staged phase.
    #[serde(default)]
    pub backups: Vec<Backup>,
    /// Why the transaction is rolling back, when it is.
    #[serde(default)]
    pub reason: Option<String>,
    /// Records to commit when the transaction succeeds (installs and upgrades), so a
    /// transaction can be rolled forward from the journal alone.
    #[serde(default)]
    pub pending: Vec<InstalledShim>,
    /// Shim names this transaction removes.
    #[serde(default)]
    pub removing: Vec<String>,
    /// The transaction only repairs drift: every Shim stays at its installed spec.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repair: bool,
    /// Unix time the transaction started.
    pub started_at: u64,
}

impl Journal {
    /// A new transaction at [`Phase::Planned`], started now.
    pub fn planned(id: String, kind: TxnKind, shims: Vec<String>) -> Journal {
        Journal {
            id,
            kind,
            shims,
            phase: Phase::Planned,
            backups: vec![],
            reason: None,
            pending: vec![],
            removing: vec![],
            repair: false,
            started_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or_default(),
        }
    }
}
