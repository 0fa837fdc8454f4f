//! A fleet of agents in one process against the real API server (docs/design.md §5): the real
//! agent code (session, coordinator election, slot gate, transaction engine) per node, each
//! with its own Node object and a simulated host whose containerd restart takes a set time.
//! Some hosts fail, some agents crash mid-restart and start again, some Nodes are deleted
//! while they hold a slot, and every agent writes times from its own skewed clock.
//!
//! A checker watches the Shim's slot Leases and the hosts report their restarts; together
//! they assert, as it happens:
//! - never more than N nodes restarting containerd, and never more than N slot holders;
//! - no restart without a fresh renewal of the node's slot, read back from the API server;
//! - no slot taken once the coordinator closed them all for a halt;
//! - a deleted Node's slot freed, and a live node's slot never freed by anyone but itself.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::agent::gate::GateTimings;
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;
use shim_agent::cluster::{NAMESPACE, node_label};

mod agents;
mod check;
pub mod procs;

use agents::{make_hosts, node_names, run_agents};
use check::{SharedRef, checker};

use super::agent_rig::fast;
use super::kube::{KubeEnv, eventually};
use super::live::world;
use super::shim_builder::ShimBuilder;
use super::{Entry, real_elf, sha256_hex, tar_gz};

/// One fleet run.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    pub run: String,
    pub agents: usize,
    /// `maxUpdate` as YAML (`1`, `10`, `"5%"`).
    pub max_update: String,
    pub max_failures: i32,
    /// How long each containerd restart takes.
    pub restart: Duration,
    /// Hosts whose containerd never serves the handler (every attempt rolls back).
    pub failing: BTreeSet<usize>,
    /// Agents killed in the middle of their first restart, started again a moment later.
    pub crashing: BTreeSet<usize>,
    /// Nodes deleted while they restart (holding their slot).
    pub deleted: BTreeSet<usize>,
    /// How long the whole rollout may take.
    pub deadline: Duration,
    /// Once this many nodes serve the handler, set maxUpdate to `.1` (YAML); the checker
    /// holds claims to the N the coordinator stamps on the slots.
    pub resize: Option<(usize, String)>,
    /// When the rollout halts: kill the coordinator, check the halt outlives it, then resume
    /// with the annotation (else the run just ends there).
    pub failover_on_halt: bool,
    /// The coordinator's timings (tests: fast; benchmarks: the agent's defaults).
    pub coordinator: shim_agent::cluster::coordinator::CoordinatorConfig,
    /// Nodes an extension fails (they never install, their hosts are healthy).
    pub refused: usize,
    /// The agents' longest deferral by an extension.
    pub max_deferral: Duration,
    /// The agents' slot timings (each agent's clock skew is its own).
    pub gate: GateTimings,
    /// Each agent as its node's kubelet identity and the coordinator as a coordinator identity,
    /// under the manifests' RBAC and admission policies (tests); else all as the admin
    /// (benchmarks of 1000 agents: no certificate to mint per node).
    pub node_identities: bool,
    /// The first this many agents also stand for the coordinator election, as an operator
    /// gives the coordinator's credentials to a few trusted nodes (README): 5000 candidates
    /// would each watch the coordinator lease on a second connection.
    pub coordinators: usize,
    /// Agents one process runs: a run of more goes to worker processes of this many agents
    /// each (`procs`: benchmarks only; one process holds 20,000 descriptors here).
    pub per_process: usize,
    /// Benchmarks: before the Shim is applied, wait `settle` for the agents to settle, then
    /// call `sample` (off the runtime's threads), wait `window`, and call it again: the
    /// fleet's idle cost.
    pub idle_probe: Option<IdleProbe>,
    /// Benchmarks: the API servers' admin kubeconfigs (an HA control plane); worker process
    /// `w` connects its agents to `apiservers[w mod len]`. Empty: the kube env's one.
    pub apiservers: Vec<std::path::PathBuf>,
}

/// See [`FleetConfig::idle_probe`].
#[derive(Clone)]
pub struct IdleProbe {
    pub settle: Duration,
    pub window: Duration,
    pub sample: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for IdleProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IdleProbe({:?}, {:?})", self.settle, self.window)
    }
}

