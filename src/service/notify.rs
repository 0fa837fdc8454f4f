//! systemd's notify protocol (`Type=notify`): `READY=1` once the journal is recovered and
//! the watches synced, a `STATUS=` line a person can read in `systemctl status` whenever the
//! activity changes, `WATCHDOG=1` when the unit sets `WatchdogSec=`, and `RELOADING=1` /
//! `STOPPING=1`. Outside systemd (`NOTIFY_SOCKET` unset) every call does nothing.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio::task::JoinHandle;

use crate::telemetry;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "cannot notify systemd");
    }
}

/// The agent is reloading its configuration (the next READY=1 ends the reload).
pub fn reloading() {
    let mut states = vec![NotifyState::Reloading];
    // systemd ≥ 253 wants the time of the reload with it
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    states.push(NotifyState::Status("reloading the configuration"));
    send(&states);
}

/// The reload is over (it ended in no change, or was refused).
pub fn ready() {
    send(&[NotifyState::Ready]);
}

/// The agent is stopping; `status` says what it still finishes.
pub fn stopping(status: &str) {
    send(&[NotifyState::Stopping, NotifyState::Status(status)]);
}

/// Send the activity as `STATUS=` lines, and `READY=1` each time the agent becomes ready, until
/// the returned task is aborted.
pub fn follow_activity() -> JoinHandle<()> {
    let mut rx = telemetry::activity();
    tokio::spawn(async move {
        let mut readied = 0;
        loop {
            let a = rx.borrow_and_update().clone();
            let line = a.line();
            if a.readied != readied {
                send(&[NotifyState::Ready, NotifyState::Status(&line)]);
            } else {
                send(&[NotifyState::Status(&line)]);
            }
            readied = a.readied;
            if rx.changed().await.is_err() {
                return;
            }
        }
    })
}

/// `WATCHDOG=1` at half the unit's `WatchdogSec=`, from the runtime that runs the agent: a
/// wedged runtime stops the pings and systemd restarts the agent (its journal makes that
/// safe at any point). `None` without a watchdog.
pub fn watchdog() -> Option<JoinHandle<()>> {
    let every = sd_notify::watchdog_enabled()?;
    let every = (every / 2).max(Duration::from_millis(100));
    tracing::info!(
        interval_ms = every.as_millis() as u64,
        "systemd watchdog on"
    );
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    }))
}
