//! Lifecycle hooks on the real API server, continued (tests/kube/hooks.rs has the CRD and the
//! node hooks): BeforeRollout held by the coordinator, a `service` reference resolved through
//! the API, and a fleet with a random fifth of its nodes deferred.

use std::collections::BTreeSet;
use std::time::Duration;

use kube::Api;

use crate::support::fleet::{FleetConfig, run_fleet};
use crate::support::hooks_kube::{ANC, BNR, Extension, extension, hook_status, node, script};
use crate::support::hookserver::{Call, HookServer, defer, failure, success};
use crate::support::kube::{SERIAL, eventually, kube_env};

/// A fifth of the fleet, picked at random (the seed is printed), deferred once.
fn pick_fifth(agents: usize, seed: u64) -> BTreeSet<usize> {
    let mut x = seed | 1;
    let mut out = BTreeSet::new();
    while out.len() < agents / 5 {
        // xorshift64
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.insert((x % agents as u64) as usize);
    }
    out
}

#[tokio::test(flavor = "current_thread")]
async fn a_fleet_with_a_random_fifth_deferred_once_keeps_at_most_n_restarting_and_finishes() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-fleet";
    let agents = 20;
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let deferred = pick_fifth(agents, seed);
    eprintln!("seed {seed}: deferring nodes {deferred:?}");
    let names: BTreeSet<String> = deferred.iter().map(|i| node(run, *i)).collect();
    let server = HookServer::start(script(move |c, nth| {
        if names.contains(&c.node) && nth == 0 {
            defer(&c.kind, 1)
        } else {
            success(&c.kind)
        }
    }))
    .await;
    let _ext = extension(env, run, &server, "[{name: BeforeNodeRestart}]");
    let cfg = FleetConfig::new(run, agents, "3", Duration::from_millis(300));
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, agents);
    assert!(r.peak_restarting <= 3, "peak {}", r.peak_restarting);
    assert!(!r.halted);
    for i in 0..agents {
        let want = if deferred.contains(&i) { 2 } else { 1 };
        assert_eq!(server.of(BNR, &node(run, i)).len(), want, "node {i}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn before_rollout_holds_the_whole_rollout_until_success_and_a_failure_halts_it() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    const BR: &str = "BeforeRolloutRequest";
    let run = "hooks-rollout";
    // deferred three times (1 s each), then Success
    let server = HookServer::start(script(|c, nth| match c.kind.as_str() {
        BR if nth < 3 => defer(BR, 1),
        k => success(k),
    }))
    .await;
    let _ext = extension(
        env,
        run,
        &server,
        "[{name: BeforeRollout}, {name: AfterNodeChange}]",
    );
    let shims: Api<shim_agent::api::Shim> = Api::all(env.admin_client().await);
    let seen_deferred = std::cell::Cell::new(false);
    let approved = std::cell::Cell::new(None::<i64>);
    let done = std::cell::Cell::new(false);
    let poll = async {
        while !done.get() {
            let status = shims.get(run).await.ok().and_then(|s| s.status);
            if let Some(g) = status.as_ref().and_then(|s| s.approved_generation) {
                approved.set(Some(g));
            }
            if status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "RolloutDeferred" && c.status == "True")
            {
                seen_deferred.set(true);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let cfg = FleetConfig::new(run, 4, "2", Duration::from_millis(200));
    let fleet = async {
        let r = run_fleet(env, &cfg).await;
        done.set(true);
        r
    };
    let (r, ()) = tokio::join!(fleet, poll);
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 4);
    let asked: Vec<Call> = server
        .calls()
        .into_iter()
        .filter(|c| c.kind == BR)
        .collect();
    assert!(asked.len() >= 4, "{asked:?}");
    assert_eq!(asked[0].body["generation"], 1);
    assert!(seen_deferred.get(), "the Shim showed RolloutDeferred");
    let go = asked[3].at;
    eventually(10, "every commit notified", || async {
        let anc: Vec<Call> = server
            .calls()
            .into_iter()
            .filter(|c| c.kind == ANC)
            .collect();
        (anc.len() >= 4).then_some(anc)
    })
    .await
    .iter()
    .for_each(|c| {
        assert!(
            c.at > go,
            "a node changed before BeforeRollout said Success"
        )
    });
    // the coordinator recorded the last answer in the extension's status
    let r = hook_status(env, run, "BeforeRollout", 10).await;
    assert_eq!(
        (r.result.as_str(), r.generation, r.node.as_deref()),
        ("Success", Some(1), None),
        "{r:?}"
    );
    assert_eq!(r.shims, [run]);
    // and the approval in the Shim's status, for a coordinator that takes over
    assert_eq!(approved.get(), Some(1));

    // a Failure halts it with the extension's message
    let run = "hooks-rollout-no";
    let server = HookServer::start(script(|c, _| {
        failure(&c.kind, "change freeze until Monday")
    }))
    .await;
    let _ext = extension(env, run, &server, "[{name: BeforeRollout}]");
    let mut cfg = FleetConfig::new(run, 3, "2", Duration::from_millis(200));
    cfg.deadline = Duration::from_secs(30);
    // the fleet ends on the status read that shows the halt, and keeps that status
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(
        r.halted,
        "not halted; the extension was called {} times; the Shim's status: {:#?}",
        server.calls().len(),
        r.status
    );
    assert_eq!(r.installed, 0);
    assert_eq!(r.restarts, 0);
    let m = r
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "RolloutHalted"))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    assert!(m.contains("change freeze until Monday"), "{m}");
    let r = hook_status(env, run, "BeforeRollout", 10).await;
    assert_eq!(r.result, "Failure", "{r:?}");
    assert!(
        r.message
            .as_deref()
            .is_some_and(|m| m.contains("change freeze until Monday")),
        "{r:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_service_reference_resolves_through_the_api_to_its_endpoint_slice() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-service";
    // the API server refuses loopback endpoints: the host's own address
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .unwrap();
    let host_ip: std::net::IpAddr = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .find(|a| a.is_ipv4() && !a.is_loopback())
        .expect("a non-loopback IPv4 address on this host");
    let server = HookServer::start_at(host_ip, script(|c, _| success(&c.kind))).await;
    // a Service without a selector and an EndpointSlice pointing at the test server (no
    // kube-proxy or cluster DNS here, as on a host); the certificate names the Service
    let port = server.addr.port();
    let yaml = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: shim-hooks-test}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: hooks, namespace: shim-hooks-test}}\nspec:\n  ports: [{{name: https, port: 443, targetPort: {port}}}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: hooks-1\n  namespace: shim-hooks-test\n  labels: {{kubernetes.io/service-name: hooks}}\naddressType: IPv4\nports: [{{name: https, port: {port}, protocol: TCP}}]\nendpoints: [{{addresses: [{host_ip}], conditions: {{ready: true}}}}]\n"
    );
    let (ok, out) = env.apply(&yaml);
    assert!(ok, "{out}");
    let ca = server.ca_bundle();
    let ext = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {{name: {run}}}\nspec:\n  clientConfig: {{service: {{namespace: shim-hooks-test, name: hooks, port: 443, path: /hook}}, caBundle: {ca}}}\n  hooks: [{{name: BeforeNodeRestart}}]\n  shimSelector: {{matchLabels: {{fleet: {run}}}}}\n"
    );
    let (ok, out) = env.apply(&ext);
    assert!(ok, "{out}");
    let _ext = Extension {
        env,
        name: run.into(),
    };
    let mut cfg = FleetConfig::new(run, 2, "2", Duration::from_millis(200));
    cfg.deadline = Duration::from_secs(60);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(
        r.installed, 2,
        "both nodes reached the extension through the Service"
    );
    for i in 0..2 {
        assert_eq!(server.of(BNR, &node(run, i)).len(), 1, "node {i}");
    }
    let _ = env.kubectl(&["delete", "namespace", "shim-hooks-test", "--wait=false"]);
}
