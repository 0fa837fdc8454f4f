//! The rollout gate in the transaction engine: a slot of every Shim before the host changes,
//! a renewal right before the restart (or no restart at all), release on commit, and a
//! failure kept on the slot.

use std::cell::RefCell;

use shim_agent::state::Phase;
use shim_agent::txn::TxnError;
use shim_agent::txn::error::GateError;
use shim_agent::txn::{Change, Gate};

use crate::support::live::*;

#[derive(Default)]
struct FakeGate {
    calls: RefCell<Vec<String>>,
    /// The error `acquire` returns, if any.
    refuse_acquire: Option<GateError>,
    refuse_renew: bool,
    /// The renewal never answers (the agent is stopped while it waits).
    hang_renew: bool,
}

impl Gate for FakeGate {
    async fn acquire(&self, shims: &[String]) -> Result<(), GateError> {
        self.calls
            .borrow_mut()
            .push(format!("acquire {}", shims.join(",")));
        if let Some(e) = &self.refuse_acquire {
            return Err(e.clone());
        }
        Ok(())
    }
    async fn renew(&self) -> Result<(), GateError> {
        self.calls.borrow_mut().push("renew".into());
        if self.hang_renew {
            std::future::pending::<()>().await;
        }
        if self.refuse_renew {
            return Err(GateError::SlotLost {
                slot: "spin-0".into(),
                me: "node-a".into(),
            });
        }
        Ok(())
    }
    async fn release(&self) {
        self.calls.borrow_mut().push("release".into());
    }
    async fn failed(&self, reason: &str) {
        self.calls.borrow_mut().push(format!("failed: {reason}"));
    }
}

fn apply(
    w: &World,
    f: &FakeContainerd,
    g: &FakeGate,
    changes: Vec<Change>,
) -> Result<shim_agent::txn::Report, TxnError> {
    block(async {
        let n = node(w, f);
        let (store, mut state) = n.open().await.map_err(TxnError::from_error)?;
        n.apply_gated(&store, &mut state, changes, false, g).await
    })
}

#[test]
fn a_batch_takes_a_slot_of_each_shim_in_order_renews_before_the_restart_and_releases() {
    let w = world();
    let f = fake(&w);
    let g = FakeGate::default();
    apply(
        &w,
        &f,
        &g,
        vec![shim(&w, "wasmtime", "1"), shim(&w, "spin", "1")],
    )
    .unwrap();
    assert_eq!(
        *g.calls.borrow(),
        ["acquire spin,wasmtime", "renew", "release"]
    );
    assert_eq!(*f.restarts.borrow(), 1);

    // nothing to restart: no slot asked for
    let g = FakeGate::default();
    let r = apply(&w, &f, &g, vec![shim(&w, "spin", "1")]).unwrap();
    assert_eq!(r.unchanged, ["spin"]);
    assert!(g.calls.borrow().is_empty(), "{:?}", g.calls.borrow());
}

#[test]
fn without_a_slot_nothing_on_the_host_changes() {
    let w = world();
    let f = fake(&w);
    let g = FakeGate {
        refuse_acquire: Some(GateError::SlotRefused("the rollout is halted".into())),
        ..Default::default()
    };
    let e = format!(
        "{:#}",
        apply(&w, &f, &g, vec![shim(&w, "spin", "1")]).unwrap_err()
    );
    assert!(e.contains("no rollout slot") && e.contains("halted"), "{e}");
    assert_eq!(config(&w), w.original);
    assert_eq!(*f.restarts.borrow(), 0);
    assert!(state(&w).journal.is_none() && state(&w).shims.is_empty());
}

#[test]
fn a_failed_preflight_never_asks_for_a_slot() {
    let w = world();
    let f = fake(&w);
    let g = FakeGate::default();
    // /bin/true needs its interpreter and libc.so.6, which the test's root does not have
    let e = apply(
        &w,
        &f,
        &g,
        vec![crate::runtime_check::shim_with_binary(
            &w,
            "spin",
            std::fs::read("/bin/true").unwrap(),
        )],
    )
    .unwrap_err();
    assert_eq!(e.reason(), "MissingLibraries", "{e:#}");
    assert!(
        g.calls.borrow().is_empty(),
        "no acquire, no renewal, no failure marked on a slot: {:?}",
        g.calls.borrow()
    );
    assert_eq!(*f.restarts.borrow(), 0, "containerd was not restarted");
    assert_eq!(config(&w), w.original);
    assert!(state(&w).journal.is_none() && state(&w).shims.is_empty());
}