impl FleetConfig {
    pub fn new(run: &str, agents: usize, max_update: &str, restart: Duration) -> FleetConfig {
        FleetConfig {
            run: run.into(),
            agents,
            max_update: max_update.into(),
            max_failures: 0,
            restart,
            failing: BTreeSet::new(),
            crashing: BTreeSet::new(),
            deleted: BTreeSet::new(),
            deadline: Duration::from_secs(120),
            resize: None,
            failover_on_halt: false,
            coordinator: fast(),
            refused: 0,
            max_deferral: GateTimings::default().max_deferral,
            gate: GateTimings::default(),
            node_identities: true,
            coordinators: 3,
            per_process: usize::MAX,
            idle_probe: None,
            apiservers: Vec::new(),
        }
    }
}

/// What a run measured and the invariants it broke (none, for a pass).
#[derive(Debug, Default)]
pub struct FleetReport {
    pub slots: usize,
    pub elapsed: Duration,
    pub installed: usize,
    pub peak_restarting: usize,
    pub peak_holders: usize,
    pub restarts: usize,
    pub halted: bool,
    pub slot_events: usize,
    pub violations: Vec<String>,
    /// The Shim's status as last read before the end (for a failing test's message).
    pub status: Option<shim_agent::api::ShimStatus>,
    /// (seconds since start, restarting, holders) at every change.
    pub timeline: Vec<(f64, usize, usize)>,
    /// Release → next restart begins, seconds, per hand-off (`check::Shared::handoffs`).
    pub handoffs: Vec<f64>,
    /// The hand-offs in two parts: release → take, take → restart (`check::Shared::handoff_parts`).
    pub handoff_parts: (Vec<f64>, Vec<f64>),
    /// Restart end → the slot's release, seconds (`check::Shared::ends_to_release`).
    pub ends_to_release: Vec<f64>,
    /// The targeted nodes stamped on the slots as they first appeared.
    pub targeted: std::collections::BTreeSet<Option<String>>,
}

impl FleetReport {
    /// One line for the test log and the benchmark table.
    pub fn summary(&self) -> String {
        format!(
            "N={} installed={} elapsed={:.2}s restarts={} peak_restarting={} peak_holders={} halted={} slot_events={} violations={}",
            self.slots,
            self.installed,
            self.elapsed.as_secs_f64(),
            self.restarts,
            self.peak_restarting,
            self.peak_holders,
            self.halted,
            self.slot_events,
            self.violations.len()
        )
    }
}

fn shim_yaml(cfg: &FleetConfig, url: &str, sha: &str) -> String {
    let max_update = serde_yaml::from_str(&cfg.max_update).expect("maxUpdate as YAML");
    ShimBuilder::new(&cfg.run)
        .label("fleet", &cfg.run)
        .node_selector("fleet", &cfg.run)
        .artifact(url, sha)
        .rolling(max_update, cfg.max_failures)
        .yaml()
}

/// Raise the per-user inotify instance limit: each agent watches its host's files.
fn allow_inotify(agents: usize) {
    let path = "/proc/sys/fs/inotify/max_user_instances";
    let cur: usize = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0);
    if cur < agents * 2 + 64 {
        let _ = std::fs::write(path, format!("{}", agents * 2 + 64));
    }
}

