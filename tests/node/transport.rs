//! One connection per client, on the real API server: the real agent process on the node env
//! (its systemd and containerd), every watch of it running, holds one TCP connection to the
//! API server (HTTP/2, negotiated by ALPN); given the coordinator's identity as well, it holds
//! one per identity. Counted from /proc: the process's socket inodes against the established
//! connections to the server's port.

use std::collections::HashSet;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Api;

use crate::support::kube::{eventually, kube_env};
use crate::support::node_env::{NodeEnv, node_env};

/// The API server's port, from a kubeconfig's `server:` line.
fn server_port(kubeconfig: &std::path::Path) -> u16 {
    let text = std::fs::read_to_string(kubeconfig).unwrap();
    let server = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("server:"))
        .unwrap()
        .trim();
    server
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap()
}

/// Established TCP connections of process `pid` to `port`.
fn connections(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let remote = format!(":{port:04X}");
    ["tcp", "tcp6"]
        .iter()
        .flat_map(|t| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{t}"))
                .unwrap_or_default()
                .lines()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter(|row| {
            let f: Vec<&str> = row.split_whitespace().collect();
            f.len() > 9 && f[2].ends_with(&remote) && f[3] == "01" && inodes.contains(f[9])
        })
        .count()
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn clean_agent_files(env: &NodeEnv) {
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
}

/// `shim-agent run` on the node env, as node `node`, with these `[kubernetes]` lines.
fn agent(dir: &std::path::Path, env: &NodeEnv, node: &str, kubernetes: &str) -> Agent {
    let config = dir.join("agent.toml");
    std::fs::write(
        &config,
        format!("[node]\nname = \"{node}\"\n[kubernetes]\n{kubernetes}"),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("agent.log")).unwrap();
    Agent(
        Command::new(env!("CARGO_BIN_EXE_shim-agent"))
            .arg("--config")
            .arg(&config)
            .args(["run", "--root"])
            .arg(&env.root)
            .arg("--live")
            .env("DBUS_SYSTEM_BUS_ADDRESS", &env.bus)
            .env("CONTAINERD_ADDRESS", env.cri.socket())
            .env_remove("SHIM_AGENT_CONFIG")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

/// The connection count once it has held still for 3 s (watches started, the first lists
/// done), within 60 s.
fn settled_connections(pid: u32, port: u16, log: &std::path::Path) -> usize {
    let start = Instant::now();
    let mut last = (usize::MAX, Instant::now());
    loop {
        let n = connections(pid, port);
        if n != last.0 {
            last = (n, Instant::now());
        } else if n > 0 && last.1.elapsed() > Duration::from_secs(3) {
            return n;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the connection count did not settle ({n}); agent log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_holds_one_connection_to_the_api_server_for_all_its_watches() {
    let Some(env) = kube_env() else { return };
    let Some(node_env) = node_env("transport").await else {
        return;
    };
    clean_agent_files(&node_env);
    let node = "ntr-node";
    env.create_node(node, &[("test", "ntr")]).await;
    let port = server_port(&env.admin);
    let dir = tempfile::tempdir().unwrap();
    let kubelet = env.node_identity(node);
    let a = agent(
        dir.path(),
        &node_env,
        node,
        &format!("kubeconfig = \"{}\"\n", kubelet.display()),
    );
    // the agent is at work: its Node gets the ShimsReady condition
    let nodes: Api<KubeNode> = Api::all(env.admin_client().await);
    eventually(60, "the agent's ShimsReady condition", || async {
        let n = nodes.get(node).await.ok()?;
        n.status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "containerd.x-k8s.io/ShimsReady")
            .then_some(())
    })
    .await;
    let log = dir.path().join("agent.log");
    let n = settled_connections(a.0.id(), port, &log);
    assert_eq!(n, 1, "a node agent's connections to the API server");
    drop(a);

    // also standing for the coordinator: a second identity, a second connection, no more
    let coordinator = env.coordinator_identity();
    let a = agent(
        dir.path(),
        &node_env,
        node,
        &format!(
            "kubeconfig = \"{}\"\ncoordinator-kubeconfig = \"{}\"\n",
            kubelet.display(),
            coordinator.display()
        ),
    );
    let n = settled_connections(a.0.id(), port, &log);
    assert_eq!(
        n, 2,
        "a node agent and the coordinator: one connection per identity"
    );
    drop(a);
    let _ = nodes.delete(node, &Default::default()).await;
    clean_agent_files(&node_env);
}
