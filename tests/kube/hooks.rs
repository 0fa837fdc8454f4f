//! Lifecycle hooks on the real API server: the ShimExtension CRD, and fleets of real agents
//! (tests/support/fleet) calling test extensions served over HTTPS on loopback
//! (tests/support/hookserver, a test CA in `caBundle`): BeforeNodeRestart and AfterNodeChange.
//! BeforeRollout, Service references and a larger fleet: tests/kube/hooks_rollout.rs.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use kube::Api;
use kube::api::ListParams;
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;

use crate::support::fleet::{FleetConfig, run_fleet};
use crate::support::hooks_kube::{ANC, BNR, events, extension, hook_status, metric, node, script};
use crate::support::hookserver::{HookServer, answer, defer, failure, success};
use crate::support::kube::{KubeEnv, SERIAL, eventually, kube_env};

#[tokio::test(flavor = "current_thread")]
async fn the_crd_is_validated_by_the_api_server_and_nodes_read_extensions_and_write_only_their_status()
 {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let good = "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {name: crd-good}\nspec:\n  clientConfig: {service: {namespace: ns, name: svc, port: 8443, path: /hook}, caBundle: Y2EtYnVuZGxl}\n  hooks: [{name: BeforeNodeRestart, timeoutSeconds: 30, failurePolicy: Ignore}, {name: AfterNodeChange}, {name: BeforeRollout}]\n";
    let (ok, out) = env.apply(good);
    assert!(ok, "{out}");
    // schema errors first (the server checks CEL rules only on an object the schema takes)
    let bad = "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {name: crd-bad}\nspec:\n  clientConfig: {url: \"https://x\"}\n  hooks: [{name: BeforeNodeRestart, timeoutSeconds: 31, failurePolicy: Maybe}]\n";
    let (ok, out) = env.apply(bad);
    assert!(!ok, "a bad extension was accepted: {out}");
    for msg in ["less than or equal to 30", "Unsupported value: \"Maybe\""] {
        assert!(out.contains(msg), "no {msg:?} in: {out}");
    }
    let bad = "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {name: crd-bad}\nspec:\n  clientConfig: {url: \"http://x\", service: {namespace: a, name: b, path: nope}}\n  hooks: [{name: BeforeNodeRestart}, {name: BeforeNodeRestart}]\n";
    let (ok, out) = env.apply(bad);
    assert!(!ok, "a bad extension was accepted: {out}");
    for msg in [
        "exactly one of url or service",
        "url must be an https:// URL",
        "service.path must start with /",
        "each hook may be listed only once",
    ] {
        assert!(out.contains(msg), "no {msg:?} in: {out}");
    }
    let (ok, out) = env.apply(&good.replace("BeforeRollout", "OnTuesday"));
    assert!(!ok && out.contains("OnTuesday"), "{out}");
    // caBundle is bytes (base64), as in Kubernetes' admission webhooks: PEM text is refused
    let (ok, out) = env.apply(&good.replace("Y2EtYnVuZGxl", "\"-----BEGIN CERTIFICATE-----\""));
    assert!(!ok && out.contains("caBundle"), "{out}");
    // a kubelet identity reads extensions and resolves Services, and writes none of it
    let kc = env.node_identity("hooks-crd-node");
    for (verb, res, allowed) in [
        ("list", "shimextensions.containerd.x-k8s.io", true),
        ("watch", "shimextensions.containerd.x-k8s.io", true),
        ("get", "services", true),
        ("list", "endpointslices.discovery.k8s.io", true),
        ("create", "shimextensions.containerd.x-k8s.io", false),
        ("patch", "shimextensions.containerd.x-k8s.io", false),
        ("update", "shimextensions.containerd.x-k8s.io", false),
        ("delete", "shimextensions.containerd.x-k8s.io", false),
    ] {
        let (_, out) = env.kubectl_as(&kc, &["auth", "can-i", verb, res, "-A"]);
        let yes = out.trim_start().starts_with("yes");
        assert_eq!(yes, allowed, "{verb} {res}: {out}");
    }
    // ...except each call's result in the status (status.hooks), which the caller writes
    for verb in ["patch", "update"] {
        let (_, out) = env.kubectl_as(
            &kc,
            &[
                "auth",
                "can-i",
                verb,
                "shimextensions.containerd.x-k8s.io",
                "--subresource=status",
            ],
        );
        assert!(out.trim_start().starts_with("yes"), "{verb} status: {out}");
    }
    let _ = env.kubectl(&["delete", "shimextension", "crd-good"]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_deferral_delays_only_that_node_and_one_past_the_maximum_gives_the_slot_up() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-defer";
    let (n0, n1) = (node(run, 0), node(run, 1));
    let (a, b) = (n0.clone(), n1.clone());
    let server = HookServer::start(script(move |c, nth| match c.kind.as_str() {
        // node 0: 2 s, then 2 s more (past the 3 s maximum), then go
        BNR if c.node == a && nth < 2 => defer(BNR, 2),
        // node 1: once, 1 s
        BNR if c.node == b && nth == 0 => defer(BNR, 1),
        k => success(k),
    }))
    .await;
    let _ext = extension(
        env,
        run,
        &server,
        "[{name: BeforeNodeRestart}, {name: AfterNodeChange}]",
    );
    // the hook metrics as the metrics endpoint serves them, before the run (the registry is
    // the process's: earlier tests' calls are in it)
    const CALLS: &str = "shim_agent_hook_calls_total";
    let series =
        |hook: &str, result: &str| format!("{CALLS}{{hook=\"{hook}\",result=\"{result}\"}}");
    let latency = |hook: &str| format!("shim_agent_hook_duration_seconds_count{{hook=\"{hook}\"}}");
    let watched = [
        series("BeforeNodeRestart", "Deferred"),
        series("BeforeNodeRestart", "Success"),
        series("AfterNodeChange", "Success"),
        latency("BeforeNodeRestart"),
        latency("AfterNodeChange"),
    ];
    let before: Vec<f64> = watched.iter().map(|s| metric(s)).collect();
    let mut cfg = FleetConfig::new(run, 4, "2", Duration::from_millis(200));
    cfg.max_deferral = Duration::from_secs(3);
    cfg.deadline = Duration::from_secs(90);
    // who holds the slots, every 100 ms
    let leases: Api<ShimLease> = Api::namespaced(env.admin_client().await, NAMESPACE);
    let samples = std::cell::RefCell::new(Vec::<(Instant, bool)>::new());
    let done = std::cell::Cell::new(false);
    let poll = async {
        let lp = ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={run}"));
        while !done.get() {
            if let Ok(l) = leases.list(&lp).await {
                let holds = l
                    .items
                    .iter()
                    .any(|x| x.spec.holder_identity.as_deref() == Some(n0.as_str()));
                samples.borrow_mut().push((Instant::now(), holds));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let fleet = async {
        let r = run_fleet(env, &cfg).await;
        done.set(true);
        r
    };
    let (r, ()) = tokio::join!(fleet, poll);
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 4);
    assert!(r.peak_restarting <= 2, "{}", r.peak_restarting);
    // the nodes not deferred were asked once, and were not held up
    for i in 2..4 {
        assert_eq!(server.of(BNR, &node(run, i)).len(), 1, "node {i}");
    }
    // node 1: asked again after its 1 s, then committed
    let c1 = server.of(BNR, &n1);
    assert_eq!(c1.len(), 2, "{c1:?}");
    assert!(c1[1].at - c1[0].at >= Duration::from_secs(1));
    // node 0: deferred 2 s within its maximum, then once more past it: the slot was given
    // up (not held for some time between the 2nd and 3rd call), and taken again
    let c0 = server.of(BNR, &n0);
    assert_eq!(c0.len(), 3, "{c0:?}");
    assert!(c0[1].at - c0[0].at >= Duration::from_secs(2));
    let s = samples.borrow().clone();
    let held_at = |t: Instant| s.iter().rfind(|(at, _)| *at <= t).is_some_and(|(_, h)| *h);
    assert!(held_at(c0[1].at), "node 0 held its slot while deferred");
    assert!(
        s.iter()
            .any(|(at, h)| *at > c0[1].at && *at < c0[2].at && !*h),
        "node 0 never let its slot go between the deferral past the maximum and its next try"
    );
    // every node's commit was notified
    eventually(10, "AfterNodeChange for every node", || async {
        (0..4)
            .all(|i| {
                server
                    .of(ANC, &node(run, i))
                    .iter()
                    .any(|c| c.body["result"] == "Committed")
            })
            .then_some(())
    })
    .await;
    // the metrics count exactly these calls: BeforeNodeRestart 3 deferred (node 0 twice,
    // node 1 once) and 4 successes, one AfterNodeChange success per node; a latency each
    let want = [3.0, 4.0, 4.0, 7.0, 4.0];
    eventually(10, "the hook metrics of every call", || async {
        let now: Vec<f64> = watched.iter().map(|s| metric(s)).collect();
        let delta: Vec<f64> = now.iter().zip(&before).map(|(a, b)| a - b).collect();
        (delta == want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_failure_fails_the_node_and_failures_past_max_failures_halt_the_rollout() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-refuse";
    let since = Instant::now();
    let server =
        HookServer::start(script(|c, _| failure(&c.kind, "maintenance window closed"))).await;
    let _ext = extension(env, run, &server, "[{name: BeforeNodeRestart}]");
    let mut cfg = FleetConfig::new(run, 6, "2", Duration::from_millis(200));
    cfg.max_failures = 1;
    cfg.refused = 6;
    cfg.deadline = Duration::from_secs(60);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert!(r.halted, "two refusals exceed maxFailures 1");
    assert_eq!(r.installed, 0);
    assert_eq!(r.restarts, 0, "no containerd restarted");
    let asked: BTreeSet<String> = server.calls().into_iter().map(|c| c.node).collect();
    assert!(asked.len() >= 2 && asked.len() <= 2 + 1, "{asked:?}");
    let n = asked.iter().next().unwrap();
    let notes = events(env, n, "BeforeNodeRestartFailure", since).await;
    assert!(
        notes
            .iter()
            .any(|m| m.contains("maintenance window closed")),
        "{notes:?}"
    );
    // the caller recorded the last call's result in the extension's status
    let r = hook_status(env, run, "BeforeNodeRestart", 10).await;
    assert_eq!(r.result, "Failure", "{r:?}");
    assert!(
        r.message
            .as_deref()
            .is_some_and(|m| m.contains("maintenance window closed")),
        "{r:?}"
    );
    assert!(r.node.as_ref().is_some_and(|n| asked.contains(n)), "{r:?}");
    assert_eq!(r.shims, [run], "{r:?}");
    assert!(r.time.is_some() && r.generation.is_none(), "{r:?}");
}

/// A fleet of 3 whose node 0's call times out (1 s) under `policy`; the others are deferred
/// 2 s once, so node 0's outcome is in before the run ends.
async fn timeout_run(env: &KubeEnv, run: &str, policy: &str) -> (usize, Vec<String>, Vec<String>) {
    let since = Instant::now();
    let slow = node(run, 0);
    let server = HookServer::start(script(move |c, nth| {
        if c.node == slow {
            let mut r = success(&c.kind);
            r.delay = Duration::from_secs(2);
            r
        } else if nth == 0 {
            defer(&c.kind, 2)
        } else {
            success(&c.kind)
        }
    }))
    .await;
    let hooks =
        format!("[{{name: BeforeNodeRestart, timeoutSeconds: 1, failurePolicy: {policy}}}]");
    let _ext = extension(env, run, &server, &hooks);
    let mut cfg = FleetConfig::new(run, 3, "3", Duration::from_millis(200));
    cfg.max_failures = 5;
    cfg.refused = usize::from(policy == "Fail");
    cfg.deadline = Duration::from_secs(60);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    let n0 = node(run, 0);
    let failed = events(env, &n0, "BeforeNodeRestartFailure", since).await;
    let ignored = events(env, &n0, "BeforeNodeRestartIgnored", since).await;
    (r.installed, failed, ignored)
}

#[tokio::test(flavor = "current_thread")]
async fn a_timeout_fails_the_node_under_fail_and_proceeds_with_a_warning_under_ignore() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let (installed, failed, ignored) = timeout_run(env, "hooks-tofail", "Fail").await;
    assert_eq!(installed, 2, "node 0 failed");
    assert!(
        failed.iter().any(|m| m.contains("timed out after 1 s")),
        "{failed:?}"
    );
    assert!(ignored.is_empty(), "{ignored:?}");
    let (installed, failed, ignored) = timeout_run(env, "hooks-toignore", "Ignore").await;
    assert_eq!(installed, 3, "node 0 proceeded");
    assert!(
        ignored.iter().any(|m| m.contains("timed out after 1 s")),
        "{ignored:?}"
    );
    assert!(failed.is_empty(), "{failed:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn after_node_change_sees_every_commit_and_every_rollback() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-after";
    let server = HookServer::start(script(|c, _| success(&c.kind))).await;
    let _ext = extension(env, run, &server, "[{name: AfterNodeChange}]");
    let mut cfg = FleetConfig::new(run, 4, "2", Duration::from_millis(200));
    cfg.max_failures = 5;
    cfg.failing = BTreeSet::from([1]);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 3);
    eventually(
        10,
        "a notification of each commit and the rollback",
        || async {
            let results = |i| -> Vec<String> {
                server
                    .of(ANC, &node(run, i))
                    .iter()
                    .map(|c| c.body["result"].as_str().unwrap_or_default().to_string())
                    .collect()
            };
            let ok = [0, 2, 3].iter().all(|i| results(*i) == ["Committed"])
                && !results(1).is_empty()
                && results(1).iter().all(|r| r == "RolledBack");
            ok.then_some(())
        },
    )
    .await;
    // the request names the change and the new digest
    let c = &server.of(ANC, &node(run, 0))[0].body;
    assert_eq!(c["apiVersion"], "hooks.containerd.x-k8s.io/v1alpha1");
    assert_eq!(c["shims"][0]["name"], run);
    assert_eq!(c["shims"][0]["change"], "Install");
    assert_eq!(c["shims"][0]["newDigest"].as_str().map(str::len), Some(64));
    let rb = &server.of(ANC, &node(run, 1))[0].body;
    assert!(
        rb["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{rb}"
    );
    // the notification's result is in the extension's status, with the node that sent it
    let r = hook_status(env, run, "AfterNodeChange", 10).await;
    assert_eq!(r.result, "Success", "{r:?}");
    let nodes: Vec<String> = (0..4).map(|i| node(run, i)).collect();
    assert!(r.node.as_ref().is_some_and(|n| nodes.contains(n)), "{r:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn unknown_versions_are_refused_and_malformed_answers_are_errors_under_the_policy() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let run = "hooks-malformed";
    let since = Instant::now();
    let (a, b, c) = (node(run, 0), node(run, 1), node(run, 2));
    let server = HookServer::start(script(move |call, _| {
        let k = call.kind.as_str();
        if call.node == a {
            answer(
                "AfterNodeChangeRequest",
                serde_json::json!({"status": "Success"}),
            )
        } else if call.node == b {
            answer(k, serde_json::json!({"status": "Success", "extra": true}))
        } else if call.node == c {
            answer(
                k,
                serde_json::json!({"status": "Success", "retryAfterSeconds": -5}),
            )
        } else {
            let mut r = success(k);
            r.delay = Duration::from_secs(1);
            r
        }
    }))
    .await;
    // the server serves v1alpha1 only
    let http = reqwest::Client::builder()
        .tls_certs_only(reqwest::Certificate::from_pem_bundle(server.ca_pem.as_bytes()).unwrap())
        .build()
        .unwrap();
    let resp = http
        .post(server.url())
        .json(&serde_json::json!({"apiVersion": "hooks.containerd.x-k8s.io/v2", "kind": BNR, "node": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert!(
        resp.text()
            .await
            .unwrap()
            .contains("unsupported apiVersion")
    );
    assert!(
        server.calls().is_empty(),
        "a refused request reached the script"
    );

    let _ext = extension(env, run, &server, "[{name: BeforeNodeRestart}]");
    let mut cfg = FleetConfig::new(run, 4, "4", Duration::from_millis(200));
    cfg.max_failures = 5;
    cfg.refused = 3;
    cfg.deadline = Duration::from_secs(60);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 1);
    for (i, what) in [
        (0, "response kind"),
        (1, "unknown field"),
        (2, "retryAfterSeconds -5"),
    ] {
        // the Events of a round go at its end, after the Node's state the status counts
        eventually(
            15,
            &format!("node {i}: an Event naming the {what}"),
            || async {
                let notes = events(env, &node(run, i), "BeforeNodeRestartFailure", since).await;
                notes.iter().any(|m| m.contains(what)).then_some(())
            },
        )
        .await;
    }
}
