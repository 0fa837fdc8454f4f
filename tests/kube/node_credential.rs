//! A node's credential gains no cluster-wide power from shim-agent (docs/design.md §7), on the
//! real API server with the manifests `shim-agent manifests` prints.
//!
//! - Each denial, for the kubelet identity and for the dedicated ServiceAccount variant
//!   (a token bound to the Node): an administrator's RuntimeClass cannot be deleted or
//!   replaced, no RuntimeClass created, no Shim status or finalizer written, no other Node
//!   patched, no slot created or deleted, the coordinator lease not touched; the ServiceAccount
//!   is held to its own Node and to the Shim labels there; a token bound to no node writes
//!   neither Nodes nor slots.
//! - The coordinator identity writes only RuntimeClasses its Shims own, and only as the Shim
//!   says: name, handler and node label.
//! - The real agent and coordinator do all their work as ServiceAccounts (a token bound to the
//!   Node, the coordinator's): install, label, state and startup-taint annotations, the
//!   ShimsReady condition, the taint taken off, the slot taken and given back, Events, the
//!   unlabel and the uninstall. The dedicated certificate is denied what the kubelet is.
//! - The audit: what `kubectl auth can-i --list` grants a node identity (kubelet, bound
//!   ServiceAccount) and a coordinator identity (certificate, ServiceAccount) after the
//!   manifests, beyond what it had before, is exactly what the design's tables list.

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use shim_agent::api::Shim;
use shim_agent::api::lease::ShimLease;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use shim_agent::cluster::connect::Source;
use shim_agent::cluster::readiness::{SHIMS_READY, STARTUP_TAINT_ANNOTATION, StartupTaint};
use shim_agent::cluster::slots::slot_name;
use shim_agent::cluster::{NAMESPACE, STATE_ANNOTATION};

use crate::support::agent_rig::{Rig, with_agent_config};
use crate::support::kube::{Instance, KubeEnv, SERIAL, client_for, eventually, kube_env};
use crate::support::live::{fake, shim_builder};
use crate::support::shim_builder::ShimBuilder;

const ADMIN_RC: &str = "kc-sandboxed";
const SHIM: &str = "kc-shim";

fn shim_yaml(name: &str) -> String {
    ShimBuilder::new(name)
        .node_selector("test", "kc-nowhere")
        .artifact("https://e.com/a.tgz", &"a".repeat(64))
        .handler(&format!("{name}-handler"))
        .yaml()
}

fn runtime_class(name: &str, handler: &str, owner: Option<&Shim>) -> serde_json::Value {
    let mut rc = json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "shim-agent"}},
        "handler": handler,
        "scheduling": {"nodeSelector": {format!("containerd.x-k8s.io/{SHIM}"): "true"}},
    });
    if let Some(s) = owner {
        rc["metadata"]["ownerReferences"] = json!([{
            "apiVersion": "containerd.x-k8s.io/v1alpha1", "kind": "Shim",
            "name": s.metadata.name, "uid": s.metadata.uid, "controller": true,
        }]);
    }
    rc
}

