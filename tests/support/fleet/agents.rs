//! The fleet's nodes as this process runs them: a simulated host and the real agent session
//! per node, for all of a run's nodes or for a worker's share of them (`procs`).

use std::cell::Cell;
use std::collections::BTreeSet;
use std::ops::Range;
use std::rc::Rc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::{Api, Client};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::agent::gate::GateTimings;
use shim_agent::cluster::connect::Source;
use shim_agent::cluster::session::{self, SessionConfig};
use shim_agent::state::Origin;

use super::super::kube::KubeEnv;
use super::super::live::{World, fake, world};
use super::FleetConfig;
use super::check::{Host, SharedRef};

/// How long an agent that ended with an error stays down: the service's `RestartSec`.
const AGENT_RESTART: Duration = Duration::from_secs(5);

/// The run's node names, in index order.
pub fn node_names(cfg: &FleetConfig) -> Vec<String> {
    (0..cfg.agents)
        .map(|i| format!("{}-{i}", cfg.run))
        .collect()
}

/// A host and its root for each node of `share` (indices into the run's nodes).
pub fn make_hosts(
    cfg: &FleetConfig,
    share: Range<usize>,
    shared: &SharedRef,
    t0: Instant,
    admin: &Client,
) -> (Vec<World>, Vec<Host>) {
    let names = node_names(cfg);
    let nodes: Api<KubeNode> = Api::all(admin.clone());
    let worlds: Vec<World> = share.clone().map(|_| world()).collect();
    let hosts = share
        .zip(&worlds)
        .map(|(i, w)| {
            let mut inner = fake(w);
            inner.restart_delay = cfg.restart;
            if cfg.failing.contains(&i) {
                inner.fail_verifies = (1..1000).collect();
            }
            Host {
                name: names[i].clone(),
                inner,
                shared: shared.clone(),
                t0,
                slots: Api::namespaced(admin.clone(), NAMESPACE),
                shim: cfg.run.clone(),
                crash: Rc::new(tokio::sync::Notify::new()),
                down_for: Cell::new(Duration::from_millis(500)),
                skew_secs: skew(i),
                crash_on_restart: Cell::new(cfg.crashing.contains(&i)),
                delete_on_restart: Cell::new(cfg.deleted.contains(&i)),
                nodes: nodes.clone(),
            }
        })
        .collect();
    (worlds, hosts)
}

/// Run an agent per host until `stop` turns true; an agent killed mid-restart (its host's
/// `crash`) starts again after its host's `down_for`, and one that ended with an error
/// after [`AGENT_RESTART`], as systemd starts the service again.
pub async fn run_agents(
    env: &KubeEnv,
    cfg: &FleetConfig,
    worlds: &[World],
    hosts: &[Host],
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let candidates: BTreeSet<String> = node_names(cfg).into_iter().take(cfg.coordinators).collect();
    futures_util::future::join_all(hosts.iter().zip(worlds).map(|(host, w)| {
        let stop = stop.clone();
        let candidate = candidates.contains(&host.name);
        let (source, coordinator_source) = if cfg.node_identities {
            (env.node_identity(&host.name), env.coordinator_identity())
        } else {
            // a worker's API server (an HA control plane), else the kube env's
            let admin = cfg.apiservers.first().unwrap_or(&env.admin);
            (admin.clone(), admin.clone())
        };
        let config = SessionConfig {
            source: Source::Kubeconfig(source),
            node_name: host.name.clone(),
            coordinator_source: candidate.then_some(Source::Kubeconfig(coordinator_source)),
            coordinator: cfg.coordinator,
            node_wait: Duration::from_secs(60),
            credential_check: Duration::from_secs(3600),
            gate: GateTimings {
                clock_skew_secs: host.skew_secs,
                max_deferral: cfg.max_deferral,
                ..cfg.gate
            },
            startup_taint: None,
        };
        async move {
            loop {
                let n = shim_agent::txn::Node {
                    root: &w.root,
                    settings: &w.settings,
                    profile: shim_agent::profile::builtin("containerd"),
                    platform: shim_agent::artifact::node_platform(),
                    origin: Origin::Cluster,
                    restarter: host,
                    health: host,
                };
                tokio::select! {
                    r = session::run(&n, config.clone(), stop.clone()) => {
                        let Err(e) = r else { return };
                        if *stop.borrow() {
                            return;
                        }
                        // as systemd restarts the service (Restart=on-failure, RestartSec=5)
                        eprintln!("fleet: the agent of {} ended ({e}); started again in 5 s", host.name);
                        tokio::time::sleep(AGENT_RESTART).await;
                        continue;
                    }
                    _ = host.crash.notified() => {}
                }
                // killed mid-restart: start again a moment later
                tokio::time::sleep(host.down_for.get()).await;
            }
        }
    }))
    .await;
}

/// Every node's wall clock is off by up to ±1 h.
fn skew(i: usize) -> i64 {
    (i as i64 * 7919) % 7200 - 3600
}
