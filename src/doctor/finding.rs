//! What the doctor finds, one check at a time: the checks' stable names, how a finding bears
//! on installs, and the finding itself.

use serde::Serialize;

/// The checks, by the stable names `--json` gives them.
pub mod check {
    pub const PROFILE: &str = "containerd.profile";
    pub const CONFIG: &str = "containerd.config";
    pub const UNIT: &str = "containerd.unit";
    pub const VERSION: &str = "containerd.version";
    pub const REGISTRY_HOSTS: &str = "containerd.registry-hosts";
    pub const CRI: &str = "cri.socket";
    pub const SANDBOX_IMAGE: &str = "cri.sandbox-image";
    pub const CREDENTIALS: &str = "kube.credentials";
    pub const API_SERVER: &str = "kube.api-server";
    pub const IDENTITY: &str = "kube.identity";
    pub const CLOCK_SKEW: &str = "kube.clock-skew";
    pub const DISK_STATE: &str = "disk.state";
    pub const DISK_INSTALL: &str = "disk.install";
    pub const PROXY: &str = "proxy";
    pub const SIGNATURE_POLICY: &str = "signature-policy";
}

/// How a finding bears on installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    /// Worth knowing; nothing wrong.
    Info,
    /// Not checked here (an image root has no running containerd).
    Skip,
    /// May fail some installs, or will later.
    Warn,
    /// Blocks installs.
    Fail,
}

impl Level {
    pub(super) fn label(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Info => "info",
            Level::Skip => "skip",
            Level::Warn => "WARN",
            Level::Fail => "FAIL",
        }
    }
}

/// One thing the doctor found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub summary: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
}

impl Finding {
    pub fn new(check: &'static str, level: Level, summary: impl Into<String>) -> Self {
        Finding {
            check,
            level,
            summary: summary.into(),
            remedy: None,
        }
    }

    pub fn remedy(mut self, what: impl Into<String>) -> Self {
        self.remedy = Some(what.into());
        self
    }
}
