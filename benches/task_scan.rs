//! Cost of the task scan that decides which replaced shim versions to keep
//! (`txn::retain`): read every containerd task bundle's `shim-binary-path` (or a pod
//! container's `sandbox`), then judge the retained versions. It runs after every transaction.
//! Target: under 5 ms with 100 running tasks.
//!
//! - synthetic: `N` bundles in containerd 2.x's layout on tmpfs (as `/run` is), half pod
//!   sandboxes naming their shim, half containers naming their sandbox, 3 retained versions;
//!   baselines in the same run: one `read_dir` of the namespace (the floor) and one state
//!   write (fsync), which every transaction's commit already pays.
//! - real (when a node env is up: `INFRA_ROOT`, `CONTAINERD_ADDRESS`, `INFRA_MACHINE`): `N`
//!   running containers started with `ctr` in the node, scanned through the socket's link
//!   into the container as the node tests do.
//!
//! `cargo bench --bench task_scan` (env `SCAN_BENCH_TASKS`, default "100,1000";
//! `SCAN_BENCH_REAL`, default 100, 0 to skip; `SCAN_BENCH_RUNS`, default 200).

use std::path::Path;
use std::time::{Duration, Instant};

use shim_agent::artifact::node_platform;
use shim_agent::hostroot::HostRoot;
use shim_agent::node::tasks::{SANDBOX_FILE, SHIM_PATH_FILE, TASK_DIR};
use shim_agent::profile;
use shim_agent::settings::Settings;
use shim_agent::state::{NodeState, Origin, RetainedVersion, StateStore};
use shim_agent::txn::Node;
use shim_agent::txn::retain::judge;

/// Stands for containerd: nothing restarts; the state directory is where the bench put it.
#[path = "common/instant_node.rs"]
mod instant_node;
use instant_node::InstantNode;

