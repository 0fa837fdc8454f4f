//! The node transaction as a pure state machine (docs/design.md §3): phases, the events that
//! move between them, and what to do on start with a journal left by a crash.
//!
//! ```text
//! Planned → Fetched → SlotAcquired → Staged → Applied → Restarted → Verified → Proven → Committed
//!                                       │         └─────────┴──────────┴─────────┴──→ RollingBack → RolledBack
//!                                       └─ (failure: abort, nothing applied)                └──→ Broken
//! ```
//!
//! # Guarantees
//! - Every transition names the phases it may start from; anything else is a
//!   [`TransitionError`], never a panic.
//! - The journal's phase is the last step that *completed*; the side effect of the next step
//!   may or may not have happened when a crash interrupts it. [`recovery_for`] therefore
//!   picks an action that is safe whether or not it did: restoring backups and restarting
//!   are idempotent.
//!
//! # Recovery table
//! | phase at start | action |
//! |---|---|
//! | Planned, Fetched, SlotAcquired | discard: nothing on the host changed |
//! | Staged | roll back without restart: apply may have begun, containerd was not restarted |
//! | Applied | roll forward: restart, verify, commit (or roll back if that fails) |
//! | Restarted | roll forward: verify, prove, commit (or roll back) |
//! | Verified | roll forward: prove (the check's leftovers swept first), commit (or roll back) |
//! | Proven | roll forward: commit |
//! | Committed, RolledBack | close the journal |
//! | RollingBack | finish the roll back (restore, restart, verify) |
//! | Broken | retry the roll back; stays Broken if containerd still does not come back |
//!
//! In an image root nothing can prove a new state works (no containerd runs), so every phase
//! from Applied on is rolled back without a restart instead.

use thiserror::Error;

use crate::state::Phase;

/// What happened, as reported by the shell that performed the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The artifact is verified and in the store.
    Fetched,
    /// A rollout slot is held (or none is needed).
    SlotAcquired,
    /// Backups of every file to touch are on disk.
    Staged,
    /// Binaries and config are in place.
    Applied,
    /// containerd was restarted and its job finished `done`.
    Restarted,
    /// containerd serves every handler of the transaction through CRI.
    Verified,
    /// Every new handler ran a pod sandbox through CRI, and its check container where its
    /// Shim names one.
    Proven,
    /// The new shim records, and the versions they replace (retained while tasks run through
    /// them), are written to the state. Giving the rollout slot back and labelling the Node
    /// come after the transaction, outside it.
    Committed,
    /// A step failed; `reason` says which and why.
    Failed { reason: String },
    /// Backups restored, containerd restarted and healthy again.
    RolledBack,
    /// Even the rollback left containerd unhealthy.
    RollbackFailed { reason: String },
}

/// The result of a transition: the new phase, or that the transaction ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Journal this phase, then do its step.
    Phase(Phase),
    /// Close the journal: the failure came before anything on the host changed.
    Abort { reason: String },
}

/// An event that is not allowed in the current phase.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("transaction cannot go from phase {from:?} on event {event}")]
pub struct TransitionError {
    pub from: Phase,
    pub event: String,
}

fn event_name(e: &Event) -> String {
    match e {
        Event::Failed { .. } => "Failed".into(),
        Event::RollbackFailed { .. } => "RollbackFailed".into(),
        other => format!("{other:?}"),
    }
}

