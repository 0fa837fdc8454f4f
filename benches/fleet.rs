//! Rollouts of a whole fleet on the real API server (tests/support/fleet.rs: the real agent
//! code per node, simulated hosts whose containerd restart takes T).
//!
//! For each run: total time against the ideal ⌈E/N⌉·T; API writes and watch events per node
//! (from the API server's own `/metrics`: `apiserver_request_total`,
//! `apiserver_watch_events_total` and `apiserver_watch_events_sizes`, before and after); 409 conflicts on slot Leases per slot
//! hand-off; the API server's CPU time and peak resident memory (from /proc); the peak of
//! concurrent restarts (must be ≤ N). The concurrency timeline of one run goes to
//! `target/fleet-timeline-<agents>-<maxUpdate>.csv` for `docs/plot-rollout`.
//!
//! `cargo bench --bench fleet` runs `FLEET_RUNS` (default `1000:1,1000:10,1000:5%,1000:50`,
//! each `agents:maxUpdate`) with `FLEET_RESTART_MS` (default 500). Needs the kube env.
//! A run of more agents than
//! `FLEET_AGENTS_PER_PROCESS` (default 1000) runs them in worker processes of that many each
//! (`tests/support/fleet/procs.rs`): one process holds 20,000 descriptors here.
//!
//! `FLEET_IDLE_SECS=120` (default off) first measures the settled fleet's idle cost over that
//! window, before the Shim is applied (`FLEET_SETTLE_SECS`, default 30, after the agents
//! start): watch events per node per minute, by resource. The run's figures then count from
//! the Shim's arrival (without the window, from the start: the agents' set-up too), and
//! "events/node beyond idle" takes the idle rate times the run's minutes off its watch
//! events: what the rollout itself cost each node. The machine's busy share (`/proc/stat`,
//! all cores) says whether the run was short of CPU.
//!
//! `FLEET_APISERVERS=K` (default 1) runs an HA control plane: K - 1 replicas of the kube env's
//! API server on its etcd (`tests/support/apiservers.rs`). Worker process `w` (a run of more
//! than `FLEET_AGENTS_PER_PROCESS` agents) connects its agents to server `w mod K`; the
//! coordinator candidates (worker 0) and the checker use the first. The API server figures
//! are sums over the K servers (the peak memory a sum of each one's peak).

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::apiservers::ApiServers;
use support::fleet::{FleetConfig, FleetReport, IdleProbe, run_fleet};
use support::kube::{KubeEnv, kube_env};

/// Counters of the API servers' /metrics, summed over the servers by (name, a few labels).
fn metrics(env: &KubeEnv, servers: &ApiServers) -> BTreeMap<String, f64> {
    let texts = servers.metrics(env);
    let mut out = BTreeMap::new();
    let lines = texts.iter().flat_map(|t| t.lines());
    for line in lines.filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let v: f64 = value.parse().unwrap_or(0.0);
        let label = |name: &str| {
            key.split([',', '{', '}'])
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|x| x.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        if key.starts_with("apiserver_request_total{") {
            let verb = label("verb");
            let code = label("code");
            let res = label("resource");
            if matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE") {
                *out.entry("writes".into()).or_default() += v;
                *out.entry(format!("writes:{res}")).or_default() += v;
            }
            if code == "409" && res == "shimleases" {
                *out.entry("conflicts".into()).or_default() += v;
            }
        } else if key.starts_with("apiserver_watch_events_total{") {
            *out.entry("watch_events".into()).or_default() += v;
            let what = [label("resource"), label("kind")].concat();
            *out.entry(format!("watch_events:{what}")).or_default() += v;
        } else if key.starts_with("apiserver_watch_events_sizes_sum{") {
            *out.entry("watch_bytes".into()).or_default() += v;
        }
    }
    out
}

