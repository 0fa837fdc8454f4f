//! The real edges of the node transaction (docs/design.md §3, §4): restarting containerd through
//! systemd, and asking containerd itself whether it serves a runtime handler.
//!
//! Two narrow ports, each covering its whole edge:
//! - [`ServiceManager`]: restart a unit and wait for the job's result, read a unit's state,
//!   reset its failed state. Production: [`SystemdDbus`] (`org.freedesktop.systemd1` over the
//!   system bus with zbus).
//! - [`RuntimeHealth`]: the CRI `Status` of the runtime (ready or not, which handlers it
//!   serves), and [`RuntimeHealth::wait_for_handler`], the check after a restart. Production:
//!   [`CriClient`] (CRI v1 over containerd's unix socket with tonic).
//!
//! # Design decisions
//! - **Static dispatch.** The ports are traits whose methods return `impl Future + Send`
//!   (written as `async fn` in the impls). Callers are generic over the port
//!   (`fn step<S: ServiceManager>(s: &S)`), so there is no boxing and no `async-trait`; the
//!   traits are therefore not object safe, which the transaction engine does not need.
//! - **`active` proves nothing.** A restart job that is `done` means systemd started the unit;
//!   on containerd 1.x a config whose `runtimes` table lacks the default runtime still starts
//!   while the CRI plugin fails to load. Only [`RuntimeHealth::wait_for_handler`] proves the
//!   node can run the handler.
//! - **Parsing is pure.** What the CRI returns is turned into a [`CriStatus`] by
//!   [`cri::status_from_response`] and [`cri::handlers_from_verbose_info`], tested on output
//!   captured from a real containerd (`tests/fixtures/cri/`).

pub mod check;
pub mod cri;
mod error;
mod ports;
pub mod shim_version;
pub mod systemd;
pub mod tasks;
mod unit;

pub use cri::CriClient;
pub use error::NodeError;
pub use ports::{
    CriStatus, HANDLER_POLL_INTERVAL_MS, HandlerSource, MIN_STATUS_CALL_MS, RuntimeHealth,
    STATUS_CALL_TIMEOUT_MS, ServiceManager, check_handler,
};
pub use systemd::SystemdDbus;
pub use unit::{RestartOutcome, UnitState};
