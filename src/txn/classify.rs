//! One answer to "does this change do real work on this node?", pure: the engine decides
//! what to fetch and restart with it, the agent what to announce, gate and blame.
//!
//! A Shim whose record, installed binary and handler are all in place at the same spec is
//! unchanged; the same spec with its binary or handler gone is a drift repair.

use std::collections::BTreeSet;

use crate::api::Shim;
use crate::state::{NodeState, Origin};

/// One requested change.
#[derive(Debug, Clone)]
pub enum Change {
    /// Install or upgrade this Shim.
    Install(Box<Shim>),
    /// Install or upgrade this Shim, recording where it came from (instead of the node's
    /// default origin).
    InstallAs(Box<Shim>, Origin),
    /// Uninstall the Shim with this name.
    Uninstall(String),
}

/// What the host looks like, as far as the decision needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostFacts {
    /// Runtime handlers containerd's config defines.
    pub handlers: BTreeSet<String>,
    /// Host paths of the installed records' binaries that exist.
    pub binaries: BTreeSet<String>,
}

/// What one change does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    /// Installed at this spec, binary and handler in place: nothing to do.
    Unchanged,
    /// Not installed yet.
    Install,
    /// Installed at another spec.
    Upgrade,
    /// Installed at this spec, but its binary or its handler is gone (drift).
    Repair,
    /// Installed, to be removed.
    Uninstall,
    /// To be removed, but not installed: nothing to do.
    Absent,
}

impl Work {
    /// True when the change touches the host.
    pub fn is_real(self) -> bool {
        !matches!(self, Work::Unchanged | Work::Absent)
    }
}

/// The Shim a change is about.
pub fn change_name(c: &Change) -> &str {
    match c {
        Change::Install(s) | Change::InstallAs(s, _) => s.name(),
        Change::Uninstall(n) => n,
    }
}

/// What `change` does on a node in `state` whose host looks like `facts`.
pub fn classify(change: &Change, state: &NodeState, facts: &HostFacts) -> Work {
    match change {
        Change::Uninstall(n) if state.shims.contains_key(n) => Work::Uninstall,
        Change::Uninstall(_) => Work::Absent,
        Change::Install(s) | Change::InstallAs(s, _) => match state.shims.get(s.name()) {
            None => Work::Install,
            Some(r) if r.spec_hash != s.spec_hash() => Work::Upgrade,
            Some(r)
                if facts.binaries.contains(&r.binary) && facts.handlers.contains(&r.handler) =>
            {
                Work::Unchanged
            }
            Some(_) => Work::Repair,
        },
    }
}

/// The other installed Shim that already owns `shim`'s handler, if any: installing `shim`
/// then fails (one handler, one Shim).
pub fn handler_owner<'a>(state: &'a NodeState, shim: &crate::api::Shim) -> Option<&'a str> {
    state
        .shims
        .values()
        .find(|s| s.handler == shim.handler() && s.name != shim.name())
        .map(|s| s.name.as_str())
}

/// What an install of `shim` fails with while Shim `owner` holds its handler.
pub fn handler_in_use_message(shim: &crate::api::Shim, owner: &str) -> String {
    format!(
        "handler {:?} is already installed for Shim {owner:?}; uninstall it first",
        shim.handler()
    )
}

/// The names of the changes that do real work.
pub fn real_work(changes: &[Change], state: &NodeState, facts: &HostFacts) -> Vec<String> {
    changes
        .iter()
        .filter(|c| classify(c, state, facts).is_real())
        .map(|c| change_name(c).to_string())
        .collect()
}
