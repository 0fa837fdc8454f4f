//! `shim-agent doctor`: each precondition of an install on this node (or in an image root,
//! `--root`), checked the way the agent relies on it, with what to do when it does not hold.
//!
//! [`gather`] asks the node (systemd over D-Bus, containerd's CRI, the API server with the
//! agent's own credentials, the files) and records plain [`facts`]; [`judge`] turns them
//! into [`Finding`]s (pure). A [`Level::Fail`] finding blocks installs: the command then
//! exits non-zero.

pub mod facts;
mod finding;
pub mod gather;
pub mod judge;

use serde::Serialize;

pub use finding::{Finding, Level, check};

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
