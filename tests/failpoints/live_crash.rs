//! Crash at every failpoint of a live transaction, start again, and the node is consistent:
//! the journal is closed, the config names only binaries that exist, old and new are never
//! mixed, and containerd serves what the state says. The journal is reloaded from disk and
//! its contents asserted at the moment of the crash.
//!
//! Runs with `--features failpoints` (scripts/test does); a panic at the failpoint stands for
//! the process being killed: nothing after it runs, no destructor restores anything (the
//! state store and the files are all on disk already).
#![cfg(feature = "failpoints")]

use std::panic::{AssertUnwindSafe, catch_unwind};

use shim_agent::state::{Phase, StateStore};
use shim_agent::txn::Change;

use crate::serial;
use crate::support;
use crate::support::live::*;

const HAPPY_PATH: &[(&str, Option<Phase>)] = &[
    ("txn::planned", Some(Phase::Planned)),
    ("txn::fetched", Some(Phase::Fetched)),
    ("txn::slot-acquired", Some(Phase::SlotAcquired)),
    ("txn::staged", Some(Phase::Staged)),
    ("txn::place_binary", Some(Phase::Staged)),
    ("txn::write_config", Some(Phase::Staged)),
    ("txn::applied", Some(Phase::Applied)),
    ("txn::restarted", Some(Phase::Restarted)),
    ("txn::verified", Some(Phase::Verified)),
    ("txn::proven", Some(Phase::Proven)),
    ("txn::committed", Some(Phase::Committed)),
    ("state::save", None),
];

const ROLLBACK_PATH: &[(&str, Option<Phase>)] = &[
    ("txn::rolling-back", Some(Phase::RollingBack)),
    ("txn::restored", Some(Phase::RollingBack)),
    ("txn::rolled-back", Some(Phase::RolledBack)),
];

/// The invariants after recovery, whatever happened before.
fn assert_consistent(w: &World, f: &FakeContainerd, what: &str) {
    let st = state(w);
    assert!(
        st.journal.is_none(),
        "{what}: journal still open: {:?}",
        st.journal
    );
    let cfg = String::from_utf8(config(w)).unwrap();
    for line in cfg.lines() {
        if let Some(p) = support::live::named_binary(line) {
            let p = p.trim_end_matches('"');
            assert!(
                w.root.resolve(p).unwrap().exists(),
                "{what}: config names missing binary {p}"
            );
        }
    }
    match st.shims.get("spin") {
        Some(rec) => {
            assert!(
                cfg.contains(&rec.binary),
                "{what}: state and config disagree"
            );
            assert_eq!(
                cfg.matches("/opt/shim-agent/shims/spin/").count(),
                1,
                "{what}: old and new mixed:\n{cfg}"
            );
            assert!(
                f.serving.borrow().contains("spin"),
                "{what}: containerd does not serve spin"
            );
        }
        None => {
            assert_eq!(
                config(w),
                w.original,
                "{what}: not installed but config changed"
            );
            assert!(
                !f.serving.borrow().contains("spin"),
                "{what}: containerd serves a handler the state does not know"
            );
        }
    }
    let shims_dir = w.root.resolve("/opt/shim-agent/shims/spin").unwrap();
    if let Ok(rd) = std::fs::read_dir(&shims_dir) {
        let n = rd.count();
        assert!(n <= 1, "{what}: {n} versions of the binary left behind");
    }
}

/// Crash at `fp` during `change`, check the journal on disk, then recover and check the node.
fn crash_and_recover(
    w: &World,
    f: &FakeContainerd,
    change: Change,
    fp: &str,
    expect_phase: Option<Phase>,
) {
    let scenario = fail::FailScenario::setup();
    fail::cfg(
        fp,
        if fp == "state::save" {
            "1*off->return"
        } else {
            "panic"
        },
    )
    .unwrap();
    let result = catch_unwind(AssertUnwindSafe(|| block(node(w, f).apply(vec![change]))));
    fail::cfg(fp, "off").unwrap();
    scenario.teardown();
    let crashed = match &result {
        Err(_) => true,
        Ok(Err(_)) => false,
        Ok(Ok(r)) => panic!("{fp}: the transaction went through the failpoint: {r:?}"),
    };
    if crashed {
        // Reload the journal from disk: it records the phase the crash interrupted.
        let st = shim_agent::cli::status::read_state(&w.root, &w.settings).unwrap();
        let phase = st.journal.as_ref().map(|j| j.phase);
        if fp == "txn::committed" {
            assert_eq!(phase, Some(Phase::Committed), "{fp}");
        } else {
            assert_eq!(phase, expect_phase, "{fp}: journal on disk");
        }
        if let Some(j) = &st.journal {
            assert!(
                !j.backups.is_empty() || phase <= Some(Phase::SlotAcquired),
                "{fp}: no backups recorded"
            );
        }
    }
    // "start again": a new agent opens the store and recovers from the journal alone
    block(node(w, f).open()).unwrap();
    assert_consistent(w, f, fp);
}