/// (busy, all) CPU ticks of the whole machine so far (`/proc/stat`; idle and iowait are not
/// busy).
fn machine_ticks() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let all: f64 = f.iter().take(8).sum();
    let idle = f.get(3).unwrap_or(&0.0) + f.get(4).unwrap_or(&0.0);
    (all - idle, all)
}

/// The most sockets the API servers held at once, sampled every second until `done` is set.
fn peak_sockets(
    servers: Arc<ApiServers>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut peak = 0;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(servers.sockets());
            std::thread::sleep(Duration::from_secs(1));
        }
        peak
    })
}

/// "p50 / p90 ms" of hand-off times in seconds.
fn percentiles(xs: &[f64]) -> String {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .map(|x| x * 1000.0)
    };
    match (at(0.5), at(0.9)) {
        (Some(a), Some(b)) => format!("{a:.0} / {b:.0} ms"),
        _ => "-".into(),
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

type Metrics = BTreeMap<String, f64>;

/// What the counters said at one moment: the API server's metrics, its CPU seconds, the
/// machine's (busy, all) ticks.
struct Sample {
    at: Instant,
    metrics: Metrics,
    apiserver_cpu: f64,
    machine: (f64, f64),
}

fn sample(env: &KubeEnv, servers: &ApiServers) -> Sample {
    Sample {
        metrics: metrics(env, servers),
        apiserver_cpu: servers.usage().0,
        machine: machine_ticks(),
        at: Instant::now(),
    }
}

/// The fleet's idle cost, sampled before the Shim arrives (`FLEET_IDLE_SECS`, after
/// `FLEET_SETTLE_SECS` for the agents to list and watch): at the window's two ends.
type IdleSamples = std::sync::Arc<std::sync::Mutex<Vec<Sample>>>;

fn idle_probe(
    env: &'static KubeEnv,
    servers: &Arc<ApiServers>,
    samples: &IdleSamples,
) -> Option<IdleProbe> {
    let servers = servers.clone();
    let window = env_u64("FLEET_IDLE_SECS").filter(|s| *s > 0)?;
    let samples = samples.clone();
    Some(IdleProbe {
        settle: Duration::from_secs(env_u64("FLEET_SETTLE_SECS").unwrap_or(30)),
        window: Duration::from_secs(window),
        sample: std::sync::Arc::new(move || {
            let s = sample(env, &servers);
            samples.lock().unwrap().push(s);
        }),
    })
}

/// What a run measured beside the fleet's own report.
struct Measured {
    /// Metric deltas of the run: from its start, or with an idle window from the window's
    /// end (the Shim's arrival).
    d: Metrics,
    /// The run's wall time, as long as `d`.
    wall: Duration,
    /// Per node per minute over the idle window, by watched resource (and "" for all).
    idle: Option<Metrics>,
    apiserver_cpu: f64,
    apiserver_hwm: f64,
    /// The machine's busy share over the run (all cores), as long as `d`.
    machine_busy: f64,
    peak_sockets: usize,
}

fn delta(after: &Metrics, before: &Metrics) -> Metrics {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).unwrap_or(&0.0)))
        .collect()
}

fn measure(
    env: &'static KubeEnv,
    servers: &Arc<ApiServers>,
    rt: &tokio::runtime::Runtime,
    cfg: &mut FleetConfig,
) -> (FleetReport, Measured) {
    let samples = IdleSamples::default();
    cfg.idle_probe = idle_probe(env, servers, &samples);
    let start = sample(env, servers);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = peak_sockets(servers.clone(), done.clone());
    let r = rt.block_on(run_fleet(env, cfg));
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak_sockets = sampler.join().unwrap_or(0);
    let end = sample(env, servers);
    let hwm = servers.usage().2;
    let samples = samples.lock().unwrap();
    // with an idle window: the run from the Shim's arrival (the window's end) on
    let (from, idle) = match samples.as_slice() {
        [a, b] => {
            let per = cfg.agents as f64 * b.at.duration_since(a.at).as_secs_f64() / 60.0;
            let rates = delta(&b.metrics, &a.metrics);
            (
                b,
                Some(rates.into_iter().map(|(k, v)| (k, v / per)).collect()),
            )
        }
        _ => (&start, None),
    };
    let measured = Measured {
        d: delta(&end.metrics, &from.metrics),
        wall: end.at.duration_since(from.at),
        idle,
        apiserver_cpu: end.apiserver_cpu - from.apiserver_cpu,
        apiserver_hwm: hwm,
        machine_busy: (end.machine.0 - from.machine.0) / (end.machine.1 - from.machine.1).max(1.0)
            * 100.0,
        peak_sockets,
    };
    (r, measured)
}

