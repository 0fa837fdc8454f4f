//! The failure table both run modes must decide alike (`run` with static Shims, in
//! tests/pure/reconciler_table.rs, and the cluster agent on the real API server, in
//! tests/kube/reconciler_table.rs): each row is a batch of Shims arriving together on a node
//! whose containerd misbehaves as the row says, and the decisions the node must end with:
//! which Shims it installed and which it holds failed, with what reason.
#![allow(dead_code)]

use std::collections::BTreeMap;

use super::live::{FakeContainerd, World, shim_builder};
use super::shim_builder::ShimBuilder;

/// A Shim of a row, and how it is bad.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Good,
    /// Its artifact's digest is wrong: it cannot be prepared, and says so by type.
    WrongDigest,
    /// containerd lists its handler but cannot run it: the functional check fails.
    FailsCheck,
}

/// One row: the Shims (by suffix; each mode prefixes its own), the restarts of containerd
/// that fail, and the decisions expected.
pub struct Row {
    pub what: &'static str,
    pub shims: &'static [(&'static str, Kind)],
    /// Restart numbers (1-based) that fail, naming no Shim.
    pub fail_restarts: &'static [u32],
    pub installed: &'static [&'static str],
    /// Shim → the reason it is held failed with.
    pub failing: &'static [(&'static str, &'static str)],
}

pub const TABLE: &[Row] = &[
    Row {
        what: "one artifact fails verification in a batch: it alone is blamed",
        shims: &[
            ("a", Kind::Good),
            ("b", Kind::WrongDigest),
            ("c", Kind::Good),
        ],
        fail_restarts: &[],
        installed: &["a", "c"],
        failing: &[("b", "DigestMismatch")],
    },
    Row {
        what: "one runtime fails its check in a batch: it alone is blamed",
        shims: &[("a", Kind::Good), ("b", Kind::FailsCheck)],
        fail_restarts: &[],
        installed: &["a"],
        failing: &[("b", "SandboxCheckFailed")],
    },
    Row {
        what: "a batch fails without naming its culprit: each runs alone, and each installs",
        shims: &[("a", Kind::Good), ("b", Kind::Good)],
        fail_restarts: &[1],
        installed: &["a", "b"],
        failing: &[],
    },
];

/// What a node ended with: the Shims installed, and those held failed with their reasons.
#[derive(Debug, PartialEq, Eq)]
pub struct Decisions {
    pub installed: Vec<String>,
    pub failing: BTreeMap<String, String>,
}

impl Row {
    /// The row's expected decisions, for Shims named `<prefix><suffix>`.
    pub fn expected(&self, prefix: &str) -> Decisions {
        Decisions {
            installed: self
                .installed
                .iter()
                .map(|s| format!("{prefix}{s}"))
                .collect(),
            failing: self
                .failing
                .iter()
                .map(|(s, r)| (format!("{prefix}{s}"), r.to_string()))
                .collect(),
        }
    }

    /// The row's Shims, named `<prefix><suffix>`, their artifacts in `w`.
    pub fn builders(&self, w: &World, prefix: &str) -> Vec<ShimBuilder> {
        self.shims
            .iter()
            .map(|(s, kind)| {
                let name = format!("{prefix}{s}");
                let b = shim_builder(w, &name, "1");
                match kind {
                    Kind::WrongDigest => {
                        let location =
                            format!("file://{}", w.art.join(format!("{name}-1.tgz")).display());
                        b.artifact(&location, &"0".repeat(64))
                    }
                    Kind::Good | Kind::FailsCheck => b,
                }
            })
            .collect()
    }

    /// A containerd that misbehaves as the row says (handlers are named as their Shims).
    pub fn containerd(&self, mut f: FakeContainerd, prefix: &str) -> FakeContainerd {
        f.fail_restarts = self.fail_restarts.to_vec();
        f.fail_checks = self
            .shims
            .iter()
            .filter(|(_, k)| matches!(k, Kind::FailsCheck))
            .map(|(s, _)| format!("{prefix}{s}"))
            .collect();
        f
    }
}
