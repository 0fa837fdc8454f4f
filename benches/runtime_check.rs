//! The cost of proving a new handler (docs/design.md §3, the check) on the node env, beside a
//! bare pod sandbox through runc in the same run: a `RunPodSandbox` of containerd's default
//! handler, its status, stop and remove, with nothing else.
//!
//! Measured, alternately, `NODE_BENCH_RUNS` times (default 15) each:
//! - bare: `RunPodSandbox` (runc) to ready, and the whole cycle with stop and remove;
//! - check: the agent's check of a runc-class shim installed by the agent (the node's runc shim
//!   as `containerd-shim-demo-v2`): its sandbox to ready, and the whole check (the sandbox
//!   image looked up, the sandbox, its status, stop, remove, the sweep of its id, the log
//!   directory);
//! - check with a container: the same with a busybox check container that prints and exits.
//!
//! Run: `cargo bench --bench runtime_check` with a node env booted (`.ci/node-env/`); without
//! one the bench says so and exits. `NODE_BENCH_ENVS`: env files of several booted nodes
//! (`:`-separated), measured one after the other.

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use shim_agent::api::load::parse_shims;
use shim_agent::node::check::{self, HandlerCheck};
use shim_agent::node::cri::proto;
use shim_agent::settings::Settings;
use shim_agent::txn::Change;
use shim_agent::txn::real::check_place;
use support::node_env::{self, CHECK_IMAGE, NodeEnv};
use support::shim_builder::ShimBuilder;

const CALL: Duration = Duration::from_secs(30);

fn runs() -> usize {
    std::env::var("NODE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

/// A bare sandbox through containerd's default handler (runc): to ready, and the whole cycle.
async fn bare(env: &NodeEnv, i: usize) -> (Duration, Duration) {
    let id = format!("bare-{i}-{}", std::process::id());
    let config = check::check_sandbox_config("bare", &id, "");
    let t0 = Instant::now();
    let sandbox = env
        .cri
        .try_run_pod_sandbox(config, "", CALL)
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox (runc): {e}"));
    let st = env
        .cri
        .try_pod_sandbox_status(&sandbox, CALL)
        .await
        .unwrap();
    assert_eq!(st.status.map(|s| s.state), Some(proto::SANDBOX_READY));
    let ready = t0.elapsed();
    env.cri
        .stop_and_remove_sandbox(&sandbox, CALL)
        .await
        .unwrap_or_else(|e| panic!("stop and remove: {e}"));
    (ready, t0.elapsed())
}

fn stats(label: &str, mut v: Vec<Duration>) {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "  {label:<44} p50 {:>6.1} ms   min {:>6.1}   max {:>6.1}   (n = {})",
        ms(v[v.len() / 2]),
        ms(v[0]),
        ms(v[v.len() - 1]),
        v.len()
    );
}

async fn bench(env: &NodeEnv, runs: usize) {
    for p in ["var/lib/shim-agent", "opt/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2")).expect("runc shim");
    let bytes = support::tar_gz(&[support::Entry::File("containerd-shim-demo-v2", shim, 0o755)]);
    let art = tmp.path().join("demo.tar.gz");
    std::fs::write(&art, &bytes).expect("write artifact");
    let yaml = ShimBuilder::new("demo")
        .artifact(
            &format!("file://{}", art.display()),
            &support::sha256_hex(&bytes),
        )
        .yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    let shims = parse_shims(&yaml, "demo.yaml").expect("the demo Shim");
    env.node(&root, &settings)
        .apply(
            shims
                .into_iter()
                .map(|s| Change::Install(Box::new(s)))
                .collect(),
        )
        .await
        .unwrap_or_else(|e| panic!("install demo: {e:#}"));
    let place = check_place(&root, &settings)
        .expect("the check's place")
        .expect("checks on");
    let sandbox_only = HandlerCheck {
        handler: "demo".into(),
        container: None,
    };
    let with_container = HandlerCheck {
        handler: "demo".into(),
        container: Some(check::ContainerCheck {
            image: CHECK_IMAGE.into(),
            command: ["/bin/busybox", "sh", "-c", "echo ok"]
                .map(String::from)
                .to_vec(),
            args: vec![],
            exit_code: 0,
            output_contains: Some("ok".into()),
            timeout: Duration::from_secs(60),
        }),
    };
    let (mut bare_ready, mut bare_total) = (Vec::new(), Vec::new());
    let (mut chk_ready, mut chk_total, mut full_total, mut full_container) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // one of each first, not counted (images and caches warm)
    let _ = bare(env, usize::MAX).await;
    let _ = check::check_handler(&env.cri, &with_container, &place).await;
    for i in 0..runs {
        let (r, t) = bare(env, i).await;
        bare_ready.push(r);
        bare_total.push(t);
        let c = check::check_handler(&env.cri, &sandbox_only, &place)
            .await
            .unwrap_or_else(|e| panic!("check: {e}"));
        chk_ready.push(c.sandbox);
        chk_total.push(c.total);
        let c = check::check_handler(&env.cri, &with_container, &place)
            .await
            .unwrap_or_else(|e| panic!("check with a container: {e}"));
        full_total.push(c.total);
        full_container.push(c.container.unwrap_or_default());
    }
    println!("containerd {}:", env.containerd.version);
    stats("bare RunPodSandbox (runc) to ready", bare_ready);
    stats("bare sandbox cycle (run, status, stop, remove)", bare_total);
    stats("check: sandbox of demo to ready", chk_ready);
    stats("check: whole (image, sandbox, cleanup, sweep)", chk_total);
    stats("check with a container: the container", full_container);
    stats("check with a container: whole", full_total);
    assert!(
        env.check_sandboxes().await.is_empty(),
        "the checks left sandboxes"
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let envs: Vec<Option<PathBuf>> = match std::env::var("NODE_BENCH_ENVS") {
        Ok(v) => v.split(':').map(|p| Some(PathBuf::from(p))).collect(),
        Err(_) => vec![None],
    };
    let runs = runs();
    for file in envs {
        let Some(env) = rt.block_on(node_env::node_env_at(
            "runtime_check bench",
            file.as_deref(),
        )) else {
            println!("no node env: nothing measured");
            return;
        };
        rt.block_on(bench(&env, runs));
    }
}
