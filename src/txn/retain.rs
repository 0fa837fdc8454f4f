//! Retained versions: an installed shim version that a transaction replaced (an upgrade) or
//! removed (an uninstall, a rollback of a new version, a stray directory) stays on disk while
//! any containerd task was started through it, in any namespace. containerd reloads each
//! running task through the shim path it was started with at its next restart, and drops
//! the task if that file is gone: deleting an old version at commit lost running pods at the
//! next restart.
//!
//! # Guarantees
//! - A version leaves `state.shims` and enters `state.retained` in the same state write (the
//!   commit or the rollback that closes the journal): a crash never loses the record of what
//!   is kept, and a version is never deleted before it is recorded.
//! - [`Node::collect_retained`](super::Node::collect_retained) deletes a retained version only when a scan of containerd's
//!   task bundles ([`crate::node::tasks`]) finds no task whose shim path lies inside it, the
//!   scan read every directory, and no transaction is open (never in a risky window). Files
//!   go first, then the record: a crash in between leaves a record whose directory is gone,
//!   dropped at the next collection.
//! - A version an installed shim uses again (a re-install of the same artifact) is never
//!   deleted; its retained record is dropped.
//!
//! Collections run after every transaction, at start, and every [`RETAIN_CHECK_SECS`] while
//! versions are retained. This module decides, pure; the node's side (the scan, the
//! deletions) is in [`super::collect`].

use std::collections::BTreeSet;

use crate::artifact;
use crate::node::tasks::{Task, TaskScan};
use crate::state::{InstalledShim, NodeState, RETAINED_TASKS_LISTED, RetainedVersion};

/// How often retained versions are checked again while any are kept.
pub const RETAIN_CHECK_SECS: u64 = 30;

/// The host directory of an installed record's version.
pub fn dir_of(rec: &InstalledShim) -> String {
    artifact::version_dir(&rec.name, &rec.artifact_sha256)
        .display()
        .to_string()
}

/// What a collection decided: versions kept (with the tasks that use them) and versions
/// whose files can go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    pub keep: Vec<RetainedVersion>,
    pub drop: Vec<RetainedVersion>,
}

/// Pure: which retained versions `scan` still finds in use. A version is in use when a
/// task's shim path lies inside its directory, or when a task records no path (a bundle
/// being created: it might be). A scan with errors keeps everything. Versions an installed
/// record uses (`installed_dirs`) are neither kept nor deleted: they are current again.
pub fn judge(
    retained: &[RetainedVersion],
    scan: &TaskScan,
    installed_dirs: &BTreeSet<String>,
) -> Judgement {
    let mut out = Judgement::default();
    for v in retained {
        if installed_dirs.contains(&v.dir) {
            continue;
        }
        let prefix = format!("{}/", v.dir.trim_end_matches('/'));
        let users: Vec<&Task> = scan
            .tasks
            .iter()
            .filter(|t| t.shim_path.as_ref().is_none_or(|p| p.starts_with(&prefix)))
            .collect();
        if users.is_empty() && scan.errors.is_empty() {
            out.drop.push(v.clone());
            continue;
        }
        let mut kept = v.clone();
        kept.task_count = users.len();
        kept.tasks = users
            .iter()
            .take(RETAINED_TASKS_LISTED)
            .map(|t| match &t.shim_path {
                Some(_) => t.name(),
                None => format!("{} (no shim path recorded yet)", t.name()),
            })
            .collect();
        if users.is_empty() {
            kept.tasks = vec![format!(
                "containerd's tasks could not all be read: {}",
                crate::text::clip(&scan.errors.join("; "), 500)
            )];
        }
        out.keep.push(kept);
    }
    out
}

/// Pure: record `old` versions as retained (unless already recorded, or still used by an
/// installed record); `now` in Unix seconds.
pub fn retire(state: &mut NodeState, old: &[(String, String)], now: u64) {
    let installed: BTreeSet<String> = state.shims.values().map(dir_of).collect();
    for (name, digest) in old {
        let dir = artifact::version_dir(name, digest).display().to_string();
        if installed.contains(&dir) || state.retained.iter().any(|r| r.dir == dir) {
            continue;
        }
        state.retained.push(RetainedVersion {
            name: name.clone(),
            digest: digest.clone(),
            dir,
            since: now,
            tasks: Vec::new(),
            task_count: 0,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(name: &str, digest: &str) -> RetainedVersion {
        RetainedVersion {
            name: name.into(),
            digest: digest.into(),
            dir: artifact::version_dir(name, digest).display().to_string(),
            since: 1,
            tasks: vec![],
            task_count: 0,
        }
    }

    fn task(ns: &str, id: &str, path: Option<&str>) -> Task {
        Task {
            namespace: ns.into(),
            id: id.into(),
            shim_path: path.map(str::to_string),
        }
    }

    #[test]
    fn a_version_a_task_runs_through_is_kept_the_others_go() {
        let v1 = version("w", "aa");
        let v0 = version("w", "a"); // a prefix of v1's digest: must not count v1's tasks
        let scan = TaskScan {
            tasks: vec![
                task(
                    "k8s.io",
                    "p1",
                    Some("/opt/shim-agent/shims/w/aa/containerd-shim-w-v1"),
                ),
                task("default", "x", Some("/usr/bin/containerd-shim-runc-v2")),
            ],
            errors: vec![],
        };
        let j = judge(&[v1.clone(), v0.clone()], &scan, &BTreeSet::new());
        assert_eq!(j.drop, vec![v0]);
        assert_eq!(j.keep.len(), 1);
        assert_eq!(j.keep[0].tasks, vec!["k8s.io/p1"]);
        assert_eq!(j.keep[0].task_count, 1);
    }

    #[test]
    fn an_unreadable_scan_or_an_unrecorded_path_keeps_everything() {
        let v = version("w", "aa");
        let errors = TaskScan {
            tasks: vec![],
            errors: vec!["/run/containerd/io.containerd.runtime.v2.task: denied".into()],
        };
        let j = judge(std::slice::from_ref(&v), &errors, &BTreeSet::new());
        assert!(j.drop.is_empty() && j.keep.len() == 1, "{j:?}");
        let creating = TaskScan {
            tasks: vec![task("k8s.io", "new", None)],
            errors: vec![],
        };
        let j = judge(std::slice::from_ref(&v), &creating, &BTreeSet::new());
        assert!(j.drop.is_empty(), "{j:?}");
        assert!(j.keep[0].tasks[0].contains("no shim path"), "{j:?}");
    }

    #[test]
    fn a_version_installed_again_is_neither_kept_nor_deleted() {
        let v = version("w", "aa");
        let installed: BTreeSet<String> = [v.dir.clone()].into();
        let j = judge(&[v], &TaskScan::default(), &installed);
        assert_eq!(j, Judgement::default());
    }

    #[test]
    fn retire_records_each_old_version_once() {
        let mut state = NodeState::default();
        let old = vec![("w".to_string(), "aa".to_string())];
        retire(&mut state, &old, 5);
        retire(&mut state, &old, 6);
        assert_eq!(state.retained.len(), 1);
        assert_eq!(state.retained[0].since, 5);
        assert_eq!(state.retained[0].dir, "/opt/shim-agent/shims/w/aa");
    }
}
