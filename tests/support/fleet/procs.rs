//! A fleet over several processes. One process holds at most 20,000 file descriptors here (a
//! hard limit), and each in-process agent holds a few (its connection, inotify instances,
//! state files), so past about 1000 agents the run is split: the parent creates the Nodes and
//! the Shim and runs the checker, and worker processes (this same binary, started with
//! `FLEET_WORKER` set) run the agents, `FleetConfig::per_process` each, with the real agent
//! code as in one process. Each worker reports every restart's start and end, stamped with
//! the wall clock (one clock for every process of the machine), and every violation it sees,
//! one line each on its stdout; the parent counts the restarts in time order.

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use super::super::kube::kube_env;
use super::agents::{make_hosts, run_agents};
use super::check::SharedRef;
use super::{FleetConfig, fast};

/// Set in a worker process: its share of the run, as JSON.
pub const WORKER_ENV: &str = "FLEET_WORKER";

/// What a worker runs: the nodes `lo..hi` of the run `run`.
#[derive(Debug, Serialize, Deserialize)]
struct WorkerSpec {
    run: String,
    agents: usize,
    max_update: String,
    lo: usize,
    hi: usize,
    restart_ms: u64,
    /// The agent's default coordinator timings (benchmarks), else the tests' fast ones.
    default_coordinator: bool,
    /// The admin kubeconfig of the API server this worker's agents use (else the kube env's).
    apiserver: Option<std::path::PathBuf>,
}

/// Nanoseconds on the wall clock: comparable between the processes of one machine.
pub fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// In a worker process (`FLEET_WORKER` set): run its share of the agents until the parent
/// kills it, and return true. Elsewhere return false at once.
pub fn worker_main() -> bool {
    let Ok(spec) = std::env::var(WORKER_ENV) else {
        return false;
    };
    let spec: WorkerSpec = serde_json::from_str(&spec).expect("FLEET_WORKER: a worker spec");
    let env = kube_env().expect("a fleet worker needs the kube env");
    let mut cfg = FleetConfig::new(
        &spec.run,
        spec.agents,
        &spec.max_update,
        Duration::from_millis(spec.restart_ms),
    );
    cfg.node_identities = false;
    cfg.apiservers = spec.apiserver.iter().cloned().collect();
    cfg.coordinator = if spec.default_coordinator {
        shim_agent::cluster::coordinator::CoordinatorConfig::default()
    } else {
        fast()
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let admin = env.admin_client().await;
        let shared: SharedRef = Arc::default();
        shared.lock().unwrap().relay = true;
        let (worlds, hosts) = make_hosts(&cfg, spec.lo..spec.hi, &shared, Instant::now(), &admin);
        let (_stop, stop) = tokio::sync::watch::channel(false);
        run_agents(env, &cfg, &worlds, &hosts, stop).await;
    });
    true
}

/// In the parent: start the workers (this binary again), relay their reports into `shared`
/// until `stop` turns true, then kill them.
pub async fn run_workers(
    cfg: &FleetConfig,
    shared: &SharedRef,
    t0_wall: u128,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let exe = std::env::current_exe().expect("the running binary");
    let default_coordinator = cfg.coordinator.status_interval >= Duration::from_secs(2);
    let mut children = Vec::new();
    let mut readers = Vec::new();
    for (w, lo) in (0..cfg.agents).step_by(cfg.per_process.max(1)).enumerate() {
        let spec = WorkerSpec {
            apiserver: (!cfg.apiservers.is_empty())
                .then(|| cfg.apiservers[w % cfg.apiservers.len()].clone()),
            run: cfg.run.clone(),
            agents: cfg.agents,
            max_update: cfg.max_update.clone(),
            lo,
            hi: (lo + cfg.per_process).min(cfg.agents),
            restart_ms: cfg.restart.as_millis() as u64,
            default_coordinator,
        };
        let mut child = Command::new(&exe)
            .env(WORKER_ENV, serde_json::to_string(&spec).expect("a spec"))
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("a fleet worker started");
        let out = child.stdout.take().expect("its stdout");
        let shared = shared.clone();
        readers.push(std::thread::spawn(move || relayed(out, &shared, t0_wall)));
        children.push(child);
    }
    // until the run ends, or a worker ends early (the run then fails its deadline)
    while !*stop.borrow() {
        if stop.changed().await.is_err() {
            break;
        }
    }
    for child in &mut children {
        let _ = child.kill();
        let _ = child.wait();
    }
    for r in readers {
        let _ = r.join();
    }
}

/// Apply one worker's report lines to `shared` as they come (on a thread of its own).
fn relayed(out: std::process::ChildStdout, shared: &SharedRef, t0_wall: u128) {
    for line in std::io::BufReader::new(out).lines() {
        let Ok(line) = line else { break };
        let (kind, what) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let at = || {
            let ns: u128 = what.parse().unwrap_or(t0_wall);
            ns.saturating_sub(t0_wall) as f64 / 1e9
        };
        match kind {
            "R+" => {
                let t = at();
                let mut s = shared.lock().unwrap();
                s.stamped.push((t, 1));
                s.restarting += 1;
            }
            "R-" => {
                let t = at();
                let mut s = shared.lock().unwrap();
                s.stamped.push((t, -1));
                s.restarting = s.restarting.saturating_sub(1);
            }
            "V" => shared.lock().unwrap().violations.push(what.to_string()),
            _ => eprintln!("fleet worker: {line}"),
        }
    }
}
