//! shim-agent: installs containerd shims on a node and registers their runtime handlers.
//!
//! The crate is a library with a thin binary on top (`src/main.rs`). Modules, by concern:
//! - [`hostroot`] and [`fsutil`]: every host path and every crash-safe write;
//! - [`containerd`]: the containerd config engine (detect schema, add/remove a handler);
//! - [`artifact`]: fetch, verify and unpack shims into the content-addressed store;
//! - [`api`]: the `Shim` custom resource and the manifests around it;
//! - [`settings`]: the agent's own configuration (`/etc/shim-agent/config.toml`);
//! - [`node`]: the real edges of a node transaction: systemd over D-Bus, containerd's CRI;
//! - [`txn`]: the one transaction engine, for a live node and an image root;
//! - [`statics`]: static Shims, adoption and file watching (both run modes);
//!   [`reconciler`]: the node reconciler's memory, judgement and crash isolation (both run
//!   modes); [`daemon`]: `run` without a cluster;
//! - [`cluster`]: the Kubernetes daemon; [`cli`]: what the commands do;
//! - [`telemetry`]: journal message ids, metrics and the status line the core records;
//!   [`endpoints`]: metrics and probes over HTTP; [`service`]: the systemd service around
//!   `run` (notify, signals, reload, logs);
//! - [`text`]: untrusted text clipped on character boundaries; [`events`]: Kubernetes Events;
//!   [`crashes`]: a Shim the agent keeps crashing on is set aside; [`faults`]: fault
//!   injection points for the tests.

// Any byte offset into untrusted text may fall inside a character (src/text.rs).
#![deny(clippy::string_slice)]

pub mod api;
pub mod artifact;
pub mod cli;
pub mod cluster;
pub mod containerd;
pub mod crashes;
pub mod daemon;
pub mod doctor;
pub mod endpoints;
pub mod events;
pub mod faults;
pub mod fsutil;
pub mod hooks;
pub mod hostroot;
pub mod node;
pub mod profile;
pub mod reconciler;
pub mod retry;
pub mod service;
pub mod settings;
pub mod signature;
pub mod state;
pub mod statics;
pub mod telemetry;
pub mod text;
pub mod txn;