/// "6.28 (nodes 1.03, pods 1.02, …, other 0.31)": watch events per node (per minute, for a
/// rate) by resource; the resources under 0.1 together as "other" (the control plane's own
/// watches, shared by the fleet).
fn by_resource(per_node: &Metrics) -> String {
    let all = per_node.get("watch_events").copied().unwrap_or(0.0);
    let each = per_node
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("watch_events:")?, *v)));
    let (shown, other): (Vec<_>, Vec<_>) = each.partition(|(_, v)| *v >= 0.1);
    let mut parts: Vec<String> = shown.iter().map(|(k, v)| format!("{k} {v:.2}")).collect();
    parts.push(format!(
        "other {:.2}",
        other.iter().map(|x| x.1).sum::<f64>()
    ));
    format!("{all:.2} ({})", parts.join(", "))
}

fn main() {
    // a worker process of a run split over several (FLEET_AGENTS_PER_PROCESS)
    if support::fleet::procs::worker_main() {
        return;
    }
    let Some(env) = kube_env() else {
        eprintln!("no kube env: nothing measured");
        return;
    };
    let runs =
        std::env::var("FLEET_RUNS").unwrap_or_else(|_| "1000:1,1000:10,1000:5%,1000:50".into());
    let restart = Duration::from_millis(env_u64("FLEET_RESTART_MS").unwrap_or(500));
    // errors only (RUST_LOG to see more): the fleet's test default would print the
    // coordinator's every decision here
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // an HA control plane: replicas of the API server on the same etcd, the worker
    // processes' agents spread across them
    let count = env_u64("FLEET_APISERVERS").unwrap_or(1).max(1) as usize;
    let servers = Arc::new(ApiServers::start(env, count));
    println!(
        "| agents | maxUpdate | N | T | total | ideal ⌈E/N⌉·T | vs ideal | writes/node | watch events/node | watch KiB/node | per node per minute | 409s per hand-off | hand-off p50 / p90 | apiserver CPU | apiserver RSS peak | apiserver sockets peak | machine CPU busy | peak restarting | violations | idle events/node/min | events/node beyond idle |"
    );
    println!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for (k, spec) in runs.split(',').enumerate() {
        let (agents, mu) = spec.split_once(':').expect("agents:maxUpdate");
        let agents: usize = agents.parse().unwrap();
        let mu_yaml = if mu.ends_with('%') {
            format!("\"{mu}\"")
        } else {
            mu.to_string()
        };
        let mut cfg = FleetConfig::new(&format!("bench-{k}"), agents, &mu_yaml, restart);
        cfg.deadline = Duration::from_secs(3600);
        // all as the admin: no certificate to mint per node (the tests run the real identities)
        cfg.node_identities = false;
        // the agent's own defaults: status at most every 2 s, 15 s coordinator lease
        cfg.coordinator = shim_agent::cluster::coordinator::CoordinatorConfig::default();
        // one process holds 20,000 descriptors here: larger fleets run in worker processes
        cfg.per_process = env_u64("FLEET_AGENTS_PER_PROCESS").unwrap_or(1000) as usize;
        cfg.apiservers = servers
            .servers
            .iter()
            .map(|s| s.kubeconfig.clone())
            .collect();
        let (r, m) = measure(env, &servers, &rt, &mut cfg);
        report(agents, mu, restart, &r, &m);
        if k == 0 || std::env::var_os("FLEET_TIMELINE_ALL").is_some() {
            write_timeline(agents, mu, &r);
        }
    }
}