fn runs() -> usize {
    std::env::var("SCAN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn stats(name: &str, mut xs: Vec<Duration>) {
    xs.sort();
    let pct = |p: usize| xs[(xs.len() * p / 100).min(xs.len() - 1)];
    println!(
        "{name:<44} n={:<4} p50={:>9.1?} p90={:>9.1?} max={:>9.1?}",
        xs.len(),
        pct(50),
        pct(90),
        xs[xs.len() - 1]
    );
}

fn time(runs: usize, mut f: impl FnMut()) -> Vec<Duration> {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect()
}

fn retained() -> Vec<RetainedVersion> {
    (0..3)
        .map(|i| RetainedVersion {
            name: "wasm".into(),
            digest: format!("{i:064}"),
            dir: format!("/opt/shim-agent/shims/wasm/{i:064}"),
            since: 0,
            tasks: vec![],
            task_count: 0,
        })
        .collect()
}

/// `n` bundles under `state/io.containerd.runtime.v2.task/k8s.io/`.
fn synthetic(state: &Path, n: usize) {
    let ns = state.join(TASK_DIR).join("k8s.io");
    for i in 0..n {
        let b = ns.join(format!("{i:064x}"));
        std::fs::create_dir_all(&b).expect("bundle");
        std::fs::write(b.join("config.json"), b"{}").expect("config.json");
        if i % 2 == 0 {
            let v = i % 3;
            std::fs::write(
                b.join(SHIM_PATH_FILE),
                format!("/opt/shim-agent/shims/wasm/{v:064}/containerd-shim-wasmi-v1"),
            )
            .expect("shim-binary-path");
        } else {
            std::fs::write(b.join(SANDBOX_FILE), format!("{:064x}", i - 1)).expect("sandbox");
        }
    }
}

fn main() {
    let settings = Settings::default();
    let runs = runs();
    let counts: Vec<usize> = std::env::var("SCAN_BENCH_TASKS")
        .unwrap_or_else(|_| "100,1000".into())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect();
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() { shm } else { Path::new("/tmp") };
    for n in counts {
        let tmp = tempfile::tempdir_in(base).expect("tempdir");
        let state = tmp.path().join("containerd");
        synthetic(&state, n);
        let root = HostRoot::new(tmp.path()).expect("root");
        let node = Node {
            root: &root,
            settings: &settings,
            profile: profile::builtin("containerd"),
            platform: node_platform(),
            origin: Origin::Cli,
            restarter: InstantNode(None),
            health: InstantNode(Some(state.clone())),
        };
        let versions = retained();
        let installed = Default::default();
        let mut kept = 0;
        stats(
            &format!("scan + judge, {n} tasks (synthetic, tmpfs)"),
            time(runs, || {
                let scan = node.scan_tasks();
                assert_eq!(scan.tasks.len(), n);
                kept = judge(&versions, &scan, &installed).keep.len();
            }),
        );
        assert_eq!(
            kept,
            if n >= 6 { 3 } else { kept },
            "every version has a sandbox"
        );
        let ns = state.join(TASK_DIR).join("k8s.io");
        stats(
            &format!("baseline: read_dir of the namespace, {n}"),
            time(runs, || {
                let c = std::fs::read_dir(&ns).map(|d| d.count()).unwrap_or(0);
                assert_eq!(c, n);
            }),
        );
    }
    // every commit writes the state (temp file, fsync, rename, fsync of the directory)
    let tmp = tempfile::tempdir().expect("tempdir");
    let store = StateStore::open(tmp.path()).expect("store");
    let st = NodeState {
        retained: retained(),
        ..NodeState::default()
    };
    stats(
        "baseline: one state write (fsync), as a commit",
        time(runs.min(50), || store.save(&st).expect("save")),
    );
    real(runs);
}

/// `SCAN_BENCH_REAL` running containers in the node env, scanned as the node tests do.
fn real(runs: usize) {
    let n: usize = std::env::var("SCAN_BENCH_REAL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let (Ok(root), Ok(socket)) = (
        std::env::var("INFRA_ROOT"),
        std::env::var("CONTAINERD_ADDRESS"),
    ) else {
        println!("real node: skipped (no node env: source /var/tmp/node-env/run/<machine>/env)");
        return;
    };
    if n == 0 {
        return;
    }
    let exec = |args: &[&str]| {
        std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/node-env/exec.sh"))
            .args(args)
            .output()
            .expect("exec.sh")
    };
    let ids: Vec<String> = (0..n).map(|i| format!("scan-bench-{i}")).collect();
    let t = Instant::now();
    for id in &ids {
        let out = exec(&[
            "ctr",
            "-n",
            "k8s.io",
            "run",
            "-d",
            "--cpu-shares",
            "0",
            "--rootfs",
            "/srv/bbroot",
            id,
            "/bin/sleep",
            "100000",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!("real node: {n} containers started in {:.1?}", t.elapsed());
    let settings = Settings::default();
    let hroot = HostRoot::new(&root).expect("INFRA_ROOT");
    let dir = std::fs::read_link(&socket)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let node = Node {
        root: &hroot,
        settings: &settings,
        profile: profile::builtin("containerd"),
        platform: node_platform(),
        origin: Origin::Cli,
        restarter: InstantNode(None),
        health: InstantNode(dir),
    };
    let versions = retained();
    let installed = Default::default();
    stats(
        &format!("scan + judge, {n} running containers (node)"),
        time(runs, || {
            let scan = node.scan_tasks();
            assert!(scan.tasks.len() >= n, "{} tasks", scan.tasks.len());
            let _ = judge(&versions, &scan, &installed);
        }),
    );
    for id in &ids {
        let _ = exec(&["ctr", "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id]);
    }
    std::thread::sleep(Duration::from_secs(1));
    for id in &ids {
        let _ = exec(&["ctr", "-n", "k8s.io", "tasks", "rm", "-f", id]);
        let _ = exec(&["ctr", "-n", "k8s.io", "containers", "rm", id]);
    }
}