async fn create_rc(client: &Client, rc: serde_json::Value) -> Result<(), String> {
    let api: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(client.clone());
    let rc = serde_json::from_value(rc).unwrap();
    api.create(&PostParams::default(), &rc)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Every write a node identity might try against the other nodes, denied, with why.
async fn node_identity_is_denied(env: &KubeEnv, who: &str, client: &Client, me: &str) {
    let denied = |what: &str, r: Result<(), String>, why: &str| {
        let e = r.expect_err(&format!("{who}: {what} was allowed"));
        assert!(e.contains(why), "{who}: {what}: {e}");
    };
    let rcs: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(client.clone());
    // the administrator's RuntimeClass: no delete, no replace, no patch
    denied(
        "delete the admin's RuntimeClass",
        rcs.delete(ADMIN_RC, &Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
    denied(
        "patch the admin's RuntimeClass's handler",
        rcs.patch(
            ADMIN_RC,
            &PatchParams::default(),
            &Patch::Merge(json!({"handler": "runc"})),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string()),
        "forbidden",
    );
    // a RuntimeClass of its own, even one posing as a Shim's
    let shims: Api<Shim> = Api::all(client.clone());
    let shim = Api::<Shim>::all(client_for(&env.admin).await)
        .get(SHIM)
        .await
        .unwrap();
    denied(
        "create a RuntimeClass",
        create_rc(client, runtime_class("kc-evil", "runc", None)).await,
        "forbidden",
    );
    denied(
        "create a Shim's RuntimeClass",
        create_rc(client, runtime_class(SHIM, "runc", Some(&shim))).await,
        "forbidden",
    );
    // Shim status (a forged approvedGeneration would skip BeforeRollout) and finalizers
    denied(
        "patch a Shim's status",
        shims
            .patch_status(
                SHIM,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"approvedGeneration": 1}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
    denied(
        "remove a Shim's finalizer",
        shims
            .patch(
                SHIM,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
    // another Node
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    denied(
        "label another Node",
        nodes
            .patch(
                "kc-b",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {format!("containerd.x-k8s.io/{SHIM}"): "true"}}})),
            )
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
    // ShimLeases: no create or delete; the coordinator lease is not its to write
    let leases: Api<ShimLease> = Api::namespaced(client.clone(), "shim-agent-system");
    let lease: ShimLease = serde_json::from_value(json!({
        "apiVersion": "containerd.x-k8s.io/v1alpha1", "kind": "ShimLease",
        "metadata": {"name": "kc-made-up", "namespace": "shim-agent-system"},
        "spec": {"holderIdentity": me},
    }))
    .unwrap();
    denied(
        "create a ShimLease",
        leases
            .create(&PostParams::default(), &lease)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
    let mut coordinator = leases.get("kc-coordinator").await.unwrap();
    coordinator.spec.holder_identity = Some(me.to_string());
    denied(
        "take the coordinator lease",
        leases
            .replace("kc-coordinator", &PostParams::default(), &coordinator)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "may write only rollout slots",
    );
    denied(
        "delete a ShimLease",
        leases
            .delete("kc-coordinator", &Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        "forbidden",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_credential_can_change_no_runtime_class_and_nothing_of_another_node() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let admin = client_for(&env.admin).await;
    for n in ["kc-a", "kc-b"] {
        env.create_node(n, &[]).await;
    }
    let _ = env.kubectl(&[
        "delete",
        "runtimeclass",
        ADMIN_RC,
        "kc-evil",
        "--ignore-not-found",
    ]);
    let (ok, out) = env.apply(&format!(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: {ADMIN_RC}}}\nhandler: kata\n---\n{}---\napiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimLease\nmetadata: {{name: kc-coordinator, namespace: shim-agent-system}}\nspec: {{holderIdentity: someone}}\n",
        shim_yaml(SHIM)
    ));
    assert!(ok, "{out}");

    // the kubelet identity
    let kubelet = client_for(&env.node_identity("kc-a")).await;
    node_identity_is_denied(env, "kubelet kc-a", &kubelet, "kc-a").await;
    // the dedicated certificate, and the ServiceAccount variant, bound to Node kc-a
    let dedicated = client_for(&env.dedicated_node_identity("kc-a")).await;
    node_identity_is_denied(env, "dedicated certificate of kc-a", &dedicated, "kc-a").await;
    let sa = client_for(&env.token_kubeconfig("shim-agent", Some("kc-a"))).await;
    node_identity_is_denied(env, "ServiceAccount bound to kc-a", &sa, "kc-a").await;
    // ... held to its own Node as a kubelet is, and there to the Shim labels
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(sa.clone());
    let label = |k: &str| json!({"metadata": {"labels": {k: "true"}}});
    nodes
        .patch(
            "kc-a",
            &PatchParams::default(),
            &Patch::Merge(label(&format!("containerd.x-k8s.io/{SHIM}"))),
        )
        .await
        .expect("its own Node's Shim label");
    let e = nodes
        .patch(
            "kc-b",
            &PatchParams::default(),
            &Patch::Merge(label(&format!("containerd.x-k8s.io/{SHIM}"))),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("may update only its own Node (kc-a), not kc-b"),
        "{e}"
    );
    let e = nodes
        .patch(
            "kc-a",
            &PatchParams::default(),
            &Patch::Merge(label("node-role.kubernetes.io/control-plane")),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("only its Node's containerd.x-k8s.io/ labels"),
        "{e}"
    );
    // the reservation hint is the coordinator's (a forged one would gain nothing: the slot's
    // label decides), not the node's to write
    let e = nodes
        .patch(
            "kc-a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {shim_agent::api::lease::SLOT_RESERVATIONS_ANNOTATION: "{\"x\":0}"}}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("only its Node's containerd.x-k8s.io/ labels"),
        "{e}"
    );
    for (what, meta) in [
        (
            "an owner",
            json!({"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "0"}]}),
        ),
        ("a finalizer", json!({"finalizers": ["example.com/keep"]})),
    ] {
        let e = nodes
            .patch(
                "kc-a",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": meta})),
            )
            .await
            .expect_err(&format!("{what} on its own Node was allowed"))
            .to_string();
        assert!(
            e.contains("may not change its Node's owners or finalizers"),
            "{what}: {e}"
        );
    }
    // ... and there, of the status, to the ShimsReady condition
    let condition = |t: &str| {
        json!({"status": {"conditions": [{"type": t, "status": "True", "reason": "Test", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]}})
    };
    let status = |node: &'static str, c: serde_json::Value| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch_status(node, &PatchParams::default(), &Patch::Strategic(c))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    status("kc-a", condition("containerd.x-k8s.io/ShimsReady"))
        .await
        .expect("its own Node's ShimsReady condition");
    let e = status("kc-b", condition("containerd.x-k8s.io/ShimsReady"))
        .await
        .unwrap_err();
    assert!(e.contains("only its own Node's status, not kc-b"), "{e}");
    let e = status("kc-a", condition("Ready")).await.unwrap_err();
    assert!(
        e.contains("only the containerd.x-k8s.io/ShimsReady condition"),
        "{e}"
    );
    let e = status("kc-a", json!({"status": {"capacity": {"cpu": "64"}}}))
        .await
        .unwrap_err();
    assert!(
        e.contains("only the containerd.x-k8s.io/ShimsReady condition"),
        "{e}"
    );
    // ... and no label, annotation, owner or finalizer slips in through the status
    for (what, meta) in [
        (
            "a label",
            json!({"labels": {"node-role.kubernetes.io/control-plane": ""}}),
        ),
        (
            "an annotation",
            json!({"annotations": {"example.com/x": "y"}}),
        ),
        ("a finalizer", json!({"finalizers": ["example.com/keep"]})),
    ] {
        let mut patch = condition("containerd.x-k8s.io/ShimsReady");
        patch["metadata"] = meta;
        let e = status("kc-a", patch)
            .await
            .expect_err(&format!("{what} through the status was allowed"));
        assert!(
            e.contains("labels, annotations, owners or finalizers through its status"),
            "{what}: {e}"
        );
    }
    // the kubelet may write no other Node's status either (NodeRestriction)
    let e = Api::<k8s_openapi::api::core::v1::Node>::all(kubelet.clone())
        .patch_status(
            "kc-b",
            &PatchParams::default(),
            &Patch::Strategic(condition("containerd.x-k8s.io/ShimsReady")),
        )
        .await
        .expect_err("the kubelet of kc-a wrote kc-b's status")
        .to_string();
    assert!(e.contains("forbidden"), "{e}");
    // a token bound to no node acts for none
    let unbound = client_for(&env.token_kubeconfig("shim-agent", None)).await;
    let e = Api::<k8s_openapi::api::core::v1::Node>::all(unbound.clone())
        .patch(
            "kc-a",
            &PatchParams::default(),
            &Patch::Merge(label(&format!("containerd.x-k8s.io/{SHIM}"))),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("it acts for no node"), "{e}");
    let e = Api::<k8s_openapi::api::core::v1::Node>::all(unbound.clone())
        .patch_status(
            "kc-a",
            &PatchParams::default(),
            &Patch::Strategic(condition("containerd.x-k8s.io/ShimsReady")),
        )
        .await
        .expect_err("an unbound token wrote a Node's status")
        .to_string();
    assert!(e.contains("only its own Node's status"), "{e}");

    // the administrator's RuntimeClass is untouched
    let rc = Api::<k8s_openapi::api::node::v1::RuntimeClass>::all(admin.clone())
        .get(ADMIN_RC)
        .await
        .unwrap();
    assert_eq!(rc.handler, "kata");
    let _ = env.kubectl(&["delete", "runtimeclass", ADMIN_RC, "--ignore-not-found"]);
    let _ = env.kubectl(&[
        "delete",
        "shimlease",
        "-n",
        "shim-agent-system",
        "kc-coordinator",
    ]);
    let _ = env.kubectl(&["delete", "shim", SHIM, "--wait=false"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_writes_only_the_runtime_classes_its_shims_own_and_as_they_say() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let _ = env.kubectl(&[
        "delete",
        "runtimeclass",
        ADMIN_RC,
        SHIM,
        "--ignore-not-found",
    ]);
    let (ok, out) = env.apply(&format!(
        "apiVersion: node.k8s.io/v1\nkind: RuntimeClass\nmetadata: {{name: {ADMIN_RC}}}\nhandler: kata\n---\n{}",
        shim_yaml(SHIM)
    ));
    assert!(ok, "{out}");
    let admin = client_for(&env.admin).await;
    let shim = Api::<Shim>::all(admin.clone()).get(SHIM).await.unwrap();
    let c = client_for(&env.coordinator_identity()).await;
    let rcs: Api<k8s_openapi::api::node::v1::RuntimeClass> = Api::all(c.clone());

    let e = rcs
        .delete(ADMIN_RC, &Default::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("only RuntimeClasses a Shim owns"), "{e}");
    let e = create_rc(&c, runtime_class("kc-other", "runc", None))
        .await
        .unwrap_err();
    assert!(e.contains("owned (controller) by exactly one Shim"), "{e}");
    // the Shim's RuntimeClass with another handler
    let e = create_rc(&c, runtime_class(SHIM, "runc", Some(&shim)))
        .await
        .unwrap_err();
    assert!(e.contains(&format!("run handler {SHIM}-handler")), "{e}");
    // the Shim's RuntimeClass owned by another (made-up) Shim
    let mut fake = shim.clone();
    fake.metadata.name = Some("kc-ghost".into());
    fake.metadata.uid = Some("00000000-0000-0000-0000-000000000000".into());
    let e = create_rc(
        &c,
        runtime_class(SHIM, &format!("{SHIM}-handler"), Some(&fake)),
    )
    .await
    .unwrap_err();
    assert!(e.contains("can belong to no other owner"), "{e}");
    // as the Shim says: allowed
    create_rc(
        &c,
        runtime_class(SHIM, &format!("{SHIM}-handler"), Some(&shim)),
    )
    .await
    .expect("the Shim's own RuntimeClass");
    rcs.delete(SHIM, &Default::default())
        .await
        .expect("deleting it");
    let _ = env.kubectl(&["delete", "runtimeclass", ADMIN_RC, "--ignore-not-found"]);
    let _ = env.kubectl(&["delete", "shim", SHIM, "--wait=false"]);
}

/// `(resource, verb)` pairs of `kubectl auth can-i --list` output.
fn granted(out: &str) -> std::collections::BTreeSet<(String, String)> {
    let mut set = std::collections::BTreeSet::new();
    for line in out.lines().skip(1) {
        let cols: Vec<&str> = line.split_whitespace().collect();
        // Resources, Non-Resource URLs, Resource Names, Verbs: the verbs are the last [...]
        let (Some(resource), Some(verbs)) = (cols.first(), line.rfind('[')) else {
            continue;
        };
        if resource.starts_with('/') {
            continue; // non-resource URLs
        }
        let verbs = line[verbs..].trim_start_matches('[');
        for v in verbs.trim_end_matches(']').split_whitespace() {
            set.insert((resource.to_string(), v.to_string()));
        }
    }
    set
}

/// `(resource, verb)` pairs of the design's table under `heading` (§7).
fn documented(heading: &str) -> std::collections::BTreeSet<(String, String)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md")).unwrap();
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("the table {heading} in docs/design.md §7"));
    let mut set = std::collections::BTreeSet::new();
    for line in text[start..]
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("| resource"))
        .skip(2)
    {
        let cells: Vec<&str> = line.trim().split('|').map(str::trim).collect();
        if cells.len() < 3 {
            break;
        }
        for resource in cells[1].split(',') {
            let r = resource.trim().split('`').nth(1).unwrap_or_default();
            for v in cells[2].split(',') {
                set.insert((r.to_string(), v.trim().to_string()));
            }
        }
    }
    set
}

const NODE_TABLE: &str = "**What a node's credential holds";
const COORDINATOR_TABLE: &str = "**What the coordinator's credential holds";

/// What `kubeconfig` may do, by `kubectl auth can-i --list`, where shim-agent works.
fn can_i(
    inst: &Instance,
    kubeconfig: &std::path::Path,
) -> std::collections::BTreeSet<(String, String)> {
    let mut all = std::collections::BTreeSet::new();
    for ns in ["default", "shim-agent-system"] {
        let (ok, out) = inst
            .env
            .kubectl_as(kubeconfig, &["auth", "can-i", "--list", "-n", ns]);
        assert!(ok, "{out}");
        all.extend(granted(&out));
    }
    all
}

/// What `after` grants beyond `before` is all in the design's table under `heading`.
fn only_listed(
    who: &str,
    before: &std::collections::BTreeSet<(String, String)>,
    after: &std::collections::BTreeSet<(String, String)>,
    heading: &str,
) {
    let added: Vec<&(String, String)> = after.difference(before).collect();
    assert!(
        !added.is_empty(),
        "the manifests grant {who} nothing? {after:?}"
    );
    let listed = documented(heading);
    let unlisted: Vec<_> = added.iter().filter(|p| !listed.contains(p)).collect();
    assert!(
        unlisted.is_empty(),
        "the manifests grant {who} verbs docs/design.md §7 ({heading}) does not list: {unlisted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_manifests_grant_a_node_identity_is_what_the_design_lists() {
    let _serial = SERIAL.lock().await;
    let Some(inst) = Instance::start("kc-audit", 6943, 24290) else {
        return;
    };
    let node = inst.node_identity("kc-audit-node");
    let coordinator = inst.coordinator_identity();
    let (ok, out) = inst
        .env
        .kubectl(&["create", "serviceaccount", "kc-baseline", "-n", "default"]);
    assert!(ok, "{out}");
    let (ok, out) = inst
        .env
        .apply("apiVersion: v1\nkind: Node\nmetadata: {name: kc-audit-node}\n");
    assert!(ok, "{out}");
    let (node_before, coordinator_before) = (can_i(&inst, &node), can_i(&inst, &coordinator));
    // what any ServiceAccount holds, before the manifests made shim-agent's
    let baseline = inst.env.token_kubeconfig_in("default", "kc-baseline", None);
    let sa_before = can_i(&inst, &baseline);
    let manifests = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/manifests.yaml");
    let (ok, out) = inst
        .env
        .kubectl(&["apply", "--server-side", "-f", manifests]);
    assert!(ok, "{out}");
    only_listed(
        "a kubelet identity",
        &node_before,
        &can_i(&inst, &node),
        NODE_TABLE,
    );
    let bound = inst
        .env
        .token_kubeconfig("shim-agent", Some("kc-audit-node"));
    only_listed(
        "the node agents' ServiceAccount",
        &sa_before,
        &can_i(&inst, &bound),
        NODE_TABLE,
    );
    only_listed(
        "a coordinator identity",
        &coordinator_before,
        &can_i(&inst, &coordinator),
        COORDINATOR_TABLE,
    );
    let coordinator_sa = inst.env.token_kubeconfig("shim-agent-coordinator", None);
    only_listed(
        "the coordinator's ServiceAccount",
        &sa_before,
        &can_i(&inst, &coordinator_sa),
        COORDINATOR_TABLE,
    );
}

/// The taint the ServiceAccount test's node starts with.
const SA_TAINT: &str = "containerd.x-k8s.io/kc-sa-pending";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_and_the_coordinator_do_all_their_work_as_service_accounts() {
    let _serial = SERIAL.lock().await;
    let Some(mut rig) = Rig::new("kc-sa").await else {
        return;
    };
    let shim = "kc-sa-spin";
    rig.force_delete(shim).await;
    // the node agent with a token bound to its Node; the coordinator as a Deployment runs it
    rig.kubeconfig = rig.env.token_kubeconfig("shim-agent", Some(&rig.name));
    let nodes: Api<Node> = Api::all(rig.admin.clone());
    let taint = json!({"spec": {"taints": [{"key": SA_TAINT, "effect": "NoSchedule"}]}});
    nodes
        .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .unwrap();
    let f = fake(&rig.w);
    let mut config = rig.config();
    config.coordinator_source = Some(Source::Kubeconfig(
        rig.env.token_kubeconfig("shim-agent-coordinator", None),
    ));
    config.startup_taint = Some(StartupTaint::parse(&format!("{SA_TAINT}:NoSchedule")).unwrap());
    with_agent_config(&rig, &f, config, || async {
        let yaml = shim_builder(&rig.w, shim, "1")
            .node_selector("test", "kc-sa")
            .yaml();
        let (ok, out) = rig.env.apply(&yaml);
        assert!(ok, "{out}");
        // installed: the label, the state and startup-taint annotations, the condition; the
        // coordinator took the taint off; the slot was taken and given back
        eventually(60, "labelled, ready and the startup taint off", || async {
            let n = rig.node().await;
            let ready = n
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == SHIMS_READY && c.status == "True");
            let tainted = n
                .spec
                .as_ref()?
                .taints
                .iter()
                .flatten()
                .any(|t| t.key == SA_TAINT);
            let state = n.annotations().get(STATE_ANNOTATION)?;
            (rig.label(shim).await.as_deref() == Some("true")
                && state.contains("\"phase\":\"Installed\"")
                && n.annotations().contains_key(STARTUP_TAINT_ANNOTATION)
                && ready
                && !tainted)
                .then_some(())
        })
        .await;
        let slot = Api::<ShimLease>::namespaced(rig.admin.clone(), NAMESPACE)
            .get(&slot_name(shim, 0))
            .await
            .unwrap();
        assert_eq!(slot.spec.holder_identity, None, "the slot given back");
        assert_eq!(slot.spec.lease_transitions, Some(1), "the slot taken once");
        let events: Api<Event> = Api::namespaced(rig.admin.clone(), "default");
        eventually(30, "the Installed Event on the Node", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("Installed")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some(rig.name.as_str())
                })
                .then_some(())
        })
        .await;
        // no longer selected: the label comes off, then the uninstall
        let moved = json!({"metadata": {"labels": {"test": "kc-sa-elsewhere"}}});
        nodes
            .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&moved))
            .await
            .unwrap();
        eventually(60, "unlabelled and uninstalled", || async {
            let n = rig.node().await;
            let state = n
                .annotations()
                .get(STATE_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            (rig.label(shim).await.is_none() && !state.contains(shim)).then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(*f.restarts.borrow(), 2, "the install and the uninstall");
    rig.force_delete(shim).await;
}
