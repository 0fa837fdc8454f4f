//! The node reconciler's core, one for both run modes (`run` with static Shims only, and the
//! cluster agent): what the node remembers between rounds ([`memory`]), how a round's outcome
//! is judged and what that decides ([`judge`]), and crash isolation around a round
//! ([`crash`]). A run mode keeps only its source of Shims and its reporting; every decision
//! about failures, retries and crashes is made here, once.
//!
//! A round, in either mode, runs the steps of [`round`] in their one order: open it (the
//! Shims it leaves out), plan and cut the plan to one Shim after an unnamed batch failure,
//! begin (crash record), transact, conclude (the [`judge::Verdict`] the mode reports), end.

pub mod crash;
pub mod judge;
pub mod memory;
pub mod round;
