//! The tests that need a real node: systemd and containerd (Debian's 1.6.20 or an upstream 2.x)
//! in a systemd-nspawn container built and booted by `.ci/node-env/` (`support::node_env`).
//! Restarts go over the node's D-Bus, CRI is containerd's own socket, and the packaged unit
//! runs the agent under the node's systemd; `kube` and `lifecycle` join the node to the kube
//! env's API server too.
//!
//! `cargo test --test node` after `source /var/tmp/node-env/run/<machine>/env` (one module:
//! `cargo test --test node retain::`); scripts/test runs the whole group again on a containerd
//! 2.x node. Without the node env every test skips saying why, unless
//! `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI): then it fails (`support::skip`). The tests take turns
//! on the node (a file lock in the env's run directory).

#[path = "../support/mod.rs"]
mod support;

mod check;
mod doctor;
mod edges;
mod fetch_paths;
mod kube;
mod lifecycle;
mod option_paths;
mod restart_timing;
mod retain;
mod service;
mod transport;
mod txn;
