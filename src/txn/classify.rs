//! One answer to "does this change do real work on this node?", pure: the engine decides
//! what to fetch and restart with it ([`sort`] splits a batch by it), the agent what to
//! announce, gate and blame.
//!
//! A Shim whose record, installed binary and handler are all in place at the same spec is
//! unchanged; the same spec with its binary or handler gone is a drift repair.

use std::collections::BTreeSet;

use super::error::{TxnError, TxnReason};
use crate::api::Shim;
use crate::state::{InstalledShim, NodeState, Origin};

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

/// A batch's changes that do work.
pub(super) struct Sorted {
    pub(super) installs: Vec<(Box<Shim>, Origin)>,
    pub(super) removes: Vec<InstalledShim>,
    /// Every install only repairs drift.
    pub(super) repair: bool,
}

/// The changes that do work, as installs and removes (the rest are reported unchanged);
/// a handler another Shim holds refuses the batch.
pub(super) fn sort(
    changes: Vec<Change>,
    state: &NodeState,
    facts: &HostFacts,
    origin: Origin,
    unchanged: &mut Vec<String>,
) -> Result<Sorted, TxnError> {
    let mut installs = Vec::new();
    let mut removes = Vec::new();
    let mut repair = true;
    for c in changes {
        let work = classify(&c, state, facts);
        let (shim, origin) = match c {
            Change::Install(s) => (s, origin),
            Change::InstallAs(s, o) => (s, o),
            Change::Uninstall(name) => {
                match state.shims.get(&name) {
                    Some(rec) => removes.push(rec.clone()),
                    None => unchanged.push(name),
                }
                continue;
            }
        };
        if work == Work::Unchanged {
            unchanged.push(shim.name().to_string());
            continue;
        }
        repair &= work == Work::Repair;
        if let Some(other) = handler_owner(state, &shim) {
            let message = handler_in_use_message(&shim, other);
            return Err(TxnError::new(TxnReason::HandlerInUse, message).blaming(shim.name()));
        }
        installs.push((shim, origin));
    }
    Ok(Sorted {
        installs,
        removes,
        repair,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{InstalledShim, ShimState};

    /// Shim `name` whose artifact digest is `digit` 64 times (another digit: another spec).
    fn shim(name: &str, digit: char) -> Box<Shim> {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: {name}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: \"{}\"}}}}\n  runtimeClass: {{name: {name}}}\n",
            digit.to_string().repeat(64)
        );
        let mut shims = crate::api::load::parse_shims(&y, "t.yaml").expect("a valid Shim");
        Box::new(shims.remove(0))
    }

    /// The record of `shim` installed.
    fn record(shim: &Shim) -> InstalledShim {
        InstalledShim {
            name: shim.name().to_string(),
            handler: shim.handler().to_string(),
            runtime_type: "io.containerd.x.v2".into(),
            artifact_sha256: "1".repeat(64),
            source: "file:///x".into(),
            binary: format!("/opt/shim-agent/shims/{}/bin", shim.name()),
            spec_hash: shim.spec_hash(),
            config_files: vec![],
            state: ShimState::Installed,
            origin: Origin::Cluster,
            runtime_class: None,
            installed_at: 0,
            shim_version: None,
            insecure_source: None,
            signature: None,
            check: None,
        }
    }

    #[test]
    fn a_change_is_classified_by_its_record_its_spec_its_binary_and_its_handler() {
        let (v1, v2) = (shim("s", '1'), shim("s", '2'));
        let rec = record(&v1);
        let in_place = HostFacts {
            handlers: BTreeSet::from([rec.handler.clone()]),
            binaries: BTreeSet::from([rec.binary.clone()]),
        };
        let mut state = NodeState::default();
        let install = Change::Install(v1.clone());
        let uninstall = Change::Uninstall("s".into());
        assert_eq!(classify(&install, &state, &in_place), Work::Install);
        assert_eq!(classify(&uninstall, &state, &in_place), Work::Absent);

        state.shims.insert("s".into(), rec.clone());
        assert_eq!(classify(&install, &state, &in_place), Work::Unchanged);
        let as_static = Change::InstallAs(v1.clone(), Origin::Static);
        assert_eq!(classify(&as_static, &state, &in_place), Work::Unchanged);
        let upgrade = Change::Install(v2);
        assert_eq!(classify(&upgrade, &state, &in_place), Work::Upgrade);
        assert_eq!(
            classify(&upgrade, &state, &HostFacts::default()),
            Work::Upgrade,
            "another spec is an upgrade, drifted or not"
        );
        let no_binary = HostFacts {
            binaries: BTreeSet::new(),
            ..in_place.clone()
        };
        assert_eq!(classify(&install, &state, &no_binary), Work::Repair);
        let no_handler = HostFacts {
            handlers: BTreeSet::from(["runc".to_string()]),
            ..in_place.clone()
        };
        assert_eq!(classify(&install, &state, &no_handler), Work::Repair);
        assert_eq!(classify(&uninstall, &state, &in_place), Work::Uninstall);
    }

    #[test]
    fn only_installs_upgrades_repairs_and_uninstalls_are_real_work() {
        let real = [Work::Install, Work::Upgrade, Work::Repair, Work::Uninstall];
        assert!(real.into_iter().all(Work::is_real));
        assert!(!Work::Unchanged.is_real() && !Work::Absent.is_real());

        let (s, t) = (shim("s", '1'), shim("t", '1'));
        let rec = record(&s);
        let in_place = HostFacts {
            handlers: BTreeSet::from([rec.handler.clone()]),
            binaries: BTreeSet::from([rec.binary.clone()]),
        };
        let mut state = NodeState::default();
        state.shims.insert("s".into(), rec);
        let changes = [
            Change::Install(s),
            Change::Uninstall("gone".into()),
            Change::Install(t),
            Change::Uninstall("s".into()),
        ];
        assert_eq!(real_work(&changes, &state, &in_place), ["t", "s"]);
    }
}
