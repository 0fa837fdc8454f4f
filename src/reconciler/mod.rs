//! The node reconciler's core, one for both run modes (`run` with static Shims only, and the
//! cluster agent): what the node remembers between rounds ([`memory`]), how a round's outcome
//! is judged and what that decides ([`judge`]), and crash isolation around a round
//! ([`crash`]). A run mode keeps only its source of Shims and its reporting; every decision
//! about failures, retries and crashes is made here, once.
//!
//! A round, in either mode:
//! 1. [`Memory::forget_stale`], [`Memory::expire`], then [`Memory::held`] and
//!    [`Memory::set_aside_crashed`]: the Shims the round leaves out;
//! 2. the plan, cut down by [`Memory::restrict_to_solo`] after an unnamed batch failure;
//! 3. [`crash::begin_work`] (the round does not begin when it fails), the transaction, and
//!    [`Memory::conclude`] on its outcome: the [`judge::Verdict`] the mode reports;
//! 4. [`crash::end_work`].
//!
//! [`Memory::forget_stale`]: memory::Memory::forget_stale
//! [`Memory::expire`]: memory::Memory::expire
//! [`Memory::held`]: memory::Memory::held
//! [`Memory::set_aside_crashed`]: memory::Memory::set_aside_crashed
//! [`Memory::restrict_to_solo`]: memory::Memory::restrict_to_solo
//! [`Memory::conclude`]: memory::Memory::conclude

pub mod crash;
pub mod judge;
pub mod memory;
