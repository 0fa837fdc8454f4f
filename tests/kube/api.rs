//! The API as the real kube-apiserver enforces it: the manifests apply server-side (the CEL
//! rules fit the cost budget), a bad Shim is refused with the rule's message, and a node
//! identity is held to its own Node and to the finalizer of a Shim.

use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use shim_agent::api::Shim;

use crate::support;
use crate::support::kube::{SERIAL, kube_env};
use crate::support::option_paths;
use crate::support::shim_cases::{
    Judge, build, check_with, new_field_refusals, with_check, with_platforms,
};

const GOOD: &str = r#"apiVersion: containerd.x-k8s.io/v1alpha1
kind: Shim
metadata:
  name: kapi-good
spec:
  fetchStrategy:
    type: anonymousHttp
    anonHttp:
      location: https://example.com/shim.tar.gz
      sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0
  runtimeClass:
    name: kapi-good
  rolloutStrategy:
    type: rolling
    rolling:
      maxUpdate: 5
"#;

fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "test bug: {from:?} not in GOOD");
    GOOD.replacen(from, to, 1)
}

#[test]
fn the_server_refuses_each_bad_shim_with_the_rule_message() {
    let Some(env) = kube_env() else { return };
    let dry = |yaml: &str| env.apply_dry_run(yaml);
    let (ok, out) = dry(GOOD);
    assert!(ok, "the good Shim is refused: {out}");
    let cases = [
        (
            with("name: kapi-good\nspec", "name: kapi.good\nspec"),
            "metadata.name must be a DNS-1123 label",
        ),
        (
            with(
                "    name: kapi-good\n  rollout",
                "    name: kapi-good\n    handler: Bad_Handler\n  rollout",
            ),
            "runtimeClass.handler must be a DNS-1123 label",
        ),
        (
            with("      sha256: 3f5a", "      sha256: 3g5a"),
            "sha256 must be 64 hexadecimal characters",
        ),
        (
            with(
                "location: https://example.com",
                "location: ftp://example.com",
            ),
            "location must be an http://, https:// or file:/// URL",
        ),
        (
            with(
                "  runtimeClass:",
                "    platforms: [{os: linux, arch: amd64, location: \"https://e.com/a\"}]\n  runtimeClass:",
            ),
            "needs exactly one of anonHttp.location or platforms",
        ),
        (
            with(
                "    anonHttp:\n      location: https://example.com/shim.tar.gz\n",
                "    anonHttp:\n",
            ),
            "needs exactly one of anonHttp.location or platforms",
        ),
        (
            with("type: anonymousHttp", "type: oci"),
            "fetchStrategy of type oci needs fetchStrategy.oci.reference",
        ),
        (
            with("maxUpdate: 5", "maxUpdate: 0"),
            "maxUpdate must be an integer of at least 1 or a percentage from 1% to 100%",
        ),
        (
            with("maxUpdate: 5", "maxUpdate: \"101%\""),
            "maxUpdate must be an integer of at least 1 or a percentage from 1% to 100%",
        ),
    ];
    for (yaml, message) in cases {
        let (ok, out) = dry(&yaml);
        assert!(!ok, "accepted:\n{yaml}");
        assert!(out.contains(message), "expected {message:?} in:\n{out}");
    }
}

/// The same cases as tests/pure/api.rs gives the node's client-side check.
#[test]
fn the_server_refuses_each_bad_runtime_binary_or_option_path_with_the_rule_message() {
    let Some(env) = kube_env() else { return };
    let (ok, out) = env.apply_dry_run(&option_paths::shim_yaml("op-good", option_paths::GOOD));
    assert!(ok, "the good runtime settings are refused: {out}");
    for (name, runtime, message) in option_paths::bad() {
        let (ok, out) = env.apply_dry_run(&option_paths::shim_yaml(name, &runtime));
        assert!(!ok, "accepted {name}: {runtime}");
        assert!(
            out.contains(message),
            "{name}: expected {message:?} in:\n{out}"
        );
    }
}