#[test]
fn a_renewal_that_fails_means_no_restart_and_the_files_go_back() {
    let w = world();
    let f = fake(&w);
    let g = FakeGate {
        refuse_renew: true,
        ..Default::default()
    };
    let e = format!(
        "{:#}",
        apply(&w, &f, &g, vec![shim(&w, "spin", "1")]).unwrap_err()
    );
    assert!(
        e.contains("could not be renewed") && e.contains("without a restart"),
        "{e}"
    );
    assert_eq!(
        *f.restarts.borrow(),
        0,
        "no restart without a fresh renewal"
    );
    assert_eq!(config(&w), w.original);
    let st = state(&w);
    assert!(st.journal.is_none() && st.shims.is_empty());
    assert!(
        !w.root
            .resolve("/opt/shim-agent/shims/spin")
            .unwrap()
            .exists()
    );
    let calls = g.calls.borrow();
    assert_eq!(calls[..2], ["acquire spin", "renew"]);
    assert!(
        calls[2].starts_with("failed: ") && calls[2].contains("renewed"),
        "{calls:?}"
    );
}

#[test]
fn a_failed_transaction_keeps_its_slot_marked_with_the_reason() {
    let w = world();
    let mut f = fake(&w);
    f.fail_verifies = vec![1];
    let g = FakeGate::default();
    apply(&w, &f, &g, vec![shim(&w, "spin", "1")]).unwrap_err();
    let calls = g.calls.borrow();
    assert_eq!(calls[..2], ["acquire spin", "renew"]);
    assert!(
        calls[2].starts_with("failed: ") && calls[2].contains("CRI plugin failed to load"),
        "{calls:?}"
    );
    assert_eq!(calls.len(), 3, "never released");
}

/// The typed outcome of a failed transaction, as callers read it (never from its text).
fn outcome(t: &TxnError) -> (&'static str, Option<Phase>, Option<&'static str>) {
    (t.reason(), t.phase, t.cause.as_ref().map(|c| c.reason()))
}

