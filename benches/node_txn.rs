//! containerd's unavailability during a live transaction, against a bare
//! `systemctl restart containerd`, in the same run on the node env (real systemd 252 and
//! containerd 1.6.20); plus the phases of a real install.
//!
//! A poller asks CRI `Status` every 5 ms; "unavailable" is the longest stretch from a
//! failed call to the next successful one. Run: `cargo bench --bench node_txn` with the
//! node env booted (`.ci/node-env/make-rootfs.sh && .ci/node-env/boot.sh`); without it the
//! bench says so and exits. Env `NODE_BENCH_RUNS` (default 7).

#[path = "../tests/node_env/mod.rs"]
mod node_env;
#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use node_env::{NodeEnv, RESTART_TIMEOUT, VERIFY_TIMEOUT};
use shim_agent::api::load::parse_shims;
use shim_agent::artifact::node_platform;
use shim_agent::node::{CriClient, RuntimeHealth};
use shim_agent::profile;
use shim_agent::settings::Settings;
use shim_agent::state::{Origin, Phase};
use shim_agent::txn::real::{CriHealth, SystemdRestarter};
use shim_agent::txn::{Change, Node};

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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let runs: usize = std::env::var("NODE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let Some(env) = node_env::node_env("bench_node_txn").await else {
        println!("node_txn bench: no node env running; boot it with .ci/node-env/boot.sh");
        return;
    };
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
        },
    };

    let (mut inst_gap, mut uninst_gap, mut bare_gap) = (vec![], vec![], vec![]);
    let (mut inst_total, mut overhead) = (vec![], vec![]);
    let mut phases: std::collections::BTreeMap<Phase, Vec<Duration>> = Default::default();
    for _ in 0..runs {
        let t = Instant::now();
        let (r, gap) = measured(
            &env,
            node.apply(vec![Change::Install(Box::new(shim.clone()))]),
        )
        .await;
        let total = t.elapsed();
        let r = r.expect("install");
        inst_gap.push(gap);
        let external: Duration = r
            .phases
            .iter()
            .filter(|(p, _)| matches!(p, Phase::Fetched | Phase::Restarted | Phase::Verified))
            .map(|(_, d)| *d)
            .sum();
        let own: Duration = r.phases.iter().map(|(_, d)| *d).sum();
        inst_total.push(own);
        overhead.push(own - external);
        let _ = total;
        for (p, d) in r.phases {
            phases.entry(p).or_default().push(d);
        }
        let (r, gap) = measured(&env, node.apply(vec![Change::Uninstall("demo".into())])).await;
        r.expect("uninstall");
        uninst_gap.push(gap);
        let (out, gap) = measured(&env, async {
            env.exec(&["systemctl", "restart", "containerd"])
        })
        .await;
        assert!(out.status.success(), "systemctl restart failed");
        bare_gap.push(gap);
    }
    println!(
        "node_txn bench: {runs} runs each on the node env (systemd 252, containerd 1.6.20), CRI polled every 5 ms"
    );
    println!(
        "CRI unavailable, install (one restart):      median {}  max {}",
        ms(median(inst_gap.clone())),
        ms(*inst_gap.iter().max().unwrap())
    );
    println!(
        "CRI unavailable, uninstall (one restart):    median {}  max {}",
        ms(median(uninst_gap.clone())),
        ms(*uninst_gap.iter().max().unwrap())
    );
    println!(
        "CRI unavailable, bare systemctl restart:     median {}  max {}",
        ms(median(bare_gap.clone())),
        ms(*bare_gap.iter().max().unwrap())
    );
    println!(
        "install total (all phases):                  median {}",
        ms(median(inst_total))
    );
    println!(
        "agent overhead (minus fetch, restart, CRI):  median {}  max {}",
        ms(median(overhead.clone())),
        ms(*overhead.iter().max().unwrap())
    );
    println!("install phases, median:");
    for (p, ds) in phases {
        println!("  {:<10} {}", format!("{p:?}"), ms(median(ds)));
    }
}
