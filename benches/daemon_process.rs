//! The real agent process, idle with 50 Shims: `shim-agent run` as its own process, talking to
//! the node env's real systemd (D-Bus) and containerd (CRI), and to the kube env's real API
//! server with a node identity. Its resident memory and CPU are read from /proc after the 50
//! Shims are installed (one containerd restart) and labelled, over an idle window.
//!
//! `cargo bench --bench daemon_process` (env `DAEMON_BENCH_IDLE_SECS`, default 60). Needs the
//! node env (booted with `INFRA_NETWORK=host`, see .ci/node-env/README.md) and the kube env.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::cluster::node_label;
use support::node_env;

const NODE: &str = "bench-process";

fn proc_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(bench());
}

async fn bench() {
    let Some(kube_env) = support::kube::kube_env() else {
        eprintln!("daemon_process bench: no kube env (set KUBE_ENV_DIR)");
        return;
    };
    let Some(env) = node_env::node_env("daemon_process bench").await else {
        return;
    };
    let idle_secs: u64 = std::env::var("DAEMON_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let admin = kube_env.admin_client().await;
    remove_shims(&admin).await;
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
    kube_env.create_node(NODE, &[("bench", "process")]).await;
    let kubeconfig = kube_env.node_identity(NODE);
    let w = support::live::world();
    let config = w.art.join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[node]\nname = \"{NODE}\"\n[kubernetes]\nkubeconfig = \"{}\"\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(w.art.join("agent.log")).unwrap();
    let mut agent = std::process::Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .arg("--config")
        .arg(&config)
        .args(["run", "--root"])
        .arg(&env.root)
        .arg("--live")
        .env("DBUS_SYSTEM_BUS_ADDRESS", &env.bus)
        .env("CONTAINERD_ADDRESS", env.cri.socket())
        .env_remove("SHIM_AGENT_CONFIG")
        .stderr(log)
        .spawn()
        .unwrap();
    let pid = agent.id();

    let names: Vec<String> = (0..50).map(|i| format!("bench-proc-{i:02}")).collect();
    let docs: Vec<String> = names
        .iter()
        .map(|n| support::live::shim_yaml(&w, n, "1", ("bench", "process")))
        .collect();
    let (ok, out) = kube_env.apply(&docs.join("---\n"));
    assert!(ok, "{out}");
    let t = Instant::now();
    let nodes: Api<KubeNode> = Api::all(admin.clone());
    loop {
        let n = nodes.get(NODE).await.unwrap();
        if names
            .iter()
            .all(|s| n.labels().get(&node_label(s)).is_some_and(|v| v == "true"))
        {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(180),
            "50 Shims not labelled; agent log: {}",
            std::fs::read_to_string(w.art.join("agent.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    println!(
        "real agent process: 50 Shims installed in the node env's containerd and labelled in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (cpu0, t0) = (cpu_ticks(pid), Instant::now());
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let (cpu1, secs) = (cpu_ticks(pid), t0.elapsed().as_secs_f64());
    println!(
        "idle {secs:.0} s: RSS {:.1} MiB (heap and stacks {:.1} MiB, mapped binary and libraries {:.1} MiB; peak {:.1} MiB), CPU {:.2}% of one core, {} threads",
        proc_field(pid, "VmRSS:") as f64 / 1024.0,
        proc_field(pid, "RssAnon:") as f64 / 1024.0,
        proc_field(pid, "RssFile:") as f64 / 1024.0,
        proc_field(pid, "VmHWM:") as f64 / 1024.0,
        (cpu1 - cpu0) as f64 / secs,
        proc_field(pid, "Threads:")
    );
    let _ = std::process::Command::new("kill")
        .arg(pid.to_string())
        .status();
    let _ = agent.wait();
    remove_shims(&admin).await;
    for p in ["var/lib/shim-agent", "opt/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
    env.reset().await;
}

async fn remove_shims(admin: &Client) {
    let shims: Api<Shim> = Api::all(admin.clone());
    for s in shims.list(&Default::default()).await.unwrap().items {
        let n = s.name_any();
        if n.starts_with("bench-proc-") {
            let patch = serde_json::json!({"metadata": {"finalizers": null}});
            let _ = shims
                .patch(&n, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            let _ = shims.delete(&n, &Default::default()).await;
        }
    }
}
