//! The tests that need a real Kubernetes control plane: kube-apiserver, controller manager and
//! etcd on loopback, started once per run from `$KUBE_ENV_DIR` (`support::kube`), with the
//! agents, the coordinator and fleets of them running in this process under node identities
//! (the host side is the scripted containerd of `support::live`).
//!
//! `cargo test --test kube` (one module: `cargo test --test kube hooks::`). Without the kube
//! env every test skips saying why, unless `SHIM_AGENT_REQUIRE_KUBE_ENV=1` (CI): then it fails
//! (`support::skip`). The tests that share the cluster take turns (`support::kube::SERIAL`);
//! the two that start an API server of their own on a fixed port (`hooks_nocrd`,
//! `node_credential`'s audit) hold it too.

#[path = "../support/mod.rs"]
mod support;

mod agent;
mod agent_edges;
mod api;
mod api_proxy;
mod bad_shims;
mod coordinate_cli;
mod coordinator_batch;
mod events_paced;
mod fleet;
mod hooks;
mod hooks_coordinator;
mod hooks_nocrd;
mod hooks_rollout;
mod kustomize;
mod late_batch;
mod lists;
mod node_credential;
mod node_reads;
mod readiness;
mod reconciler_table;
mod recovery;
mod report_order;
mod resilience;
mod retain;
mod runtime_check;
mod runtime_class;
mod shim_cache;
mod slot_batch;
mod slot_claims;
mod slot_hints;
mod slot_orphans;
mod slots;
mod slow_server;
