//! A crash in the middle of an upgrade never loses the record of what is retained: the agent
//! is killed (a panic at a failpoint) while upgrading `spin` from version 1 to version 2 and a
//! containerd task runs through version 1 (a task bundle in containerd's task directory under
//! the test's root, naming version 1's binary, as containerd records one). After the next
//! start version 1 is on disk and recorded (retained when version 2 replaced it, installed
//! when the transaction was rolled back), a version the node does not use is on disk only
//! while a task runs through it, and once the tasks are gone the next collection removes what
//! is no longer installed.
//!
//! The state is reloaded from disk at the moment of the crash: a version that leaves
//! `state.shims` is in `state.retained` in the same write (the commit's, or the rollback's).
#![cfg(feature = "failpoints")]

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use shim_agent::node::tasks::{SHIM_PATH_FILE, TASK_DIR};
use shim_agent::state::{InstalledShim, NodeState, Phase};
use shim_agent::txn::Change;

use crate::serial;
use crate::support::live::*;

/// Where the engine's default containerd profile keeps its task bundles (host path).
const STATE_DIR: &str = "/run/containerd";

/// A task as containerd records it, started through the shim binary at `binary`: its bundle
/// in namespace `k8s.io`, whose `shim-binary-path` names that binary. Returns the bundle (the
/// task ends when it is removed).
fn task_through(w: &World, id: &str, binary: &str) -> PathBuf {
    let bundle = w
        .root
        .resolve(Path::new(STATE_DIR).join(TASK_DIR).join("k8s.io").join(id))
        .unwrap();
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join(SHIM_PATH_FILE), format!("{binary}\n")).unwrap();
    bundle
}

/// The host directory of an installed version (its binary's directory: the tree's root).
fn dir_of(rec: &InstalledShim) -> String {
    shim_agent::artifact::version_dir(&rec.name, &rec.artifact_sha256)
        .display()
        .to_string()
}

fn on_disk(w: &World, host_path: &str) -> bool {
    w.root.resolve(host_path).unwrap().exists()
}

fn retained_digests(st: &NodeState) -> Vec<&str> {
    st.retained.iter().map(|r| r.digest.as_str()).collect()
}

/// Run `change` and kill the agent at failpoint `fp`; the state as it is on disk then.
fn crash_at(w: &World, f: &FakeContainerd, change: Change, fp: &str) -> NodeState {
    let scenario = fail::FailScenario::setup();
    fail::cfg(fp, "panic").unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| block(node(w, f).apply(vec![change]))));
    fail::cfg(fp, "off").unwrap();
    scenario.teardown();
    match result {
        Err(_) => {}
        Ok(r) => panic!("{fp}: the transaction did not reach the failpoint: {r:?}"),
    }
    state(w)
}

/// The next start: a new agent opens the store and recovers from the journal alone.
fn start_again(w: &World, f: &FakeContainerd) -> NodeState {
    block(node(w, f).open()).unwrap();
    state(w)
}

/// One collection of retained versions, as the agent runs after a transaction or on its timer.
fn collect(w: &World, f: &FakeContainerd) -> NodeState {
    let n = node(w, f);
    let (store, mut st) = n.open_unrecovered().unwrap();
    n.collect_retained(&store, &mut st).unwrap();
    state(w)
}

/// `spin` version 1 installed, and a task running through it.
fn version_1_with_a_task(w: &World, f: &FakeContainerd) -> (InstalledShim, PathBuf) {
    block(node(w, f).apply(vec![shim(w, "spin", "1")])).unwrap();
    let v1 = state(w).shims["spin"].clone();
    let task = task_through(w, "pod-on-v1", &v1.binary);
    (v1, task)
}

#[test]
fn an_upgrade_killed_after_v2_is_applied_or_committed_keeps_v1_recorded_as_retained_while_its_task_runs_and_the_next_collection_after_the_task_ends_removes_it()
 {
    let _serial = serial();
    for fp in [
        "txn::applied",
        "txn::restarted",
        "txn::verified",
        "txn::committed",
    ] {
        let w = world();
        let f = fake(&w);
        let (v1, task) = version_1_with_a_task(&w, &f);

        let at_crash = crash_at(&w, &f, shim(&w, "spin", "2"), fp);
        if fp == "txn::committed" {
            // the commit's one write: v2 installed and v1 retained, the journal still open
            let phase = at_crash.journal.as_ref().map(|j| j.phase);
            assert_eq!(phase, Some(Phase::Committed), "{fp}");
            assert_ne!(
                at_crash.shims["spin"].artifact_sha256, v1.artifact_sha256,
                "{fp}: v2 committed"
            );
            assert_eq!(
                retained_digests(&at_crash),
                [v1.artifact_sha256.as_str()],
                "{fp}: v1 is recorded as retained in the commit's write"
            );
        }
        assert!(on_disk(&w, &v1.binary), "{fp}: v1 deleted before the crash");

        // the next start finishes the upgrade; v1 stays for its task
        let st = start_again(&w, &f);
        assert!(st.journal.is_none(), "{fp}: journal still open");
        let v2 = st.shims["spin"].clone();
        assert_ne!(v2.artifact_sha256, v1.artifact_sha256, "{fp}: v2 installed");
        assert_eq!(
            retained_digests(&st),
            [v1.artifact_sha256.as_str()],
            "{fp}: v1 retained"
        );
        assert_eq!(st.retained[0].dir, dir_of(&v1), "{fp}");
        assert_eq!(st.retained[0].tasks, ["k8s.io/pod-on-v1"], "{fp}");
        assert!(on_disk(&w, &v1.binary), "{fp}: v1 gone while its task runs");
        assert!(on_disk(&w, &v2.binary), "{fp}: v2 missing");
        let cfg = String::from_utf8(config(&w)).unwrap();
        assert!(cfg.contains(&v2.binary), "{fp}: config does not name v2");
        assert!(!cfg.contains(&dir_of(&v1)), "{fp}: config still names v1");

        // a collection while the task runs keeps v1; once it ended, the next one removes it
        let st = collect(&w, &f);
        assert_eq!(retained_digests(&st), [v1.artifact_sha256.as_str()], "{fp}");
        assert!(on_disk(&w, &v1.binary), "{fp}");
        std::fs::remove_dir_all(&task).unwrap();
        let st = collect(&w, &f);
        assert!(st.retained.is_empty(), "{fp}: {:?}", st.retained);
        assert!(!on_disk(&w, &dir_of(&v1)), "{fp}: v1 left behind");
        assert!(on_disk(&w, &v2.binary), "{fp}: v2 collected");
        assert_eq!(st.shims["spin"], v2, "{fp}");
    }
}

