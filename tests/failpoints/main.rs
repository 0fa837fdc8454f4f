//! Crashes injected into this process with the `fail` crate (`--features failpoints`): a
//! transaction killed at every failpoint, then recovered.
//!
//! A group of its own because failpoints are process-wide: one configured here fires in any
//! test of the same process that runs the transaction engine, so these tests cannot share a
//! process with the `pure` group (the `fail` crate's own advice). The node tests that crash
//! the agent set `FAILPOINTS` in the agent's process instead, and stay in the `node` group.
//!
//! `cargo test --features failpoints --test failpoints`.

#[path = "../support/mod.rs"]
mod support;

mod live_crash;