/// Run a whole rollout and report it.
pub async fn run_fleet(env: &KubeEnv, cfg: &FleetConfig) -> FleetReport {
    crate::support::kube::trace_to_test();
    allow_inotify(cfg.agents);
    if cfg.agents > cfg.per_process {
        assert!(
            cfg.failing.is_empty()
                && cfg.crashing.is_empty()
                && cfg.deleted.is_empty()
                && !cfg.failover_on_halt
                && cfg.refused == 0,
            "worker processes run healthy fleets only"
        );
    }
    let admin = env.admin_client().await;
    let nodes: Api<KubeNode> = Api::all(admin.clone());
    let names = node_names(cfg);
    // a clean start: the Shim and Nodes of an earlier run gone
    force_delete_shim(&admin, &cfg.run).await;
    let lp = ListParams::default().labels(&format!("fleet={}", cfg.run));
    let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
    eventually(60, "old fleet Nodes gone", || async {
        nodes.list(&lp).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    // and its slots: the garbage collector takes them once it sees their owners gone, but a
    // run that starts first finds their names taken (the old Shim's, not the new one's), and
    // its nodes waited a minute for slots the coordinator could not make yet
    let slots: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
    let of_run = ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={}", cfg.run));
    let _ = slots
        .delete_collection(&DeleteParams::default(), &of_run)
        .await;
    eventually(60, "old fleet slots gone", || async {
        slots
            .list(&of_run)
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    futures_util::stream::iter(names.iter().cloned())
        .for_each_concurrent(32, |n| {
            let nodes = nodes.clone();
            let run = cfg.run.clone();
            async move {
                let node: KubeNode = serde_json::from_value(serde_json::json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": n, "labels": {"fleet": run}},
                }))
                .unwrap();
                nodes.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .await;

    // the artifact, served from its own directory (the agents may run in other processes)
    let art_world = world();
    let art = art_world.art.join("fleet.tgz");
    let bytes = tar_gz(&[Entry::File("containerd-shim-fleet-v2", real_elf(), 0o755)]);
    std::fs::write(&art, &bytes).unwrap();
    let url = format!("file://{}", art.display());

    let t0 = Instant::now();
    let t0_wall = procs::wall_ns();
    let shared: SharedRef = Arc::default();
    shared.lock().unwrap().n = n_of(cfg);
    let deleted: BTreeSet<String> = cfg.deleted.iter().map(|i| names[*i].clone()).collect();
    let n_slots = n_of(cfg);
    let checker = tokio::spawn(checker(
        admin.clone(),
        cfg.run.clone(),
        deleted.clone(),
        shared.clone(),
        t0,
    ));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let workers = cfg.agents > cfg.per_process;
    // in this process: every node's host and agent; with workers, none
    let mine = if workers { 0..0 } else { 0..cfg.agents };
    let (worlds, hosts) = make_hosts(cfg, mine, &shared, t0, &admin);
    let agents = async {
        if workers {
            procs::run_workers(cfg, &shared, t0_wall, stop_rx).await;
        } else {
            run_agents(env, cfg, &worlds, &hosts, stop_rx).await;
        }
    };
    let shims: Api<shim_agent::api::Shim> = Api::all(admin.clone());
    let body = async {
        if let Some(probe) = &cfg.idle_probe {
            tokio::time::sleep(probe.settle).await;
            let p = probe.sample.clone();
            tokio::task::spawn_blocking(move || p()).await.unwrap();
            tokio::time::sleep(probe.window).await;
            let p = probe.sample.clone();
            tokio::task::spawn_blocking(move || p()).await.unwrap();
        }
        let yaml = shim_yaml(cfg, &url, &sha256_hex(&bytes));
        let (ok, out) = env.apply(&yaml);
        assert!(ok, "{out}");
        let label = node_label(&cfg.run);
        let expected = cfg.agents - cfg.failing.len() - cfg.deleted.len() - cfg.refused;
        let deadline = t0 + cfg.deadline;
        let leases: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
        let coordinator = || async {
            leases
                .get(shim_agent::cluster::COORDINATOR_LEASE)
                .await
                .ok()
                .and_then(|l| l.spec.holder_identity)
        };
        let mut resized = false;
        let mut failover: Option<(String, Option<Instant>)> = None;
        let mut resumed = false;
        let mut last_status;
        loop {
            let installed = nodes
                .list(&lp)
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .filter(|n| n.labels().get(&label).map(String::as_str) == Some("true"))
                        .count()
                })
                .unwrap_or(0);
            let status = shims.get(&cfg.run).await.ok().and_then(|s| s.status);
            let halted = status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "RolloutHalted"))
                .is_some_and(|c| c.status == "True");
            last_status = status;
            if let Some((after, mu)) = &cfg.resize
                && !resized
                && installed >= *after
            {
                let patch = serde_json::json!({"spec": {"rolloutStrategy": {"rolling": {"maxUpdate": serde_yaml::from_str::<serde_json::Value>(mu).unwrap()}}}});
                merge_patch(&shims, &cfg.run, &patch).await;
                resized = true;
            }
            let restarting = shared.lock().unwrap().restarting;
            if cfg.failover_on_halt && halted && !resumed {
                match &mut failover {
                    None => {
                        // kill the coordinator (it stays down until a successor took over)
                        if let Some(c) = coordinator().await
                            && let Some(i) = names.iter().position(|n| *n == c)
                        {
                            // down past the lease, so a successor must take over
                            hosts[i].down_for.set(Duration::from_secs(8));
                            hosts[i].crash.notify_one();
                            failover = Some((c, None));
                        }
                    }
                    Some((old, since)) => {
                        let now_c = coordinator().await;
                        if since.is_none() && now_c.as_ref().is_some_and(|c| c != old) {
                            *since = Some(Instant::now());
                        }
                        if since.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
                            let patch = serde_json::json!({"metadata": {"annotations": {shim_agent::cluster::slots::RESUME_ANNOTATION: "fleet-test-1"}}});
                            merge_patch(&shims, &cfg.run, &patch).await;
                            resumed = true;
                        }
                    }
                }
            }
            if failover.is_some() && !resumed && !halted {
                shared
                    .lock()
                    .unwrap()
                    .violations
                    .push("the halt was lost on a coordinator failover".into());
            }
            let stale = leases
                .list(&ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={}", cfg.run)))
                .await
                .map(|l| {
                    l.items.iter().any(|x| {
                        x.spec
                            .holder_identity
                            .as_ref()
                            .is_some_and(|h| deleted.contains(h))
                    })
                })
                .unwrap_or(true);
            // the nodes an extension refuses count too, once they failed: a run that stopped at
            // the last install stopped some of them before they tried (the tests read their
            // Events afterwards)
            let failed = last_status
                .as_ref()
                .and_then(|s| s.nodes.as_ref())
                .map_or(0, |n| n.failed.max(0) as usize);
            let done = expected > 0 && installed >= expected && failed >= cfg.refused && !stale;
            let halt_done = halted && restarting == 0 && !cfg.failover_on_halt;
            let resume_done = resumed && !halted;
            if done || halt_done || resume_done || Instant::now() > deadline {
                if failover.is_some() && !resumed {
                    shared
                        .lock()
                        .unwrap()
                        .violations
                        .push("no successor coordinator kept the halt before the deadline".into());
                }
                if stale && Instant::now() > deadline {
                    shared
                        .lock()
                        .unwrap()
                        .violations
                        .push("a deleted Node still holds its slot".into());
                }
                let _ = stop_tx.send(true);
                return (installed, halted || resumed, last_status);
            }
            // a list of every Node: a quarter second up to 1000 of them, slower beyond
            tokio::time::sleep(Duration::from_millis(
                250 * cfg.agents.div_ceil(1000) as u64,
            ))
            .await;
        }
    };
    let ((installed, halted, status), _) = tokio::join!(body, agents);
    let elapsed = t0.elapsed();
    // leave the cluster as it was: the Shim (its slots go with it) and the Nodes
    force_delete_shim(&admin, &cfg.run).await;
    let _ = nodes.delete_collection(&DeleteParams::default(), &lp).await;
    // the deleted Nodes' slots are freed by the coordinator: checked once the agents stopped
    checker.abort();
    let mut s = shared.lock().unwrap();
    if workers {
        s.recount();
    }
    FleetReport {
        slots: n_slots,
        elapsed,
        installed,
        peak_restarting: s.peak_restarting,
        peak_holders: s.peak_holders,
        restarts: s.restarts,
        halted,
        slot_events: s.slot_events,
        violations: s.violations.clone(),
        status,
        timeline: s.timeline.clone(),
        handoffs: s.handoffs(),
        handoff_parts: s.handoff_parts(),
        ends_to_release: s.ends_to_release(),
        targeted: s.targeted.clone(),
    }
}

/// Merge `patch` into the Shim `name` (the run's resize and resume).
async fn merge_patch(shims: &Api<shim_agent::api::Shim>, name: &str, patch: &serde_json::Value) {
    shims
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(patch),
        )
        .await
        .unwrap();
}

/// Delete a Shim whatever state it is in, and wait until it is gone.
async fn force_delete_shim(admin: &Client, name: &str) {
    let api = Api::<shim_agent::api::Shim>::all(admin.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    let patch = serde_json::json!({"metadata": {"finalizers": null}});
    let _ = api
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await;
    eventually(30, "the old fleet Shim gone", || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// N for the run's maxUpdate.
pub fn n_of(cfg: &FleetConfig) -> usize {
    let m = cfg.max_update.trim_matches('"');
    match m.strip_suffix('%') {
        Some(p) => (cfg.agents * p.parse::<usize>().unwrap() / 100).max(1),
        None => m.parse().unwrap(),
    }
}