/// The one transition function.
pub fn next(from: Phase, event: &Event) -> Result<Next, TransitionError> {
    use Phase::*;
    let to = match (from, event) {
        (Planned, Event::Fetched) => Fetched,
        (Fetched, Event::SlotAcquired) => SlotAcquired,
        (SlotAcquired, Event::Staged) => Staged,
        (Staged, Event::Applied) => Applied,
        (Applied, Event::Restarted) => Restarted,
        (Restarted, Event::Verified) => Verified,
        (Verified, Event::Proven) => Proven,
        (Proven, Event::Committed) => Committed,
        // Before anything is applied a failure just ends the transaction.
        (Planned | Fetched | SlotAcquired, Event::Failed { reason }) => {
            return Ok(Next::Abort {
                reason: reason.clone(),
            });
        }
        // From Staged on, files may have changed: put them back.
        (Staged | Applied | Restarted | Verified | Proven, Event::Failed { .. }) => RollingBack,
        (RollingBack | Broken, Event::RolledBack) => RolledBack,
        (RollingBack | Broken, Event::RollbackFailed { .. }) => Broken,
        _ => {
            return Err(TransitionError {
                from,
                event: event_name(event),
            });
        }
    };
    Ok(Next::Phase(to))
}

/// What to do at start with a journal left open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Nothing on the host changed: drop the journal (and any backups).
    Discard,
    /// Restore the backups; containerd was not restarted, so no restart.
    RollBackFiles,
    /// Restore the backups, restart containerd and verify it.
    RollBackAndRestart,
    /// Continue forward from this phase (restart and/or verify, then commit).
    RollForward(Phase),
    /// The transaction finished; only the journal is left to close.
    Close,
}

/// The recovery action for a journal found open at start (see the table in the module docs).
///
/// `provable`: whether containerd can be asked if the new state works. Without it (an image
/// root) nothing can prove a half-done transaction good, so it never rolls forward: its files
/// are put back and nothing is restarted.
pub fn recovery_for(phase: Phase, provable: bool) -> Recovery {
    use Phase::*;
    match phase {
        Planned | Fetched | SlotAcquired => Recovery::Discard,
        Staged => Recovery::RollBackFiles,
        Applied | Restarted | Verified | Proven | RollingBack | Broken if !provable => {
            Recovery::RollBackFiles
        }
        Applied | Restarted | Verified | Proven => Recovery::RollForward(phase),
        Committed | RolledBack => Recovery::Close,
        RollingBack | Broken => Recovery::RollBackAndRestart,
    }
}

