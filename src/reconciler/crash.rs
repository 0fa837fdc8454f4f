//! Crash isolation around a round, in both run modes ([`crate::crashes`] holds the pure
//! rules): at start the round the last process died in counts as a crash of its Shims; a Shim
//! crashed on twice at its spec is set aside; before a round's risky steps its Shims are
//! recorded, and the round does not begin when that record cannot be saved (it would not be
//! isolated); the round's end clears the record.

use std::collections::{BTreeMap, BTreeSet};

use super::memory::{FailureNote, Memory, Wanted};
use crate::crashes;
use crate::state::{NodeState, StateStore};
use crate::txn::{TxnError, TxnReason};

/// A Shim set aside after crashes, to be reported (once: [`Memory::set_aside`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub name: String,
    pub note: FailureNote,
}

/// What a round may not work on: the Shims set aside now, and those newly so (to report).
#[derive(Debug, Default)]
pub struct Aside {
    pub names: BTreeSet<String>,
    pub new: Vec<SetAside>,
}

fn save_or_warn(store: &StateStore, state: &NodeState, what: &str) {
    if let Err(e) = store.save(state) {
        tracing::warn!("cannot save {what}: {e:#}");
    }
}

impl Memory {
    /// At start: a round the last process died in counts as a crash of each of its Shims;
    /// several are then run one at a time, so the next crash names the culprit alone.
    pub fn count_crashes(&mut self, store: &StateStore, state: &mut NodeState) -> Vec<String> {
        let crashed = crashes::count(state, crate::txn::record::now_secs());
        if crashed.is_empty() {
            return crashed;
        }
        save_or_warn(store, state, "the crash count");
        if crashed.len() > 1 {
            self.run_alone(crashed.clone());
        }
        crashed
    }

    /// The Shims set aside now (crashed on [`crashes::CRASHES_TO_SET_ASIDE`] times at the
    /// spec wanted now): each a failure with reason `AgentCrashed`, not retried until its spec
    /// changes. Records of Shims whose spec changed are forgotten.
    pub fn set_aside_crashed(
        &mut self,
        store: &StateStore,
        state: &mut NodeState,
        wanted: &Wanted<'_>,
    ) -> Aside {
        let current = |n: &str| Some(wanted.key(n));
        if crashes::forget_stale(state, current) {
            save_or_warn(store, state, "the crash records");
        }
        let names = crashes::set_aside(state, current);
        let mut new = Vec::new();
        for name in &names {
            let Some(rec) = state.crashes.get(name) else {
                continue;
            };
            let note = FailureNote {
                reason: crashes::REASON.into(),
                message: crashes::message(rec),
                generation: wanted.get(name).and_then(|s| s.metadata.generation),
            };
            if self.set_aside(name, note.clone(), rec.spec_key.clone(), rec.crashes) {
                new.push(SetAside {
                    name: name.clone(),
                    note,
                });
            }
        }
        self.keep_aside_only(&names);
        Aside { names, new }
    }
}

/// Before the round's risky steps (fetch, unpack, transaction, report): record the Shims it
/// works on, each at the spec wanted. When the record cannot be saved the round must not
/// begin (a crash in it would not be isolated): the error fails the round's work like any
/// failed transaction, nothing on the host changed.
pub fn begin_work(
    store: &StateStore,
    state: &mut NodeState,
    work: &[String],
    wanted: &Wanted<'_>,
) -> Result<(), TxnError> {
    let shims: BTreeMap<String, String> = work.iter().map(|n| (n.clone(), wanted.key(n))).collect();
    let before = state.working.clone();
    if crashes::begin(state, shims, crate::txn::record::now_secs())
        && let Err(e) = store.save(state)
    {
        state.working = before;
        let message = format!("cannot record the round's Shims for crash isolation: {e}");
        return Err(TxnError::new(TxnReason::Failed, message).caused_by(Some(e.reason())));
    }
    // `round::<shim>` fires inside that Shim's round, its record saved
    for name in work {
        crate::faults::point(&format!("round::{name}"));
    }
    Ok(())
}

/// The round ended: nothing crashed while it worked on `work`. A record that cannot be
/// cleared counts one crash too many at the next start (warned).
pub fn end_work(store: &StateStore, state: &mut NodeState, work: &[String]) {
    let mut changed = crashes::end(state);
    for name in work {
        changed |= crashes::forget(state, name);
    }
    if changed {
        save_or_warn(store, state, "the end of the round's crash record");
    }
}
