//! The node's `containerd.x-k8s.io/ShimsReady` condition and its startup taint on the real API
//! server, under the node's own identity: the agent keeps the condition (False naming the
//! pending and failed Shims, True once every Shim targeting the node is installed, written
//! only on change); NodeRestriction forbids the kubelet identity to change its own taints, so
//! the coordinator removes the taint the node names, once the condition is True, and the
//! node-taints policy holds the coordinator to exactly that.

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use shim_agent::api::lease::SLOT_RESERVATIONS_ANNOTATION;
use shim_agent::cluster::STATE_ANNOTATION;
use shim_agent::cluster::readiness::{SHIMS_READY, STARTUP_TAINT_ANNOTATION, StartupTaint};

use crate::support::agent_rig::{Rig, with_agent_config};
use crate::support::kube::{SERIAL, client_for, eventually, kube_env};
use crate::support::live::{fake, shim_builder};
use crate::support::shim_builder::ShimBuilder;

const TAINT: &str = "containerd.x-k8s.io/shims-pending";

/// The ShimsReady condition: (status, reason, message, lastHeartbeatTime,
/// lastTransitionTime).
fn condition(n: &KubeNode) -> Option<(String, String, String, String, String)> {
    let c = n
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == SHIMS_READY)?
        .clone();
    Some((
        c.status,
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
        c.last_heartbeat_time
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
        c.last_transition_time
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    ))
}

fn taint_keys(n: &KubeNode) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| t.key)
        .collect()
}

