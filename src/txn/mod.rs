//! Node transactions: install, upgrade and uninstall as journalled state machines, one engine
//! for a live node and an image root.
//!
//! - [`machine`]: the pure core (phases, transitions, recovery decisions);
//! - [`classify`]: the pure answer to "does this change do real work?";
//! - [`error`]: the typed outcome of a failed transaction;
//! - `host`: what a transaction runs on ([`Node`]) and the journal's one way forward;
//! - [`engine`]: the shell that performs each step ([`Node::apply`]); `commit`: its end;
//! - [`recovery`]: interrupted transactions finished or undone; `rollback`: failed ones
//!   rolled back;
//! - [`ports`]: the restart and health ports, and the image root's own ([`NoRestart`],
//!   [`DeferredVerification`]); [`real`]: systemd over D-Bus and containerd's CRI;
//! - [`prepare`]: fetch, preflight and plan before the host changes, write the files after;
//! - [`prove`]: each new handler runs a pod sandbox (and its check container) before the
//!   commit;
//! - [`retain`]: replaced versions kept while containerd tasks run through them;
//! - [`files`], [`record`], [`batch`]: backups and the undo log, what is recorded, several
//!   config changes as one; `notices`: the journal entries, metrics and status line of an
//!   ending transaction.

pub mod batch;
pub mod classify;
mod collect;
mod commit;
pub mod engine;
pub mod error;
pub mod files;
mod host;
pub mod machine;
mod notices;
pub mod ports;
mod preflight;
pub mod prepare;
pub mod prove;
pub mod real;
pub mod record;
pub mod recovery;
mod restart;
pub mod retain;
mod rollback;

pub use classify::{
    Change, HostFacts, Work, classify, handler_in_use_message, handler_owner, real_work,
};
pub use error::{TxnError, TxnReason};
pub use host::{Node, Report};
pub use ports::{
    DeferredVerification, Gate, HealthCheck, NoRestart, ReleaseLater, Restarter, Ungated,
};