#[test]
fn a_failure_says_its_reason_the_phase_it_reached_and_the_ports_typed_cause() {
    use Phase::*;
    let w = world();
    let no_slot = FakeGate {
        refuse_acquire: Some(GateError::SlotUnavailable("HTTP 429".into())),
        ..Default::default()
    };
    let e = apply(&w, &fake(&w), &no_slot, vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(
        outcome(&e),
        ("NoSlot", Some(Fetched), Some("SlotUnavailable"))
    );
    assert!(
        e.only_waits(),
        "the API server was away: the change only waits"
    );

    let w = world();
    let refused = FakeGate {
        refuse_acquire: Some(GateError::SlotRefused("HTTP 403".into())),
        ..Default::default()
    };
    let e = apply(&w, &fake(&w), &refused, vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(outcome(&e), ("NoSlot", Some(Fetched), Some("SlotRefused")));
    assert!(!e.only_waits(), "a refusal is a failure");

    let w = world();
    let lost = FakeGate {
        refuse_renew: true,
        ..Default::default()
    };
    let e = apply(&w, &fake(&w), &lost, vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(outcome(&e), ("RolledBack", Some(Applied), Some("SlotLost")));

    let w = world();
    let mut f = fake(&w);
    f.fail_restarts = vec![1];
    let e = apply(&w, &f, &FakeGate::default(), vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(
        outcome(&e),
        ("RolledBack", Some(Applied), Some("RestartFailed"))
    );

    let w = world();
    let mut f = fake(&w);
    f.fail_verifies = vec![1];
    let e = apply(&w, &f, &FakeGate::default(), vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(
        outcome(&e),
        ("RolledBack", Some(Restarted), Some("CriUnavailable"))
    );

    // a rollback that fails too: Broken, still naming what failed first
    let w = world();
    let mut f = fake(&w);
    f.fail_verifies = vec![1, 2];
    let e = apply(&w, &f, &FakeGate::default(), vec![shim(&w, "spin", "1")]).unwrap_err();
    assert_eq!(
        outcome(&e),
        ("Broken", Some(Restarted), Some("CriUnavailable"))
    );
}

/// A journal left at Applied (config written, containerd not yet restarted): the agent was
/// stopped while it renewed its slot.
/// Recover with a gate whose renewal fails: the error says nothing was restarted.
fn recovery_without_a_renewal(w: &World, f: &FakeContainerd) {
    let g = FakeGate {
        refuse_renew: true,
        ..Default::default()
    };
    let e = block(async {
        let n = node(w, f);
        let (store, mut state) = n.open_unrecovered().unwrap();
        n.recover_gated(&store, &mut state, &g).await.unwrap_err()
    });
    let e = format!("{e:#}");
    assert!(
        e.contains("rollout slot could not be renewed") && e.contains("nothing was restarted"),
        "{e}"
    );
}

fn interrupted_at_applied(w: &World, f: &FakeContainerd) {
    let g = FakeGate {
        hang_renew: true,
        ..Default::default()
    };
    block(async {
        let n = node(w, f);
        let (store, mut state) = n.open().await.unwrap();
        let run = n.apply_gated(&store, &mut state, vec![shim(w, "spin", "1")], false, &g);
        let ended = tokio::time::timeout(std::time::Duration::from_millis(300), run).await;
        assert!(
            ended.is_err(),
            "the transaction waits for its renewal: {:?}",
            ended.map(|r| r.map_err(|e| e.message))
        );
    });
    let j = state(w).journal.expect("an open journal");
    assert_eq!(j.phase, shim_agent::state::Phase::Applied);
    assert_eq!(*f.restarts.borrow(), 0);
}

#[test]
fn recovery_restarts_containerd_only_after_renewing_the_slot() {
    let w = world();
    let f = fake(&w);
    interrupted_at_applied(&w, &f);

    // at the next start the renewal fails: nothing restarts, the journal stays for later
    recovery_without_a_renewal(&w, &f);
    assert_eq!(
        *f.restarts.borrow(),
        0,
        "no restart without a fresh renewal"
    );
    assert_eq!(
        state(&w).journal.map(|j| j.phase),
        Some(shim_agent::state::Phase::Applied)
    );

    // with its slot renewed, recovery rolls forward: one restart, then the slot goes back
    let g = FakeGate::default();
    block(async {
        let n = node(&w, &f);
        let (store, mut state) = n.open_unrecovered().unwrap();
        n.recover_gated(&store, &mut state, &g).await.unwrap();
    });
    assert_eq!(*g.calls.borrow(), ["acquire spin", "renew", "release"]);
    assert_eq!(*f.restarts.borrow(), 1);
    let st = state(&w);
    assert!(st.journal.is_none());
    assert!(st.shims.contains_key("spin"));
}

/// As [`interrupted_at_applied`], then stopped once containerd restarted with the new files
/// and the journal said so (before the check).
fn interrupted_at_restarted(w: &World, f: &FakeContainerd) {
    interrupted_at_applied(w, f);
    *f.restarts.borrow_mut() += 1;
    f.reread_config();
    let n = node(w, f);
    let (store, mut state) = n.open_unrecovered().unwrap();
    if let Some(j) = state.journal.as_mut() {
        j.phase = Phase::Restarted;
    }
    store.save(&state).unwrap();
}

#[test]
fn a_recovered_restart_is_checked_without_a_slot_and_committed() {
    let w = world();
    let f = fake(&w);
    interrupted_at_restarted(&w, &f);
    let g = FakeGate::default();
    block(async {
        let n = node(&w, &f);
        let (store, mut state) = n.open_unrecovered().unwrap();
        n.recover_gated(&store, &mut state, &g).await.unwrap();
    });
    assert!(g.calls.borrow().is_empty(), "{:?}", g.calls.borrow());
    assert_eq!(
        *f.restarts.borrow(),
        1,
        "no restart beyond the one recorded"
    );
    let st = state(&w);
    assert!(st.journal.is_none());
    assert!(st.shims.contains_key("spin"));
}

#[test]
fn a_recovered_restart_whose_check_fails_takes_its_slot_before_the_rollback_and_marks_it() {
    let w = world();
    let f = FakeContainerd {
        fail_verifies: vec![1],
        ..fake(&w)
    };
    interrupted_at_restarted(&w, &f);
    let g = FakeGate::default();
    let e = block(async {
        let n = node(&w, &f);
        let (store, mut state) = n.open_unrecovered().unwrap();
        n.recover_gated(&store, &mut state, &g).await.unwrap_err()
    });
    assert_eq!(outcome(&e).0, "RolledBack", "{e:#}");
    let calls = g.calls.borrow();
    assert_eq!(calls[..2], ["acquire spin", "renew"], "{calls:?}");
    assert_eq!(calls.len(), 3, "{calls:?}");
    assert!(
        calls[2].starts_with("failed: ") && calls[2].contains("CRI"),
        "the slot is marked with the failure: {calls:?}"
    );
    assert_eq!(*f.restarts.borrow(), 2, "the rollback's restart");
    let st = state(&w);
    assert!(st.journal.is_none());
    assert!(!st.shims.contains_key("spin"));
}

#[test]
fn a_recovered_restart_whose_check_fails_without_a_slot_restarts_nothing_and_stays_open() {
    let w = world();
    let f = FakeContainerd {
        fail_verifies: vec![1],
        ..fake(&w)
    };
    interrupted_at_restarted(&w, &f);
    recovery_without_a_renewal(&w, &f);
    assert_eq!(
        *f.restarts.borrow(),
        1,
        "no restart without a fresh renewal"
    );
    assert_eq!(state(&w).journal.map(|j| j.phase), Some(Phase::Restarted));
}

#[test]
fn the_static_daemon_goes_on_after_a_recovery_that_rolled_back() {
    let w = world();
    let f = FakeContainerd {
        fail_verifies: vec![1],
        ..fake(&w)
    };
    interrupted_at_restarted(&w, &f);
    let (_stop, rx) = tokio::sync::watch::channel(false);
    let ended = block(async {
        let n = node(&w, &f);
        tokio::time::timeout(
            std::time::Duration::from_secs(2),
            shim_agent::daemon::run(&n, rx),
        )
        .await
    });
    assert!(ended.is_err(), "the daemon still runs: {ended:?}");
    assert_eq!(*f.restarts.borrow(), 2, "the rollback's restart");
    let st = state(&w);
    assert!(st.journal.is_none());
    assert!(!st.shims.contains_key("spin"));
}

#[test]
fn a_backup_that_cannot_be_staged_aborts_through_the_state_machine_with_nothing_changed() {
    let w = world();
    let f = fake(&w);
    let g = FakeGate::default();
    // a file where the journal's backups directory goes: staging the backups fails
    let state_dir = w.root.resolve(&w.settings.paths.state_dir).unwrap();
    std::fs::create_dir_all(&state_dir).unwrap();
    std::fs::write(state_dir.join("backups"), b"not a directory").unwrap();
    let e = format!(
        "{:#}",
        apply(&w, &f, &g, vec![shim(&w, "spin", "1")]).unwrap_err()
    );
    assert!(e.contains("cannot create") && e.contains("backups"), "{e}");
    // the slot was taken before staging; the failure is kept on it, no renewal, no restart
    let calls = g.calls.borrow();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], "acquire spin");
    assert!(calls[1].starts_with("failed: cannot create"), "{calls:?}");
    assert_eq!(config(&w), w.original);
    assert_eq!(*f.restarts.borrow(), 0);
    // the machine's abort closed the journal; no Shim was recorded
    assert!(state(&w).journal.is_none() && state(&w).shims.is_empty());
}
