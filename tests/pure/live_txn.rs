//! Live-node transactions against a scripted containerd: restart counts, rollback on a failed
//! restart or a failed CRI check, Broken when even the rollback fails, batching, uninstall.
//!
//! The fake containerd is honest about what it models: a restart re-reads the config files
//! under the root (through the real config engine) and from then on serves exactly the
//! handlers whose binaries exist; a restart or the CRI check can be scripted to fail.
//! What only the real systemd and containerd can prove lives in the node-env tests.

use shim_agent::state::{Origin, Phase, ShimState, StateStore};
use shim_agent::txn::Change;

use crate::support::live::*;

#[test]
fn an_install_restarts_once_verifies_and_commits() {
    let w = world();
    let f = fake(&w);
    let report = block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    assert_eq!(report.installed, ["spin"]);
    assert_eq!(*f.restarts.borrow(), 1);
    assert!(f.serving.borrow().contains("spin") && f.serving.borrow().contains("runc"));
    let phases: Vec<Phase> = report.phases.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        phases,
        [
            Phase::Fetched,
            Phase::Staged,
            Phase::Applied,
            Phase::Restarted,
            Phase::Verified,
            Phase::Proven,
            Phase::Committed
        ]
    );
    let st = state(&w);
    assert!(st.journal.is_none());
    assert_eq!(st.shims["spin"].state, ShimState::Installed);
    assert_eq!(st.shims["spin"].origin, Origin::Static);
    assert!(w.root.resolve(&st.shims["spin"].binary).unwrap().exists());

    // nothing changed: no restart
    let report = block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    assert_eq!(report.unchanged, ["spin"]);
    assert_eq!(*f.restarts.borrow(), 1, "no restart when nothing changed");
}

#[test]
fn several_changes_share_one_restart() {
    let w = world();
    let f = fake(&w);
    let report = block(node(&w, &f).apply(vec![
        shim(&w, "spin", "1"),
        shim(&w, "wasmtime", "1"),
        shim(&w, "slight", "1"),
    ]))
    .unwrap();
    assert_eq!(report.installed.len(), 3);
    assert_eq!(report.restarts, 1);
    assert_eq!(*f.restarts.borrow(), 1);
    for h in ["spin", "wasmtime", "slight", "runc"] {
        assert!(f.serving.borrow().contains(h), "{h}");
    }
}

#[test]
fn a_failed_restart_rolls_back_to_the_original_bytes() {
    let w = world();
    let mut f = fake(&w);
    f.fail_restarts = vec![1];
    let e = format!(
        "{:#}",
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err()
    );
    assert!(
        e.contains("job result `failed`")
            && e.contains("[RestartFailed]")
            && e.contains("rolled back"),
        "{e}"
    );
    assert_eq!(config(&w), w.original);
    assert_eq!(
        *f.restarts.borrow(),
        2,
        "the failed restart and the rollback's"
    );
    let st = state(&w);
    assert!(st.journal.is_none() && st.shims.is_empty());
    assert!(
        !w.root
            .resolve("/opt/shim-agent/shims/spin")
            .unwrap()
            .exists(),
        "new binary removed"
    );
}

/// Every artifact directory in the node's store.
fn stored_artifacts(w: &World) -> Vec<String> {
    let dir = w.root.resolve("/var/lib/shim-agent/store/sha256").unwrap();
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => vec![],
    }
}

#[test]
fn a_rolled_back_transaction_leaves_no_artifact_behind_and_a_broken_one_keeps_it() {
    let w = world();
    let mut f = fake(&w);
    f.fail_verifies = vec![1];
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err();
    assert!(state(&w).journal.is_none());
    assert_eq!(stored_artifacts(&w), Vec::<String>::new(), "rolled back");

    // Broken: the journal stays open and recovery may still need what it fetched
    let mut f = fake(&w);
    f.fail_restarts = vec![1, 2];
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err();
    assert_eq!(
        state(&w).journal.as_ref().map(|j| j.phase),
        Some(Phase::Broken)
    );
    assert_eq!(stored_artifacts(&w).len(), 1, "kept while Broken");

    // the next start finishes the rollback, and drops the artifact with it
    let f = fake(&w);
    let n = node(&w, &f);
    block(n.open()).unwrap();
    assert_eq!(stored_artifacts(&w), Vec::<String>::new(), "recovered");

    // a success keeps its artifact
    block(n.apply(vec![shim(&w, "spin", "1")])).unwrap();
    assert_eq!(stored_artifacts(&w).len(), 1);
}

#[test]
fn an_active_containerd_with_broken_cri_is_detected_and_rolled_back() {
    let w = world();
    let mut f = fake(&w);
    f.fail_verifies = vec![1];
    let e = format!(
        "{:#}",
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err()
    );
    assert!(e.contains("CRI plugin failed to load"), "{e}");
    assert_eq!(config(&w), w.original);
    assert!(!f.serving.borrow().contains("spin"));
    assert!(state(&w).journal.is_none());
}