async fn set_taints(admin: &Api<KubeNode>, node: &str, taints: serde_json::Value) {
    let patch = json!({"spec": {"taints": taints}});
    admin
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_condition_follows_the_shims_and_the_startup_taint_comes_off_once_it_is_true() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("krd-taint").await else {
        return;
    };
    let (good, bad) = ("krd-good", "krd-bad");
    rig.force_delete(good).await;
    rig.force_delete(bad).await;
    let nodes: Api<KubeNode> = Api::all(rig.admin.clone());
    set_taints(
        &nodes,
        &rig.name,
        json!([{"key": TAINT, "effect": "NoSchedule"}, {"key": "other", "value": "x", "effect": "NoSchedule"}]),
    )
    .await;
    // a provisioner's label in advance (an autoscaler then sees the RuntimeClass's selector
    // met): kept while the startup taint keeps pods off, though the Shim is not served yet
    let prelabel = json!({"metadata": {"labels": {format!("containerd.x-k8s.io/{bad}"): "true"}}});
    nodes
        .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&prelabel))
        .await
        .unwrap();
    let f = fake(&rig.w);
    let mut config = rig.config();
    config.startup_taint = Some(StartupTaint::parse(&format!("{TAINT}:NoSchedule")).unwrap());
    with_agent_config(&rig, &f, config, || async {
        // one Shim that cannot install, one that can
        let missing = ShimBuilder::new(bad)
            .node_selector("test", "krd-taint")
            .artifact("file:///nonexistent/krd-bad.tar.gz", &"0".repeat(64))
            .yaml();
        let (ok, out) = rig.env.apply(&missing);
        assert!(ok, "{out}");
        let (ok, out) = rig.env.apply(
            &shim_builder(&rig.w, good, "1")
                .node_selector("test", "krd-taint")
                .yaml(),
        );
        assert!(ok, "{out}");
        let (_, reason, message, _, _) = eventually(60, "ShimsReady False naming the failed Shim", || async {
            let c = condition(&rig.node().await)?;
            (c.0 == "False" && c.1 == "ShimsFailed" && c.2.contains(&format!("{bad} (Failed"))
                && !c.2.contains(good))
            .then_some(c)
        })
        .await;
        eprintln!("ShimsReady False: {reason}: {message}");
        let n = rig.node().await;
        assert_eq!(
            n.annotations().get(STARTUP_TAINT_ANNOTATION).map(String::as_str),
            Some("containerd.x-k8s.io/shims-pending:NoSchedule"),
            "the node names its startup taint"
        );
        assert!(taint_keys(&n).contains(&TAINT.to_string()), "removed before the Shims are ready");
        assert_eq!(
            n.labels().get(&format!("containerd.x-k8s.io/{bad}")).map(String::as_str),
            Some("true"),
            "the provisioner's label went while the startup taint is on"
        );

        // NodeRestriction: the kubelet identity cannot take its own taint off
        let as_node: Api<KubeNode> = Api::all(client_for(&rig.kubeconfig).await);
        let e = as_node
            .patch(
                &rig.name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"taints": [{"key": "other", "value": "x", "effect": "NoSchedule"}]}})),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("not allowed to modify taints"), "{e}");

        // the failed Shim goes: ready, and the coordinator takes the startup taint off
        rig.force_delete(bad).await;
        let (_, reason, message, beat, since) = eventually(60, "ShimsReady True", || async {
            condition(&rig.node().await).filter(|c| c.0 == "True")
        })
        .await;
        assert_eq!(reason, "ShimsInstalled");
        assert_eq!(message, format!("installed and verified: {good}"));
        let n = eventually(30, "the startup taint removed", || async {
            let n = rig.node().await;
            (!taint_keys(&n).contains(&TAINT.to_string())).then_some(n)
        })
        .await;
        assert_eq!(taint_keys(&n), ["other"], "only the startup taint goes");
        assert!(
            !n.labels().contains_key(&format!("containerd.x-k8s.io/{bad}")),
            "the label of a Shim no longer there stays"
        );

        // another round (a label change nudges one): no condition write, no taint back
        let nudge = json!({"metadata": {"labels": {"krd-nudge": "1"}}});
        nodes
            .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&nudge))
            .await
            .unwrap();
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let n = rig.node().await;
        assert_eq!(condition(&n).unwrap().3, beat, "the condition was written again unchanged");
        assert_eq!(taint_keys(&n), ["other"], "the startup taint came back");

        // an upgrade: the version before serves meanwhile, so the node stays ready throughout
        // (a False between would have moved lastTransitionTime)
        let digest = |n: &KubeNode| {
            n.annotations()
                .get(STATE_ANNOTATION)
                .cloned()
                .unwrap_or_default()
        };
        let before = digest(&rig.node().await);
        let (ok, out) = rig.env.apply(
            &shim_builder(&rig.w, good, "2")
                .node_selector("test", "krd-taint")
                .yaml(),
        );
        assert!(ok, "{out}");
        eventually(60, "the upgrade installed", || async {
            let now = digest(&rig.node().await);
            (now != before && now.contains("\"phase\":\"Installed\"")).then_some(())
        })
        .await;
        let c = condition(&rig.node().await).unwrap();
        assert_eq!(
            (c.0.as_str(), c.4.as_str()),
            ("True", since.as_str()),
            "not ready during the upgrade"
        );
        assert_eq!(*f.restarts.borrow(), 2, "the install and the upgrade");
    })
    .await;
    rig.force_delete(good).await;
    let _ = nodes.delete(&rig.name, &Default::default()).await;
}