/// True for phases after which the host may differ from before the transaction.
pub fn host_may_have_changed(phase: Phase) -> bool {
    matches!(
        phase,
        Phase::Staged
            | Phase::Applied
            | Phase::Restarted
            | Phase::Verified
            | Phase::Proven
            | Phase::RollingBack
            | Phase::Broken
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use Phase::*;

    const ALL: [Phase; 12] = [
        Planned,
        Fetched,
        SlotAcquired,
        Staged,
        Applied,
        Restarted,
        Verified,
        Proven,
        Committed,
        RollingBack,
        RolledBack,
        Broken,
    ];

    fn all_events() -> Vec<Event> {
        vec![
            Event::Fetched,
            Event::SlotAcquired,
            Event::Staged,
            Event::Applied,
            Event::Restarted,
            Event::Verified,
            Event::Proven,
            Event::Committed,
            Event::Failed { reason: "x".into() },
            Event::RolledBack,
            Event::RollbackFailed { reason: "y".into() },
        ]
    }

    #[test]
    fn the_happy_path_walks_every_phase_in_order() {
        let steps = [
            Event::Fetched,
            Event::SlotAcquired,
            Event::Staged,
            Event::Applied,
            Event::Restarted,
            Event::Verified,
            Event::Proven,
            Event::Committed,
        ];
        let mut p = Planned;
        let mut seen = vec![p];
        for e in &steps {
            match next(p, e).unwrap() {
                Next::Phase(n) => p = n,
                other => panic!("{other:?}"),
            }
            seen.push(p);
        }
        assert_eq!(
            seen,
            [
                Planned,
                Fetched,
                SlotAcquired,
                Staged,
                Applied,
                Restarted,
                Verified,
                Proven,
                Committed
            ]
        );
    }

    #[test]
    fn a_failure_before_staging_aborts_and_after_it_rolls_back() {
        let f = Event::Failed {
            reason: "restart job failed".into(),
        };
        for p in [Planned, Fetched, SlotAcquired] {
            assert_eq!(
                next(p, &f).unwrap(),
                Next::Abort {
                    reason: "restart job failed".into()
                }
            );
        }
        for p in [Staged, Applied, Restarted, Verified, Proven] {
            assert_eq!(next(p, &f).unwrap(), Next::Phase(RollingBack));
        }
        assert_eq!(
            next(RollingBack, &Event::RolledBack).unwrap(),
            Next::Phase(RolledBack)
        );
        assert_eq!(
            next(RollingBack, &Event::RollbackFailed { reason: "x".into() }).unwrap(),
            Next::Phase(Broken)
        );
        assert_eq!(
            next(Broken, &Event::RolledBack).unwrap(),
            Next::Phase(RolledBack)
        );
    }

    #[test]
    fn out_of_order_events_are_errors_not_panics() {
        let e = next(Planned, &Event::Restarted).unwrap_err();
        assert_eq!(e.from, Planned);
        assert!(e.to_string().contains("Restarted"));
        assert!(
            next(
                Committed,
                &Event::Failed {
                    reason: "late".into()
                }
            )
            .is_err()
        );
        assert!(
            next(
                RolledBack,
                &Event::Failed {
                    reason: "late".into()
                }
            )
            .is_err()
        );
        assert!(
            next(Applied, &Event::Committed).is_err(),
            "cannot commit without restart and verify"
        );
        assert!(
            next(Verified, &Event::Committed).is_err(),
            "cannot commit without the runtime proven"
        );
    }

    #[test]
    fn every_phase_and_event_is_total_and_terminal_phases_accept_nothing() {
        for p in ALL {
            for e in all_events() {
                let _ = next(p, &e); // never panics
            }
        }
        for p in [Committed, RolledBack] {
            assert!(
                all_events().iter().all(|e| next(p, e).is_err()),
                "{p:?} must be terminal"
            );
        }
    }

    #[test]
    fn committed_is_reachable_only_through_proven_after_verified() {
        for p in ALL {
            for e in all_events() {
                if next(p, &e) == Ok(Next::Phase(Committed)) {
                    assert_eq!(p, Proven);
                }
                if next(p, &e) == Ok(Next::Phase(Proven)) {
                    assert_eq!(p, Verified);
                }
                if next(p, &e) == Ok(Next::Phase(Verified)) {
                    assert_eq!(p, Restarted);
                }
            }
        }
    }

    #[test]
    fn recovery_never_leaves_changed_files_unhandled() {
        for provable in [true, false] {
            for p in ALL {
                let r = recovery_for(p, provable);
                if host_may_have_changed(p) {
                    assert_ne!(r, Recovery::Discard, "{p:?} may have changed the host");
                    assert_ne!(r, Recovery::Close, "{p:?} may have changed the host");
                }
            }
        }
        assert_eq!(recovery_for(Staged, true), Recovery::RollBackFiles);
        assert_eq!(recovery_for(Applied, true), Recovery::RollForward(Applied));
        assert_eq!(
            recovery_for(Verified, true),
            Recovery::RollForward(Verified)
        );
        assert_eq!(recovery_for(Proven, true), Recovery::RollForward(Proven));
        assert_eq!(recovery_for(Proven, false), Recovery::RollBackFiles);
        assert_eq!(recovery_for(Broken, true), Recovery::RollBackAndRestart);
        assert_eq!(recovery_for(Fetched, true), Recovery::Discard);
    }

    #[test]
    fn without_a_containerd_to_prove_it_nothing_rolls_forward_or_restarts() {
        for p in ALL {
            let r = recovery_for(p, false);
            assert!(
                !matches!(r, Recovery::RollForward(_) | Recovery::RollBackAndRestart),
                "{p:?} -> {r:?} in an image root"
            );
        }
        assert_eq!(recovery_for(Applied, false), Recovery::RollBackFiles);
        assert_eq!(recovery_for(Broken, false), Recovery::RollBackFiles);
        assert_eq!(recovery_for(Committed, false), Recovery::Close);
    }
}