#[test]
fn the_server_refuses_each_bad_containerd_range_or_check_container_with_the_rule_message() {
    let Some(env) = kube_env() else { return };
    for (what, yaml, message) in new_field_refusals(&with, Judge::ApiServer) {
        let (ok, out) = env.apply_dry_run(&yaml);
        assert!(!ok, "accepted {what}:\n{yaml}");
        assert!(
            out.contains(message),
            "{what}: expected {message:?} in:\n{out}"
        );
    }
    // the documented forms, one build per range for one platform, the documented check
    let good = [
        with_platforms(
            &with,
            &[
                &build("amd64", Some("\"<2.3\"")),
                &build("amd64", Some("\">=2.3\"")),
                &build("amd64", Some("\">=1.6, <2.3\"")),
                &build("amd64", Some("\"=2.2\"")),
                &build("amd64", None),
                &build("x86_64", None),
            ],
        ),
        with_check(
            &with,
            "{image: docker.io/library/shim-agent-wasm-hello:v1, command: [\"/hello.wasm\"], args: [], success: {exitCode: 0, outputContains: \"hello from wasm\"}, timeoutSeconds: 60}",
        ),
        with_check(&with, &check_with("timeoutSeconds", "600")),
        with_check(&with, &check_with("success", "{exitCode: 255}")),
    ];
    for yaml in good {
        let (ok, out) = env.apply_dry_run(&yaml);
        assert!(ok, "refused:\n{yaml}\n{out}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_identity_may_touch_only_its_own_node_and_the_coordinator_only_the_shim_finalizer() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    env.create_node("kapi-a", &[]).await;
    env.create_node("kapi-b", &[]).await;
    let a = env.node_identity("kapi-a");
    let (ok, out) = env.apply(&GOOD.replace("kapi-good", "kapi-rbac"));
    assert!(ok, "{out}");

    // its own Node: a Shim label is allowed
    let (ok, out) = env.kubectl_as(
        &a,
        &[
            "label",
            "node",
            "kapi-a",
            "containerd.x-k8s.io/kapi-rbac=true",
        ],
    );
    assert!(ok, "own node: {out}");
    // another Node: NodeRestriction says no
    let (ok, out) = env.kubectl_as(
        &a,
        &[
            "label",
            "node",
            "kapi-b",
            "containerd.x-k8s.io/kapi-rbac=true",
        ],
    );
    assert!(!ok && out.contains("forbidden"), "other node: {out}");
    // Secrets: no
    let (ok, out) = env.kubectl_as(&a, &["get", "secrets", "-n", "default"]);
    assert!(!ok && out.contains("forbidden"), "secrets: {out}");
    // Shims: no create, no delete
    let (ok, out) = env.apply_as(&a, &GOOD.replace("kapi-good", "kapi-by-node"));
    assert!(!ok && out.contains("forbidden"), "create: {out}");
    let (ok, out) = env.kubectl_as(&a, &["delete", "shim", "kapi-rbac"]);
    assert!(!ok && out.contains("forbidden"), "delete: {out}");
    // kubectl patch would GET first (not granted): patch as the agent would
    let patcher = |client: kube::Client| {
        let shims: Api<Shim> = Api::all(client);
        move |v: serde_json::Value, status: bool| {
            let shims = shims.clone();
            async move {
                let pp = PatchParams::default();
                let r = if status {
                    shims
                        .patch_status("kapi-rbac", &pp, &Patch::Merge(&v))
                        .await
                } else {
                    shims.patch("kapi-rbac", &pp, &Patch::Merge(&v)).await
                };
                r.map(|_| ()).map_err(|e| e.to_string())
            }
        }
    };
    // a node identity writes no Shim at all: not its finalizer, not its status (the
    // coordinator's, and a forged status.approvedGeneration would skip BeforeRollout)
    let node = patcher(support::kube::client_for(&a).await);
    for (body, status) in [
        (
            json!({"metadata": {"finalizers": ["containerd.x-k8s.io/cleanup"]}}),
            false,
        ),
        (json!({"status": {"approvedGeneration": 1}}), true),
    ] {
        let e = node(body, status).await.unwrap_err();
        assert!(e.contains("forbidden"), "node identity: {e}");
    }
    // the coordinator: the admission policy holds it to the finalizer
    let coordinator = patcher(support::kube::client_for(&env.coordinator_identity()).await);
    let e = coordinator(json!({"spec": {"runtimeClass": {"name": "other"}}}), false)
        .await
        .unwrap_err();
    assert!(e.contains("may not change a Shim's spec"), "spec: {e}");
    let e = coordinator(json!({"metadata": {"labels": {"x": "y"}}}), false)
        .await
        .unwrap_err();
    assert!(e.contains("labels or annotations"), "labels: {e}");
    let e = coordinator(
        json!({"metadata": {"finalizers": ["example.com/other"]}}),
        false,
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("only add or remove the containerd.x-k8s.io/cleanup"),
        "foreign finalizer: {e}"
    );
    // its finalizer: allowed, and removable; status: allowed
    coordinator(
        json!({"metadata": {"finalizers": ["containerd.x-k8s.io/cleanup"]}}),
        false,
    )
    .await
    .expect("adding our finalizer");
    coordinator(json!({"metadata": {"finalizers": null}}), false)
        .await
        .expect("removing our finalizer");
    coordinator(json!({"status": {"observedGeneration": 1}}), true)
        .await
        .expect("status");
    // coordination Leases outside kube-node-lease: NodeRestriction says no (why ShimLease)
    let lease = "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: kapi, namespace: shim-agent-system}\nspec: {holderIdentity: kapi-a}\n";
    let (ok, out) = env.apply_as(&a, lease);
    assert!(!ok && out.contains("kube-node-lease"), "lease: {out}");
    // the ServiceAccounts: the node agents' has a node's verbs, the coordinator's its own
    let sa = "--as=system:serviceaccount:shim-agent-system:shim-agent";
    let coord_sa = "--as=system:serviceaccount:shim-agent-system:shim-agent-coordinator";
    for (verb, who, ok_expected) in [
        ("list shims.containerd.x-k8s.io", sa, "yes"),
        ("patch shims.containerd.x-k8s.io", sa, "no"),
        (
            "patch shims.containerd.x-k8s.io --subresource=status",
            sa,
            "no",
        ),
        ("create runtimeclasses.node.k8s.io", sa, "no"),
        ("create shims.containerd.x-k8s.io", sa, "no"),
        ("get secrets -n default", sa, "no"),
        (
            "update shimleases.containerd.x-k8s.io -n shim-agent-system",
            sa,
            "yes",
        ),
        (
            "create shimleases.containerd.x-k8s.io -n shim-agent-system",
            sa,
            "no",
        ),
        ("patch shims.containerd.x-k8s.io", coord_sa, "yes"),
        ("create runtimeclasses.node.k8s.io", coord_sa, "yes"),
        // startup taints (the node-taints policy holds it to their removal), not the status
        ("patch nodes", coord_sa, "yes"),
        ("patch nodes --subresource=status", coord_sa, "no"),
        ("delete nodes", coord_sa, "no"),
        ("get secrets -n default", coord_sa, "no"),
    ] {
        let mut args = vec!["auth", "can-i"];
        args.extend(verb.split(' '));
        args.push(who);
        let (_, out) = env.kubectl(&args);
        assert_eq!(
            out.lines().next().unwrap_or_default().trim(),
            ok_expected,
            "{verb} {who}: {out}"
        );
    }
    env.kubectl(&["delete", "shim", "kapi-rbac", "--wait=false"]);
}