/// One row of the table (stdout) and the hand-off parts and violations (stderr).
fn report(agents: usize, mu: &str, restart: Duration, r: &FleetReport, m: &Measured) {
    let d = |k: &str| m.d.get(k).copied().unwrap_or(0.0);
    let n = r.slots;
    let ideal = restart.as_secs_f64() * agents.div_ceil(n) as f64;
    // the rollout proper: from the first restart to the last (set-up excluded)
    let first = r.timeline.iter().find(|x| x.1 > 0).map(|x| x.0);
    let last = r.timeline.iter().rev().find(|x| x.1 > 0).map(|x| x.0);
    let rollout = match (first, last) {
        (Some(a), Some(b)) => b - a + restart.as_secs_f64(),
        _ => 0.0,
    };
    // per minute of the span counted
    let wall = m.wall.as_secs_f64();
    let minutes = wall / 60.0;
    let handoffs = r.restarts.saturating_sub(n).max(1) as f64;
    let events = d("watch_events") / agents as f64;
    let (idle, beyond) = match &m.idle {
        Some(i) => {
            let rate = i.get("watch_events").copied().unwrap_or(0.0);
            (by_resource(i), format!("{:.0}", events - rate * minutes))
        }
        None => ("-".into(), "-".into()),
    };
    println!(
        "| {agents} | {mu} | {n} | {:.1} s | {rollout:.1} s (counted over {wall:.1} s) | {ideal:.1} s | {:+.1} % | {:.1} | {events:.0} | {:.0} | {:.0} events, {:.0} KiB | {:.3} | {} | {:.0} s ({:.0} % of one core) | {:.0} MiB | {} | {:.0} % | {} | {} | {idle} | {beyond} |",
        restart.as_secs_f64(),
        (rollout / ideal - 1.0) * 100.0,
        d("writes") / agents as f64,
        d("watch_bytes") / 1024.0 / agents as f64,
        events / minutes,
        d("watch_bytes") / 1024.0 / agents as f64 / minutes,
        d("conflicts") / handoffs,
        percentiles(&r.handoffs),
        m.apiserver_cpu,
        m.apiserver_cpu / wall * 100.0,
        m.apiserver_hwm,
        m.peak_sockets,
        m.machine_busy,
        r.peak_restarting,
        r.violations.len(),
    );
    let total: Metrics =
        m.d.iter()
            .map(|(k, v)| (k.clone(), v / agents as f64))
            .collect();
    eprintln!(
        "watch events per node by resource, the run: {}",
        by_resource(&total)
    );
    eprintln!(
        "hand-off parts, {agents} agents, N = {n}: release → take {}, take → restart {}; restart end → release {}",
        percentiles(&r.handoff_parts.0),
        percentiles(&r.handoff_parts.1),
        percentiles(&r.ends_to_release)
    );
    if !r.violations.is_empty() {
        eprintln!("violations: {:#?}", r.violations);
    }
}

/// The concurrency timeline of a run, for `docs/plot-rollout`.
fn write_timeline(agents: usize, mu: &str, r: &FleetReport) {
    let mut csv = String::from("seconds,restarting,holders\n");
    for (s, a, b) in &r.timeline {
        csv.push_str(&format!("{s:.3},{a},{b}\n"));
    }
    let path = format!(
        "target/fleet-timeline-{agents}-{}.csv",
        mu.replace('%', "pct")
    );
    // the working directory's target/, made if missing (a fresh checkout has none)
    std::fs::create_dir_all("target").unwrap();
    std::fs::write(&path, csv).unwrap();
    eprintln!("timeline: {path}");
}
