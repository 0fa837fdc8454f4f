//! A round's steps, in the one order both run modes follow. Each step is a type that only the
//! step before it hands out, so a mode cannot skip one or run them out of order:
//!
//! 1. [`open_round`]: forget the failures of changes no longer wanted as they failed, clear
//!    the backoffs that ran out, and set aside the Shims crashed on: an [`Opened`] round, with
//!    the Shims it leaves out (held by a backoff or a wait, or set aside) and those newly set
//!    aside (to report).
//! 2. The mode plans its changes without the held Shims, then [`Planning::cut_to_solo`] keeps
//!    one Shim after a batch failed without naming its culprit.
//! 3. [`Planning::begin`] records the round's Shims for crash isolation; [`Begun::transact`]
//!    runs the mode's transaction, unless that record could not be saved (then the round fails
//!    like any transaction, nothing on the host changed).
//! 4. [`Begun::conclude`] takes in the outcome: the [`Verdict`] the mode reports.
//! 5. [`Concluded::end`], after the mode's reporting (a crash while reporting counts too):
//!    the round's crash record is cleared.
//!
//! The decisions are the pure [`Memory`]'s; the steps here only sequence them with the crash
//! record of the state store. The mode keeps its source of Shims, its transaction and its
//! reporting.

use std::collections::BTreeSet;
use std::future::Future;

use tokio::time::Instant;

use super::crash::{self, Aside};
use super::judge::{Context, Verdict};
use super::memory::{Memory, Wanted};
use crate::state::{NodeState, StateStore};
use crate::txn::{Change, HostFacts, Report, TxnError, real_work};

/// Step 1 done: what the round leaves out, and the round to plan.
#[derive(Debug)]
pub struct Opened<'w> {
    /// The Shims the round leaves out: held by a backoff or a wait, or set aside.
    pub held: BTreeSet<String>,
    /// The Shims set aside after crashes, and those newly so (to report once).
    pub aside: Aside,
    /// The round, to plan.
    pub planning: Planning<'w>,
}

/// A round being planned (step 2).
#[derive(Debug)]
pub struct Planning<'w> {
    wanted: Wanted<'w>,
}

/// A round whose work began (step 3): its Shims recorded for crash isolation, or the reason
/// they could not be.
#[derive(Debug)]
#[must_use = "a begun round must be concluded and ended"]
pub struct Begun<'w> {
    wanted: Wanted<'w>,
    work: Vec<String>,
    refused: Option<TxnError>,
}

/// A round whose outcome was taken in (step 4): its verdict, to report, then [`Self::end`].
#[derive(Debug)]
#[must_use = "a concluded round must be ended"]
pub struct Concluded<'w> {
    pub verdict: Verdict,
    wanted: Wanted<'w>,
    work: Vec<String>,
}

/// Step 1: open a round on the Shims `wanted` now.
pub fn open_round<'w>(
    memory: &mut Memory,
    store: &StateStore,
    state: &mut NodeState,
    wanted: Wanted<'w>,
    now: Instant,
) -> Opened<'w> {
    memory.forget_stale(&wanted);
    memory.expire(now);
    let mut held = memory.held(now);
    let aside = memory.set_aside_crashed(store, state, &wanted);
    held.extend(aside.names.iter().cloned());
    Opened {
        held,
        aside,
        planning: Planning { wanted },
    }
}

impl<'w> Planning<'w> {
    /// The Shims the round wants.
    pub fn wanted(&self) -> &Wanted<'w> {
        &self.wanted
    }

    /// Step 2: after a batch failed without naming its culprit, keep only the first Shim of
    /// the planned `changes` that waits to run alone ([`Memory::restrict_to_solo`]).
    pub fn cut_to_solo(
        &self,
        memory: &mut Memory,
        changes: &mut Vec<Change>,
        state: &NodeState,
        facts: &HostFacts,
    ) {
        let work = real_work(changes, state, facts);
        memory.restrict_to_solo(changes, &work);
    }

    /// Step 3: the round's final `changes` begin; the Shims they really change are recorded
    /// for crash isolation ([`crash::begin_work`]).
    pub fn begin(
        self,
        store: &StateStore,
        state: &mut NodeState,
        changes: &[Change],
        facts: &HostFacts,
    ) -> Begun<'w> {
        let work = real_work(changes, state, facts);
        let refused = crash::begin_work(store, state, &work, &self.wanted).err();
        Begun {
            wanted: self.wanted,
            work,
            refused,
        }
    }
}

impl<'w> Begun<'w> {
    /// The Shims the round really changes.
    pub fn work(&self) -> &[String] {
        &self.work
    }

    /// The Shims the round wants.
    pub fn wanted(&self) -> &Wanted<'w> {
        &self.wanted
    }

    /// The round's transaction `tx`, awaited only when the round's record was saved: else the
    /// error that kept the round from beginning.
    pub async fn transact(
        &mut self,
        tx: impl Future<Output = Result<Report, TxnError>>,
    ) -> Result<Report, TxnError> {
        match self.refused.take() {
            Some(e) => Err(e),
            None => tx.await,
        }
    }

    /// Step 4: take in the round's `outcome` ([`Memory::conclude`]).
    pub fn conclude(
        self,
        memory: &mut Memory,
        outcome: &Result<Report, TxnError>,
        cx: Context<'_>,
    ) -> Concluded<'w> {
        let verdict = memory.conclude(outcome, &self.work, &self.wanted, cx);
        Concluded {
            verdict,
            wanted: self.wanted,
            work: self.work,
        }
    }
}

impl<'w> Concluded<'w> {
    /// The Shims the round wanted.
    pub fn wanted(&self) -> &Wanted<'w> {
        &self.wanted
    }

    /// Step 5, after the mode reported the verdict: the round ended, nothing crashed
    /// ([`crash::end_work`]).
    pub fn end(self, store: &StateStore, state: &mut NodeState) {
        crash::end_work(store, state, &self.work);
    }
}
