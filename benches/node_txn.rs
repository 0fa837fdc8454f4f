//! containerd's unavailability during a live transaction, against a bare
//! `systemctl restart containerd`, in the same run on the node env (real systemd 252 and
//! containerd: Debian's 1.6.20, or an upstream 2.x build); plus the phases of a real install.
//!
//! A poller asks CRI `Status` every 5 ms; "unavailable" is the longest stretch from a
//! failed call to the next successful one. Run: `cargo bench --bench node_txn` with the
//! node env booted (`.ci/node-env/make-rootfs.sh && .ci/node-env/boot.sh`); without it the
//! bench says so and exits. Env `NODE_BENCH_RUNS` (default 7); `NODE_BENCH_ENVS`: env files
//! of several booted nodes (`:`-separated, e.g. a 1.6 and a 2.x one), measured one after the
//! other in the same run and printed side by side.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use shim_agent::api::load::parse_shims;
use shim_agent::artifact::node_platform;
use shim_agent::node::{CriClient, RuntimeHealth};
use shim_agent::profile;
use shim_agent::settings::Settings;
use shim_agent::state::{Origin, Phase};
use shim_agent::txn::real::{CriHealth, SystemdRestarter};
use shim_agent::txn::{Change, Node};
use support::node_env::{self, NodeEnv, RESTART_TIMEOUT, VERIFY_TIMEOUT};

/// Poll CRI until `stop`; return the longest outage.
async fn poll(cri: CriClient, stop: Arc<AtomicBool>) -> Duration {
    let mut worst = Duration::ZERO;
    let mut down_since: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let ok = cri
            .status(Duration::from_millis(200))
            .await
            .is_ok_and(|s| s.runtime_ready);
        match (ok, down_since) {
            (false, None) => down_since = Some(Instant::now()),
            (true, Some(t)) => {
                worst = worst.max(t.elapsed());
                down_since = None;
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if let Some(t) = down_since {
        worst = worst.max(t.elapsed());
    }
    worst
}

async fn measured<F: std::future::Future>(env: &NodeEnv, f: F) -> (F::Output, Duration) {
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn(poll(env.cri.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let out = f.await;
    // let CRI come back fully before stopping the poller
    let _ = env.cri.wait_for_handler("runc", VERIFY_TIMEOUT).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    stop.store(true, Ordering::Relaxed);
    (out, poller.await.unwrap_or_default())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// One node's figures.
struct Figures {
    containerd: String,
    inst_gap: Vec<Duration>,
    uninst_gap: Vec<Duration>,
    bare_gap: Vec<Duration>,
    inst_total: Vec<Duration>,
    overhead: Vec<Duration>,
    phases: BTreeMap<Phase, Vec<Duration>>,
}

async fn bench(env: &NodeEnv, runs: usize) -> Figures {
    for p in ["var/lib/shim-agent", "opt/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2")).expect("runc shim");
    let bytes = support::tar_gz(&[support::Entry::File("containerd-shim-demo-v2", shim, 0o755)]);
    let art = tmp.path().join("demo.tar.gz");
    std::fs::write(&art, &bytes).expect("write artifact");
    let yaml = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: demo}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file://{}\", sha256: {}}}}}\n  runtimeClass: {{name: demo}}\n",
        art.display(),
        support::sha256_hex(&bytes)
    );
    let shim = parse_shims(&yaml, "demo.yaml").expect("shim").remove(0);
    let root = env.host_root();
    let settings = Settings::default();
    let node = Node {
        root: &root,
        settings: &settings,
        profile: profile::builtin("containerd"),
        platform: node_platform(),
        origin: Origin::Cli,
        restarter: SystemdRestarter {
            systemd: env.systemd.clone(),
            timeout: RESTART_TIMEOUT,
        },
        health: CriHealth {
            cri: env.cri.clone(),
            timeout: VERIFY_TIMEOUT,
            check: shim_agent::txn::real::check_place(&root, &settings)
                .expect("the check's directory under the node's root"),
        },
    };

    let mut f = Figures {
        containerd: env.containerd.version.clone(),
        inst_gap: vec![],
        uninst_gap: vec![],
        bare_gap: vec![],
        inst_total: vec![],
        overhead: vec![],
        phases: BTreeMap::new(),
    };
    for _ in 0..runs {
        let (r, gap) = measured(
            env,
            node.apply(vec![Change::Install(Box::new(shim.clone()))]),
        )
        .await;
        let r = r.expect("install");
        f.inst_gap.push(gap);
        let external: Duration = r
            .phases
            .iter()
            .filter(|(p, _)| matches!(p, Phase::Fetched | Phase::Restarted | Phase::Verified))
            .map(|(_, d)| *d)
            .sum();
        let own: Duration = r.phases.iter().map(|(_, d)| *d).sum();
        f.inst_total.push(own);
        f.overhead.push(own - external);
        for (p, d) in r.phases {
            f.phases.entry(p).or_default().push(d);
        }
        let (r, gap) = measured(env, node.apply(vec![Change::Uninstall("demo".into())])).await;
        r.expect("uninstall");
        f.uninst_gap.push(gap);
        let (out, gap) = measured(env, async {
            env.exec(&["systemctl", "restart", "containerd"])
        })
        .await;
        assert!(out.status.success(), "systemctl restart failed");
        f.bare_gap.push(gap);
    }
    f
}

/// `median / max` of a sample.
fn med_max(v: &[Duration]) -> String {
    format!(
        "{} / {}",
        ms(median(v.to_vec())),
        ms(*v.iter().max().expect("runs > 0"))
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("NODE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let env_files: Vec<Option<PathBuf>> = match std::env::var("NODE_BENCH_ENVS") {
        Ok(v) if !v.is_empty() => v.split(':').map(|f| Some(PathBuf::from(f))).collect(),
        _ => vec![None],
    };
    let mut all = vec![];
    for file in &env_files {
        let Some(env) = node_env::node_env_at("bench_node_txn", file.as_deref()).await else {
            println!("node_txn bench: no node env running; boot it with .ci/node-env/boot.sh");
            return;
        };
        all.push(bench(&env, runs).await);
    }
    println!(
        "node_txn bench: {runs} runs each on the node env (systemd 252), CRI polled every 5 ms"
    );
    let row = |what: &str, cell: &dyn Fn(&Figures) -> String| {
        let cells: Vec<String> = all.iter().map(cell).collect();
        println!("| {what} | {} |", cells.join(" | "));
    };
    row("containerd", &|f| f.containerd.clone());
    println!("|---|{}", "---:|".repeat(all.len()));
    row(
        "CRI unavailable, install (one restart), median / max",
        &|f| med_max(&f.inst_gap),
    );
    row(
        "CRI unavailable, uninstall (one restart), median / max",
        &|f| med_max(&f.uninst_gap),
    );
    row(
        "CRI unavailable, bare systemctl restart, median / max",
        &|f| med_max(&f.bare_gap),
    );
    row("install total (all phases), median", &|f| {
        ms(median(f.inst_total.clone()))
    });
    row(
        "agent overhead (minus fetch, restart, CRI), median / max",
        &|f| med_max(&f.overhead),
    );
    let phases: Vec<Phase> = all[0].phases.keys().copied().collect();
    for p in phases {
        row(&format!("install phase {p:?}, median"), &|f| {
            f.phases
                .get(&p)
                .map_or("-".to_string(), |d| ms(median(d.clone())))
        });
    }
}