/// `who` (a coordinator identity) may take, of Node `name`, only the startup taint it names,
/// and only once `ready` made its ShimsReady condition True; no other change of the Node.
async fn removes_only_the_startup_taint<F: std::future::Future<Output = ()>>(
    who: &str,
    coordinator: &Api<KubeNode>,
    name: &str,
    ready: impl FnOnce() -> F,
) {
    let write = |patch: serde_json::Value| {
        let c = coordinator.clone();
        async move {
            c.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    let only_other = json!({"spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}});
    let only_startup = json!({"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}]}});
    let named = "may remove only the startup taint the Node names";
    let e = write(only_other.clone()).await.unwrap_err();
    assert!(e.contains(named), "{who}: not ready yet: {e}");
    ready().await;
    let e = write(only_startup).await.unwrap_err();
    assert!(e.contains(named), "{who}: another taint: {e}");
    let e = write(json!({"spec": {"taints": [{"key": TAINT, "effect": "NoSchedule"}, {"key": "other", "effect": "NoSchedule"}, {"key": "new", "effect": "NoSchedule"}]}}))
        .await
        .unwrap_err();
    assert!(e.contains(named), "{who}: a new taint: {e}");
    // nothing else of the Node: labels, annotations, owners (the garbage collector would
    // delete a Node whose owner goes), finalizers, cordon
    let owner = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "0"}]);
    for (what, patch) in [
        ("a label", json!({"metadata": {"labels": {"x": "y"}}})),
        (
            "an annotation",
            json!({"metadata": {"annotations": {"x": "y"}}}),
        ),
        ("an owner", json!({"metadata": {"ownerReferences": owner}})),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/keep"]}}),
        ),
        ("a cordon", json!({"spec": {"unschedulable": true}})),
        ("a provider id", json!({"spec": {"providerID": "evil://x"}})),
    ] {
        let e = write(patch).await.unwrap_err();
        assert!(
            e.contains("may only remove a Node's startup taint"),
            "{who}: {what}: {e}"
        );
    }
    // the reservation hint (docs/design.md §5) is the coordinator's to write and to drop,
    // and nothing rides along with it
    let hint = |v: serde_json::Value| json!({"metadata": {"annotations": {SLOT_RESERVATIONS_ANNOTATION: v}}});
    write(hint(json!("{\"s\":0}")))
        .await
        .unwrap_or_else(|e| panic!("{who}: point the Node at its reserved slot: {e}"));
    let e = write(
        json!({"metadata": {"annotations": {SLOT_RESERVATIONS_ANNOTATION: "{\"s\":1}", "x": "y"}}}),
    )
    .await
    .unwrap_err();
    assert!(
        e.contains("may only remove a Node's startup taint"),
        "{who}: another annotation beside the hint: {e}"
    );
    write(hint(serde_json::Value::Null))
        .await
        .unwrap_or_else(|e| panic!("{who}: drop the hint: {e}"));
    write(only_other)
        .await
        .unwrap_or_else(|e| panic!("{who}: the named taint of a ready node: {e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_identity_may_remove_only_the_named_taint_of_a_ready_node() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let name = "krd-policy-node";
    env.create_node(name, &[("test", "krd-policy")]).await;
    let admin: Api<KubeNode> = Api::all(env.admin_client().await);
    let annotate = json!({"metadata": {"annotations": {STARTUP_TAINT_ANNOTATION: format!("{TAINT}:NoSchedule")}}});
    admin
        .patch(name, &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let set_ready = |status: &'static str| {
        let admin = admin.clone();
        async move {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let c = json!({"status": {"conditions": [{"type": SHIMS_READY, "status": status, "reason": "Test", "message": "", "lastTransitionTime": now, "lastHeartbeatTime": now}]}});
            admin
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(&c))
                .await
                .unwrap();
        }
    };
    let taints =
        json!([{"key": TAINT, "effect": "NoSchedule"}, {"key": "other", "effect": "NoSchedule"}]);
    // the coordinator's certificate, and its ServiceAccount's token (a coordinator Deployment)
    for (who, kubeconfig) in [
        ("certificate", env.coordinator_identity()),
        (
            "ServiceAccount",
            env.token_kubeconfig("shim-agent-coordinator", None),
        ),
    ] {
        set_taints(&admin, name, taints.clone()).await;
        set_ready("False").await;
        let coordinator: Api<KubeNode> = Api::all(client_for(&kubeconfig).await);
        removes_only_the_startup_taint(who, &coordinator, name, || set_ready("True")).await;
    }
    let _ = admin.delete(name, &Default::default()).await;
}