/// Kill the upgrade from v1 (with a task) to v2 at `fp` (with v2 failing its check first when
/// `fail_verify`), start again, and check: v1 installed again with its files, v2's files on
/// disk and retained only while a task runs through it (when `v2_task`, one started while
/// containerd served v2), and once the tasks end the next collection removes v2, never v1.
fn roll_back_after_a_crash(fp: &str, fail_verify: bool, v2_task: bool) {
    let what = format!("{fp} (a task on v2: {v2_task})");
    let w = world();
    let mut f = fake(&w);
    let (v1, v1_task) = version_1_with_a_task(&w, &f);
    if fail_verify {
        f.fail_verifies = vec![*f.verifies.borrow() + 1];
    }

    let at_crash = crash_at(&w, &f, shim(&w, "spin", "2"), fp);
    let Some(j) = at_crash.journal.as_ref() else {
        panic!("{what}: no journal at the crash")
    };
    let v2 = j.pending[0].clone();
    assert_ne!(v2.artifact_sha256, v1.artifact_sha256, "{what}");
    assert_eq!(at_crash.shims["spin"], v1, "{what}: v1 still the record");
    if fp == "txn::rolled-back" {
        // the rollback's one write: v2 retained as the journal reaches RolledBack
        assert_eq!(j.phase, Phase::RolledBack, "{what}");
        assert_eq!(
            retained_digests(&at_crash),
            [v2.artifact_sha256.as_str()],
            "{what}: v2 is recorded as retained in the rollback's write"
        );
    }
    // a pod that started through v2 while containerd served it
    let v2_bundle = v2_task.then(|| task_through(&w, "pod-on-v2", &v2.binary));

    // the next start rolls back to v1
    let st = start_again(&w, &f);
    assert!(st.journal.is_none(), "{what}: journal still open");
    assert_eq!(st.shims["spin"], v1, "{what}: v1 installed again");
    assert!(on_disk(&w, &v1.binary), "{what}: v1 lost");
    let cfg = String::from_utf8(config(&w)).unwrap();
    assert!(cfg.contains(&v1.binary), "{what}: config does not name v1");
    assert!(!cfg.contains(&dir_of(&v2)), "{what}: config still names v2");
    if v2_task {
        assert_eq!(
            retained_digests(&st),
            [v2.artifact_sha256.as_str()],
            "{what}: v2 retained for its task"
        );
        assert_eq!(st.retained[0].tasks, ["k8s.io/pod-on-v2"], "{what}");
        assert!(
            on_disk(&w, &v2.binary),
            "{what}: v2's binary gone while a task runs through it"
        );
    } else {
        assert!(st.retained.is_empty(), "{what}: {:?}", st.retained);
        assert!(!on_disk(&w, &dir_of(&v2)), "{what}: v2's files left behind");
    }

    // the tasks end: the next collection removes v2, and never the installed v1
    std::fs::remove_dir_all(&v1_task).unwrap();
    if let Some(b) = &v2_bundle {
        std::fs::remove_dir_all(b).unwrap();
    }
    let st = collect(&w, &f);
    assert!(st.retained.is_empty(), "{what}: {:?}", st.retained);
    assert!(!on_disk(&w, &dir_of(&v2)), "{what}: v2 left behind");
    assert_eq!(st.shims["spin"], v1, "{what}");
    assert!(
        on_disk(&w, &v1.binary),
        "{what}: the installed v1 collected"
    );
}

#[test]
fn an_upgrade_killed_in_the_risky_window_rolls_back_to_v1_with_its_files_and_record_and_leaves_nothing_of_v2_behind()
 {
    let _serial = serial();
    // the files are being staged and placed: containerd never ran v2
    for fp in ["txn::staged", "txn::place_binary", "txn::write_config"] {
        roll_back_after_a_crash(fp, false, false);
    }
    // containerd ran v2, which failed its check; the agent dies rolling back
    for fp in ["txn::rolling-back", "txn::restored", "txn::rolled-back"] {
        roll_back_after_a_crash(fp, true, false);
    }
}

#[test]
fn an_upgrade_killed_while_rolling_back_keeps_v2_whole_while_a_task_started_through_it_runs() {
    let _serial = serial();
    for fp in ["txn::rolling-back", "txn::restored", "txn::rolled-back"] {
        roll_back_after_a_crash(fp, true, true);
    }
}
