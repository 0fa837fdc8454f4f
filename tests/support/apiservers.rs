//! The kube env's API servers as a benchmark sees them: the one `up.sh` started and, for an
//! HA control plane as large clusters run it, replicas of it on the same etcd (the same
//! command line on another port). Each has an admin kubeconfig of its own, and its process
//! for CPU, memory and socket figures. Replicas stop when this is dropped.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::kube::KubeEnv;

/// One API server: an admin kubeconfig that reaches it and its process (if found).
pub struct ApiServer {
    pub kubeconfig: PathBuf,
    pub pid: Option<u32>,
}

/// The primary and its replicas, primary first.
pub struct ApiServers {
    pub servers: Vec<ApiServer>,
    children: Vec<Child>,
}

/// The replica `i` (from 1) listens on the primary's port plus this and `i`.
const REPLICA_PORT_OFFSET: u16 = 1000;

impl ApiServers {
    /// The kube env's API server and `count - 1` replicas of it, each ready (its `/readyz`).
    pub fn start(env: &KubeEnv, count: usize) -> ApiServers {
        let pid = primary_pid(env);
        let mut me = ApiServers {
            servers: vec![ApiServer {
                kubeconfig: env.admin.clone(),
                pid,
            }],
            children: Vec::new(),
        };
        if count <= 1 {
            return me;
        }
        let pid = pid.expect("the kube env's kube-apiserver process, to start replicas of");
        let args = cmdline(pid);
        let port: u16 = flag(&args, "--secure-port")
            .and_then(|p| p.parse().ok())
            .expect("the primary's --secure-port");
        let admin = std::fs::read_to_string(&env.admin).expect("the admin kubeconfig");
        for i in 1..count {
            let p = port + REPLICA_PORT_OFFSET + i as u16;
            let replaced: Vec<String> = args[1..]
                .iter()
                .map(|a| {
                    if a.starts_with("--secure-port=") {
                        format!("--secure-port={p}")
                    } else {
                        a.clone()
                    }
                })
                .collect();
            let log = std::env::temp_dir().join(format!("kube-apiserver-replica-{p}.log"));
            let out = std::fs::File::create(&log).expect("a replica log");
            let err = out.try_clone().expect("a replica log");
            let child = Command::new(&args[0])
                .args(&replaced)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .spawn()
                .expect("a replica kube-apiserver started");
            let kubeconfig = env
                .admin
                .with_file_name(format!("admin-replica-{p}.kubeconfig"));
            let text = admin.replace(
                &format!("https://127.0.0.1:{port}"),
                &format!("https://127.0.0.1:{p}"),
            );
            assert_ne!(
                text, admin,
                "the admin kubeconfig names https://127.0.0.1:{port}"
            );
            std::fs::write(&kubeconfig, text).expect("the replica's kubeconfig");
            me.servers.push(ApiServer {
                kubeconfig,
                pid: Some(child.id()),
            });
            me.children.push(child);
        }
        for s in &me.servers[1..] {
            ready(env, s);
        }
        me
    }

    /// Every server's `/metrics` text.
    pub fn metrics(&self, env: &KubeEnv) -> Vec<String> {
        self.servers
            .iter()
            .map(|s| {
                let (ok, text) = env.kubectl_as(&s.kubeconfig, &["get", "--raw", "/metrics"]);
                assert!(ok, "metrics: {text}");
                text
            })
            .collect()
    }

    /// (CPU seconds so far, resident MiB now, peak resident MiB) summed over the servers.
    pub fn usage(&self) -> (f64, f64, f64) {
        self.pids()
            .map(proc_usage)
            .fold((0.0, 0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
    }

    /// Sockets the servers hold open now (connections and listeners).
    pub fn sockets(&self) -> usize {
        self.pids().map(sockets).sum()
    }

    fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.servers.iter().filter_map(|s| s.pid)
    }
}

impl Drop for ApiServers {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for s in &self.servers[1..] {
            let _ = std::fs::remove_file(&s.kubeconfig);
        }
    }
}

/// Wait up to 180 s for `s` to answer `/readyz`.
fn ready(env: &KubeEnv, s: &ApiServer) {
    let start = Instant::now();
    while !env
        .kubectl_as(&s.kubeconfig, &["get", "--raw", "/readyz"])
        .0
    {
        assert!(
            start.elapsed() < Duration::from_secs(180),
            "a replica kube-apiserver was not ready in 180 s ({})",
            s.kubeconfig.display()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The kube-apiserver of `env` (its certificates are beside its admin kubeconfig; another
/// instance may run beside it, and replicas are found by their children, not here).
fn primary_pid(env: &KubeEnv) -> Option<u32> {
    let mark = format!("--tls-cert-file={}/", env.admin.parent()?.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let args = cmdline(pid);
        let port = flag(&args, "--secure-port")?;
        let own = std::fs::read_to_string(&env.admin).ok()?;
        (args.first()?.ends_with("kube-apiserver")
            && args.iter().any(|a| a.starts_with(&mark))
            && own.contains(&format!("https://127.0.0.1:{port}")))
        .then_some(pid)
    })
}

/// The arguments `pid` was started with.
fn cmdline(pid: u32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// The value of `--name=value` in `args`.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .find_map(|a| a.strip_prefix(name)?.strip_prefix('='))
}

/// (CPU seconds so far, resident MiB now, peak resident MiB) of `pid`.
pub fn proc_usage(pid: u32) -> (f64, f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map(|x| x.1)
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = 100.0; // USER_HZ on Linux
    let cpu = f.get(11).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0)
        + f.get(12).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |k: &str| {
        status
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (cpu / ticks, kib("VmRSS:"), kib("VmHWM:"))
}

/// Sockets `pid` holds open now (its connections, listeners included).
pub fn sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}