#[test]
fn when_the_rollback_fails_too_the_journal_stays_broken_until_a_later_start_fixes_it() {
    let w = world();
    let mut f = fake(&w);
    f.fail_restarts = vec![1, 2];
    let e = format!(
        "{:#}",
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err()
    );
    assert!(
        e.contains("rollback failed too") && e.contains("Broken"),
        "{e}"
    );
    let st = state(&w);
    assert_eq!(st.journal.as_ref().map(|j| j.phase), Some(Phase::Broken));
    assert_eq!(
        config(&w),
        w.original,
        "files are restored even when containerd does not come back"
    );
    // next start: containerd restarts fine, recovery finishes the rollback
    let f2 = fake(&w);
    let n = node(&w, &f2);
    block(n.open()).unwrap();
    assert!(state(&w).journal.is_none());
    assert_eq!(*f2.restarts.borrow(), 1);
}

#[test]
fn uninstall_restores_the_original_bytes_with_one_restart() {
    let w = world();
    let f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    let bin = state(&w).shims["spin"].binary.clone();
    let report = block(node(&w, &f).apply(vec![Change::Uninstall("spin".into())])).unwrap();
    assert_eq!(report.removed, ["spin"]);
    assert_eq!(config(&w), w.original);
    assert!(!w.root.resolve(&bin).unwrap().exists());
    assert!(!f.serving.borrow().contains("spin"));
    assert_eq!(*f.restarts.borrow(), 2);
    assert!(state(&w).shims.is_empty());
    // uninstalling what is not there changes nothing
    let report = block(node(&w, &f).apply(vec![Change::Uninstall("spin".into())])).unwrap();
    assert_eq!(report.unchanged, ["spin"]);
    assert_eq!(*f.restarts.borrow(), 2);
}

#[test]
fn an_upgrade_switches_binaries_and_removes_the_old_one_after_commit() {
    let w = world();
    let f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    let old = state(&w).shims["spin"].clone();
    block(node(&w, &f).apply(vec![shim(&w, "spin", "2")])).unwrap();
    let new = state(&w).shims["spin"].clone();
    assert_ne!(old.binary, new.binary);
    assert!(w.root.resolve(&new.binary).unwrap().exists());
    assert!(!w.root.resolve(&old.binary).unwrap().exists());
    let cfg = String::from_utf8(config(&w)).unwrap();
    assert!(
        cfg.contains(&new.binary) && !cfg.contains(&old.binary),
        "old and new never mixed"
    );
    // a failed upgrade keeps the old version serving
    let mut f2 = fake(&w);
    f2.fail_verifies = vec![1];
    assert!(block(node(&w, &f2).apply(vec![shim(&w, "spin", "3")])).is_err());
    assert_eq!(state(&w).shims["spin"].binary, new.binary);
    assert!(w.root.resolve(&new.binary).unwrap().exists());
    assert!(f2.serving.borrow().contains("spin"));
}

#[test]
fn a_second_agent_on_the_node_is_refused() {
    let w = world();
    let f = fake(&w);
    let _held = StateStore::open(&w.root.resolve("/var/lib/shim-agent").unwrap()).unwrap();
    let e = format!(
        "{:#}",
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err()
    );
    assert!(e.contains("already running"), "{e}");
    assert_eq!(config(&w), w.original);
}

#[test]
fn a_batch_whose_one_tree_cannot_be_placed_leaves_no_tree_of_the_others() {
    // the trees of a batch are placed side by side; one that fails (its Shim's directory is
    // taken by a file) fails the transaction, and the ones placed beside it go with it
    let w = world();
    let f = fake(&w);
    let shims_dir = w.root.resolve("/opt/shim-agent/shims").unwrap();
    std::fs::create_dir_all(&shims_dir).unwrap();
    std::fs::write(shims_dir.join("s-07"), b"in the way").unwrap();
    let config = config(&w);
    let batch: Vec<Change> = (0..12)
        .map(|i| shim(&w, &format!("s-{i:02}"), "1"))
        .collect();
    let e = block(node(&w, &f).apply(batch)).unwrap_err();
    assert!(format!("{e:#}").contains("s-07"), "{e:#}");
    let left: Vec<String> = std::fs::read_dir(&shims_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left, ["s-07"], "only what was there before");
    assert_eq!(
        crate::support::live::config(&w),
        config,
        "the config as it was"
    );
    assert_eq!(*f.restarts.borrow(), 0);
    assert!(state(&w).journal.is_none());
    assert!(state(&w).shims.is_empty());
}