#[test]
fn a_crash_at_any_point_of_an_install_leaves_a_consistent_node() {
    let _serial = serial();
    for (fp, phase) in HAPPY_PATH {
        let w = world();
        let f = fake(&w);
        crash_and_recover(&w, &f, shim(&w, "spin", "1"), fp, *phase);
    }
}

#[test]
fn a_crash_at_any_point_of_an_upgrade_leaves_one_version_serving() {
    let _serial = serial();
    for (fp, phase) in HAPPY_PATH {
        let w = world();
        let f = fake(&w);
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
        crash_and_recover(&w, &f, shim(&w, "spin", "2"), fp, *phase);
        assert!(
            state(&w).shims.contains_key("spin"),
            "{fp}: upgrade lost the shim"
        );
    }
}

#[test]
fn a_crash_at_any_point_of_an_uninstall_leaves_a_consistent_node() {
    let _serial = serial();
    for (fp, phase) in HAPPY_PATH
        .iter()
        .filter(|(fp, _)| !["txn::place_binary"].contains(fp))
    {
        let w = world();
        let f = fake(&w);
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
        crash_and_recover(&w, &f, Change::Uninstall("spin".into()), fp, *phase);
    }
}

#[test]
fn a_crash_during_a_rollback_is_finished_on_the_next_start() {
    let _serial = serial();
    for (fp, phase) in ROLLBACK_PATH {
        let w = world();
        let mut f = fake(&w);
        f.fail_verifies = vec![1];
        crash_and_recover(&w, &f, shim(&w, "spin", "1"), fp, *phase);
        assert!(state(&w).shims.is_empty(), "{fp}");
        assert_eq!(config(&w), w.original, "{fp}");
    }
}

#[test]
fn a_crash_before_the_runtime_check_whose_check_then_fails_rolls_back_on_the_next_start() {
    let _serial = serial();
    let w = world();
    let mut f = fake(&w);
    // the agent stops after containerd served the new handler, before its check ran
    let scenario = fail::FailScenario::setup();
    fail::cfg("txn::verified", "panic").unwrap();
    let crashed = catch_unwind(AssertUnwindSafe(|| {
        block(node(&w, &f).apply(vec![shim(&w, "spin", "1")]))
    }));
    fail::cfg("txn::verified", "off").unwrap();
    scenario.teardown();
    assert!(crashed.is_err(), "the failpoint stopped the transaction");
    assert_eq!(state(&w).journal.map(|j| j.phase), Some(Phase::Verified));
    assert!(
        f.proved.borrow().is_empty(),
        "nothing was proven before the crash"
    );
    // at the next start the runtime cannot run a sandbox: the recovery proves it, and rolls
    // the journal back instead of committing a shim that does not work
    f.fail_checks = vec!["spin".into()];
    let recovered = block(node(&w, &f).open());
    assert!(recovered.is_err(), "the recovery reports the rollback");
    assert_eq!(f.proved.borrow().len(), 1, "proven at the next start");
    assert!(*f.sweeps.borrow() >= 1, "leftover checks swept first");
    let st = state(&w);
    assert!(st.journal.is_none() && st.shims.is_empty(), "{st:?}");
    assert_eq!(config(&w), w.original, "the config bytes are back");
    assert!(!f.serving.borrow().contains("spin"));
}

#[test]
fn the_store_lock_is_released_by_a_crashed_agent() {
    let _serial = serial();
    let w = world();
    let f = fake(&w);
    crash_and_recover(
        &w,
        &f,
        shim(&w, "spin", "1"),
        "txn::applied",
        Some(Phase::Applied),
    );
    StateStore::open(&w.root.resolve("/var/lib/shim-agent").unwrap()).unwrap();
}
