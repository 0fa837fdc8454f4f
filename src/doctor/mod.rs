//! `shim-agent doctor`: each precondition of an install on this node (or in an image root,
//! `--root`), checked the way the agent relies on it, with what to do when it does not hold.
//!
//! [`gather`] asks the node (systemd over D-Bus, containerd's CRI, the API server with the
//! agent's own credentials, the files) and records plain [`facts`]; [`judge`] turns them
//! into [`Finding`]s (pure). A [`Level::Fail`] finding blocks installs: the command then
//! exits non-zero.

pub mod facts;
pub mod gather;
pub mod judge;

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
    fn label(self) -> &'static str {
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

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `node <name>` or `image <root>`.
    pub target: String,
    /// Something blocks installs.
    pub blocking: bool,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(facts: &facts::Facts) -> Report {
        let findings = judge::judge(facts);
        Report {
            target: match &facts.target {
                facts::Target::Node { name } => format!("node {name}"),
                facts::Target::Image { root } => format!("image {root}"),
            },
            blocking: findings.iter().any(|f| f.level == Level::Fail),
            findings,
        }
    }

    /// The report as a person reads it: one line per finding, what to do under it.
    pub fn to_text(&self) -> String {
        let width = self
            .findings
            .iter()
            .map(|f| f.check.len())
            .max()
            .unwrap_or(0);
        let mut out = format!("shim-agent doctor: {}\n", self.target);
        for f in &self.findings {
            out.push_str(&format!(
                "{:<4}  {:<width$}  {}\n",
                f.level.label(),
                f.check,
                f.summary
            ));
            if let Some(r) = &f.remedy {
                out.push_str(&format!("{:<4}  {:<width$}  -> {r}\n", "", ""));
            }
        }
        let count = |l| self.findings.iter().filter(|f| f.level == l).count();
        out.push_str(&match (count(Level::Fail), count(Level::Warn)) {
            (0, 0) => "nothing blocks installs\n".to_string(),
            (0, w) => format!("nothing blocks installs; {w} warning(s)\n"),
            (n, w) => format!("{n} problem(s) block installs; {w} warning(s)\n"),
        });
        out
    }
}
