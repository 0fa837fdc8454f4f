//! Lifecycle hooks' cost (needs the kube env):
//! 1. per restart: the node's gate (`NodeHooks` around a gate that always has a slot) with one
//!    ShimExtension answering `BeforeNodeRestart` with Success over HTTPS on loopback at once,
//!    against the same gate with no extension for the Shim. The extensions come from a real
//!    watch of the API server; Events go to it too.
//! 2. a fleet rollout (tests/support/fleet) with and without an extension serving
//!    BeforeNodeRestart and AfterNodeChange (Success at once).
//!
//! `cargo bench --bench hooks`; `HOOKS_FLEET` = `agents:maxUpdate` (default `200:10`),
//! `HOOKS_RESTART_MS` (default 500), `HOOKS_CALLS` (default 300).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use shim_agent::api::extension::ShimExtension;
use shim_agent::hooks::wire::{ChangeKind, ShimChange};
use shim_agent::hooks::{Hooks, NodeHooks, Report};
use shim_agent::txn::{Gate, Ungated};
use support::fleet::{FleetConfig, run_fleet};
use support::hookserver::{HookServer, success};
use support::kube::kube_env;

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

fn apply_extension(
    env: &support::kube::KubeEnv,
    name: &str,
    label: &str,
    server: &HookServer,
    hooks: &str,
) {
    let ca = server.ca_bundle();
    let yaml = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {{name: {name}}}\nspec:\n  clientConfig: {{url: \"{}\", caBundle: {ca}}}\n  hooks: {hooks}\n  shimSelector: {{matchLabels: {{fleet: {label}}}}}\n",
        server.url()
    );
    let (ok, out) = env.apply(&yaml);
    assert!(ok, "{out}");
}

async fn per_restart(env: &support::kube::KubeEnv, calls: usize) {
    let server = HookServer::start(Arc::new(|c, _| success(&c.kind))).await;
    apply_extension(
        env,
        "bench-hooks",
        "bench-hooks",
        &server,
        "[{name: BeforeNodeRestart}]",
    );
    let client = env.admin_client().await;
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(
            Api::<ShimExtension>::all(client.clone()),
            watcher::Config::default(),
        ),
    )
    .applied_objects();
    tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        use futures_util::StreamExt;
        while s.next().await.is_some() {}
    });
    reader.wait_until_ready().await.unwrap();
    let hooks = Arc::new(Hooks::new(client.clone(), reader));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "shim-agent-bench".into(),
            instance: None,
        },
    );
    let node_ref = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some("bench-hooks-node".into()),
        ..Default::default()
    };
    let shim_with = |label: &str| -> shim_agent::api::Shim {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: bench-hooks, labels: {{fleet: {label}}}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: bench-hooks}}\n",
            "a".repeat(64)
        );
        shim_agent::api::load::parse_shims(&y, "b.yaml")
            .unwrap()
            .remove(0)
    };
    let names = vec!["bench-hooks".to_string()];
    let change = vec![ShimChange {
        name: "bench-hooks".into(),
        change: ChangeKind::Upgrade,
        old_digest: Some("a".repeat(64)),
        new_digest: Some("b".repeat(64)),
    }];
    for (what, label) in [
        ("no extension", "nothing"),
        ("one Success hook", "bench-hooks"),
    ] {
        let cluster = vec![shim_with(label)];
        let mut took = Vec::new();
        for i in 0..calls + 20 {
            let gate = NodeHooks::new(
                Ungated,
                hooks.clone(),
                "bench-hooks-node",
                &cluster,
                change.clone(),
                Duration::from_secs(60),
                Report {
                    recorder: recorder.clone(),
                    refs: vec![node_ref.clone()],
                },
            );
            let t = Instant::now();
            gate.acquire(&names).await.unwrap();
            let d = t.elapsed();
            gate.release().await;
            if i >= 20 {
                took.push(d); // after warm-up (connection, TLS session)
            }
        }
        println!(
            "per restart, {what}: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms ({calls} restarts)",
            pct(&mut took, 0.5),
            pct(&mut took, 0.9),
            pct(&mut took, 0.99),
            pct(&mut took, 1.0)
        );
    }
    let _ = env.kubectl(&["delete", "shimextension", "bench-hooks"]);
}

async fn fleet(env: &support::kube::KubeEnv, agents: usize, n: &str, restart: Duration) {
    for with in [false, true] {
        let run = if with {
            "bench-hooks-on"
        } else {
            "bench-hooks-off"
        };
        let server = HookServer::start(Arc::new(|c, _| success(&c.kind))).await;
        if with {
            apply_extension(
                env,
                run,
                run,
                &server,
                "[{name: BeforeNodeRestart}, {name: AfterNodeChange}]",
            );
        }
        let mut cfg = FleetConfig::new(run, agents, n, restart);
        cfg.deadline = Duration::from_secs(900);
        // all as the admin: no certificate to mint per node (the tests run the real identities)
        cfg.node_identities = false;
        let r = run_fleet(env, &cfg).await;
        println!(
            "fleet {agents} agents, maxUpdate {n}, restart {} ms, hooks {}: {} installed in {:.1} s, peak restarting {}, {} hook calls, violations {}",
            restart.as_millis(),
            if with { "on" } else { "off" },
            r.installed,
            r.elapsed.as_secs_f64(),
            r.peak_restarting,
            server.calls().len(),
            r.violations.len()
        );
        if with {
            let _ = env.kubectl(&["delete", "shimextension", run]);
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some(env) = kube_env() else { return };
    let calls: usize = std::env::var("HOOKS_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let spec = std::env::var("HOOKS_FLEET").unwrap_or_else(|_| "200:10".into());
    let (agents, n) = spec.split_once(':').unwrap_or(("200", "10"));
    let restart = Duration::from_millis(
        std::env::var("HOOKS_RESTART_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(500),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        per_restart(env, calls).await;
        fleet(env, agents.parse().unwrap_or(200), n, restart).await;
    });
}
