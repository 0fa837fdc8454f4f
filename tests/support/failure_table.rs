//! The failure table both run modes must decide alike (`run` with static Shims, in
//! tests/pure/reconciler_table.rs, and the cluster agent on the real API server, in
//! tests/kube/reconciler_table.rs): each row is a batch of Shims arriving together on a node
//! whose containerd misbehaves as the row says, and the decisions the node must end with:
//! which Shims it installed and which it holds failed, with what reason, and how often it
//! checked the runtimes a row watches. A row may also remove Shims once they are installed
//! (a second phase), start from crash records, or find the node's state unsaveable.
#![allow(dead_code)]

use std::collections::BTreeMap;

use shim_agent::state::{CrashRecord, NodeState};

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
    /// Shims no longer wanted on the node once every Shim of the row is installed: the row's
    /// second phase uninstalls them (its restarts count on from the first phase's).
    pub removed: &'static [&'static str],
    /// Shims the agent crashed on, so many times at their spec, before the row begins (the
    /// crash records a dead agent left in the state store).
    pub crashed: &'static [(&'static str, u32)],
    /// The node's state directory is gone when the Shims arrive (a full or read-only disk
    /// refuses the write the same way): no round's crash record can be saved.
    pub unsaveable: bool,
    /// Shims whose runtime check must have run exactly once by the end: a failed one waits
    /// its backoff rather than being tried again at once.
    pub checked_once: &'static [&'static str],
}

/// A row's defaults: one phase, no crash records, a state that saves, no checks counted.
const ROW: Row = Row {
    what: "",
    shims: &[],
    fail_restarts: &[],
    installed: &[],
    failing: &[],
    removed: &[],
    crashed: &[],
    unsaveable: false,
    checked_once: &[],
};

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
        ..ROW
    },
    Row {
        what: "one runtime fails its check in a batch: it alone is blamed",
        shims: &[("a", Kind::Good), ("b", Kind::FailsCheck)],
        fail_restarts: &[],
        installed: &["a"],
        failing: &[("b", "SandboxCheckFailed")],
        ..ROW
    },
    Row {
        what: "a batch fails without naming its culprit: each runs alone, and each installs",
        shims: &[("a", Kind::Good), ("b", Kind::Good)],
        fail_restarts: &[1],
        installed: &["a", "b"],
        failing: &[],
        ..ROW
    },
    Row {
        what: "a round whose crash record cannot be saved does not begin: its Shim fails and \
               nothing is installed",
        shims: &[("a", Kind::Good)],
        installed: &[],
        failing: &[("a", "StateIo")],
        unsaveable: true,
        ..ROW
    },
    Row {
        what: "an uninstall whose restart fails is rolled back: the Shim stays, held failed",
        // alone, so that its install is restart 1 in both modes (the agent may install a
        // batch that arrives over several watch events in more than one round)
        shims: &[("b", Kind::Good)],
        fail_restarts: &[2],
        removed: &["b"],
        installed: &["b"],
        failing: &[("b", "RolledBack")],
        ..ROW
    },
    Row {
        what: "a Shim crashed on twice at its spec is set aside; the others install",
        shims: &[("a", Kind::Good), ("b", Kind::Good)],
        crashed: &[("b", shim_agent::crashes::CRASHES_TO_SET_ASIDE)],
        installed: &["a"],
        failing: &[("b", shim_agent::crashes::REASON)],
        ..ROW
    },
    Row {
        what: "a failed Shim waits its backoff: checked once, not again while the others go on",
        shims: &[
            ("a", Kind::Good),
            ("b", Kind::FailsCheck),
            ("c", Kind::Good),
        ],
        installed: &["a", "c"],
        failing: &[("b", "SandboxCheckFailed")],
        checked_once: &["b"],
        ..ROW
    },
];

/// What a node ended with: the Shims installed, and those held failed with their reasons.
#[derive(Debug, PartialEq, Eq)]
pub struct Decisions {
    pub installed: Vec<String>,
    pub failing: BTreeMap<String, String>,
    /// The row's `checked_once` Shims → how often their runtime was checked.
    pub checked: BTreeMap<String, usize>,
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
            checked: self
                .checked_once
                .iter()
                .map(|s| (format!("{prefix}{s}"), 1))
                .collect(),
        }
    }

    /// How often `f` checked the runtimes of the row's `checked_once` Shims.
    pub fn checked(&self, f: &FakeContainerd, prefix: &str) -> BTreeMap<String, usize> {
        let proved = f.proved.borrow();
        self.checked_once
            .iter()
            .map(|s| {
                let name = format!("{prefix}{s}");
                let times = proved.iter().filter(|p| p.contains(&name)).count();
                (name, times)
            })
            .collect()
    }

    /// The decisions a node ended with: `installed` and `failing` (Shim → reason) as the mode
    /// reads them, and the checks `f` ran.
    pub fn decided(
        &self,
        installed: Vec<String>,
        failing: BTreeMap<String, String>,
        f: &FakeContainerd,
        prefix: &str,
    ) -> Decisions {
        Decisions {
            installed,
            failing,
            checked: self.checked(f, prefix),
        }
    }

    /// The crash records a dead agent left for the row's `crashed` Shims, each at the spec
    /// `key_of` gives it (as the node keys it: `reconciler::memory::spec_key`).
    pub fn seed_crashes(
        &self,
        state: &mut NodeState,
        prefix: &str,
        key_of: impl Fn(&str) -> String,
    ) {
        for (s, crashes) in self.crashed {
            let name = format!("{prefix}{s}");
            let rec = CrashRecord {
                spec_key: key_of(&name),
                crashes: *crashes,
                alone: *crashes,
                last: 0,
            };
            state.crashes.insert(name, rec);
        }
    }

    /// Whether the row has a second phase (Shims removed once installed).
    pub fn removes(&self) -> bool {
        !self.removed.is_empty()
    }

    /// Whether `name` (`<prefix><suffix>`) is removed in the row's second phase.
    pub fn is_removed(&self, name: &str, prefix: &str) -> bool {
        self.removed.iter().any(|s| format!("{prefix}{s}") == name)
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

/// The node's state directory goes away under the agent, a file in its place: no write of the
/// state can land (as on a full or read-only disk).
pub fn break_state_dir(w: &World) {
    let state_dir = w.root.resolve("/var/lib/shim-agent").unwrap();
    let moved = state_dir.with_extension("gone");
    std::fs::rename(&state_dir, &moved).unwrap();
    std::fs::write(&state_dir, "not a directory").unwrap();
}
