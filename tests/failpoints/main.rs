//! Crashes injected into this process with the `fail` crate (`--features failpoints`): a
//! transaction killed at every failpoint, then recovered.
//!
//! A group of its own because failpoints are process-wide: one configured here fires in any
//! test of the same process that runs the transaction engine, so these tests cannot share a
//! process with the `pure` group (the `fail` crate's own advice), and the tests of this group
//! take turns ([`serial`]). The node tests that crash the agent set `FAILPOINTS` in the
//! agent's process instead, and stay in the `node` group.
//!
//! `cargo test --features failpoints --test failpoints`.

use std::sync::{Mutex, MutexGuard};

#[path = "../support/mod.rs"]
mod support;

mod live_crash;
mod retain_crash;
mod retain_timer;

/// Failpoints are process-wide: every test of this binary that runs the transaction engine
/// holds this for its whole run, setup included, so no other test's failpoint fires in it.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
