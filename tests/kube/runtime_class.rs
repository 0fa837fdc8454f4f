//! `spec.runtimeClass`'s whole scheduling story on the real API server: the CEL rules refuse
//! each bad class with its message; the coordinator applies the RuntimeClass with the Shim's
//! overhead, tolerations, nodeSelector terms, labels and annotations, and follows the Shim
//! when they change; the RuntimeClass admission gives a pod of the class the overhead and the
//! toleration; kube-scheduler places it on the tainted pool only the toleration opens; and the
//! coordinator identity cannot write a class that says otherwise than its Shim.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use shim_agent::api::{Shim, TaintEffect};

use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, client_for, eventually, kube_env};
use crate::support::live::{fake, shim_builder};
use crate::support::runtime_classes::{BAD, FULL, shim_yaml};

#[test]
fn the_server_refuses_each_bad_class_with_the_rule_message() {
    let Some(env) = kube_env() else { return };
    let dry = |yaml: &str| env.apply_dry_run(yaml);
    let (ok, out) = dry(&shim_yaml("rc-full", FULL));
    assert!(ok, "the full class is refused: {out}");
    for (name, runtime_class, message) in BAD {
        let (ok, out) = dry(&shim_yaml(name, runtime_class));
        assert!(!ok, "accepted {name}: {runtime_class}");
        assert!(
            out.contains(message),
            "{name}: expected {message:?} in:\n{out}"
        );
    }
}

const SHIM: &str = "krc-pool";
const TAINT: (&str, &str) = ("krc-pool/dedicated", "sandbox");

/// The rig's Node made schedulable as a kubelet would report it (Ready, room for pods), in a
/// dedicated pool: labelled `pool=<SHIM>` and tainted `TAINT:NoSchedule`.
async fn make_tainted_pool(rig: &Rig) {
    let nodes: Api<KubeNode> = Api::all(rig.admin.clone());
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let room = json!({"cpu": "4", "memory": "8Gi", "pods": "110"});
    let status = json!({"status": {
        "capacity": room, "allocatable": room,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "test", "lastHeartbeatTime": now, "lastTransitionTime": now}],
    }});
    nodes
        .patch_status(&rig.name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let spec = json!({
        "metadata": {"labels": {"pool": SHIM}},
        "spec": {"taints": [{"key": TAINT.0, "value": TAINT.1, "effect": "NoSchedule"}]},
    });
    nodes
        .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&spec))
        .await
        .unwrap();
}

fn pod(name: &str, runtime_class: Option<&str>, node_selector: Option<serde_json::Value>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"runtimeClassName": runtime_class, "nodeSelector": node_selector,
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "c", "image": "busybox",
                                 "resources": {"requests": {"cpu": "100m"}}}]},
    }))
    .unwrap()
}

async fn recreate(pods: &Api<Pod>, pod: &Pod) -> Pod {
    let dp = DeleteParams::default().grace_period(0);
    let _ = pods.delete(&pod.name_any(), &dp).await;
    eventually(30, "the old pod gone", || async {
        pods.get_opt(&pod.name_any())
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    pods.create(&PostParams::default(), pod).await.unwrap()
}

fn quantities(pairs: &[(&str, &str)]) -> BTreeMap<String, Quantity> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_of_the_class_gets_its_overhead_and_toleration_and_lands_on_the_tainted_pool() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new(SHIM).await else {
        return;
    };
    rig.env.with_scheduler();
    rig.force_delete(SHIM).await;
    make_tainted_pool(&rig).await;
    let f = fake(&rig.w);
    let shim = shim_builder(&rig.w, SHIM, "1")
        .node_selector("test", SHIM)
        .overhead("cpu", "250m")
        .overhead("memory", "160Mi")
        .class_node_selector("pool", SHIM)
        .toleration(TAINT.0, TAINT.1, TaintEffect::NoSchedule)
        .class_label("team", "infra")
        .class_label("tier", "sandbox")
        .class_annotation("containerd.x-k8s.io/version", "1.0.0");
    let rcs: Api<RuntimeClass> = Api::all(rig.admin.clone());
    let pods: Api<Pod> = Api::namespaced(rig.admin.clone(), "default");
    with_agent(&rig, &f, || async {
        let (ok, out) = rig.env.apply(&shim.yaml());
        assert!(ok, "{out}");
        let rc = eventually(30, "the RuntimeClass", || async {
            rcs.get_opt(SHIM).await.unwrap()
        })
        .await;
        let sched = rc.scheduling.clone().unwrap();
        assert_eq!(
            sched.node_selector.unwrap(),
            BTreeMap::from([
                (format!("containerd.x-k8s.io/{SHIM}"), "true".to_string()),
                ("pool".to_string(), SHIM.to_string()),
            ])
        );
        let tolerations = sched.tolerations.unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].key.as_deref(), Some(TAINT.0));
        assert_eq!(
            rc.overhead.clone().unwrap().pod_fixed.unwrap(),
            quantities(&[("cpu", "250m"), ("memory", "160Mi")])
        );
        assert_eq!(rc.labels().get("team").map(String::as_str), Some("infra"));
        assert_eq!(
            rc.annotations()
                .get("containerd.x-k8s.io/version")
                .map(String::as_str),
            Some("1.0.0")
        );

        // without the class's toleration, a pod that asks for the same nodes stays pending
        let selector = json!({format!("containerd.x-k8s.io/{SHIM}"): "true", "pool": SHIM});
        let plain = recreate(&pods, &pod("krc-plain", None, Some(selector))).await;
        // a pod of the class: the admission adds the overhead, the selector, the toleration
        let user = recreate(&pods, &pod("krc-user", Some(SHIM), None)).await;
        let spec = user.spec.clone().unwrap();
        assert_eq!(
            spec.overhead.unwrap(),
            quantities(&[("cpu", "250m"), ("memory", "160Mi")])
        );
        assert!(
            spec.tolerations
                .unwrap_or_default()
                .iter()
                .any(|t| t.key.as_deref() == Some(TAINT.0) && t.value.as_deref() == Some(TAINT.1)),
            "no class toleration on the pod"
        );
        let bound = eventually(60, "the class's pod bound", || async {
            pods.get(&user.name_any()).await.unwrap().spec?.node_name
        })
        .await;
        assert_eq!(bound, rig.name, "bound to the tainted pool");
        let why = eventually(
            30,
            "the pod without the toleration unschedulable",
            || async {
                let p = pods.get(&plain.name_any()).await.unwrap();
                assert_eq!(
                    p.spec.and_then(|s| s.node_name),
                    None,
                    "a pod without the toleration was bound to the tainted pool"
                );
                p.status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
                    .message
            },
        )
        .await;
        assert!(why.contains("untolerated taint"), "{why}");
        let dp = DeleteParams::default().grace_period(0);
        for p in ["krc-plain", "krc-user"] {
            let _ = pods.delete(p, &dp).await;
        }

        // the Shim changes: a label and the toleration dropped, the overhead raised
        let changed = shim_builder(&rig.w, SHIM, "1")
            .node_selector("test", SHIM)
            .overhead("cpu", "500m")
            .class_node_selector("pool", SHIM)
            .class_label("team", "infra")
            .class_annotation("containerd.x-k8s.io/version", "1.0.0");
        let (ok, out) = rig.env.apply(&changed.yaml());
        assert!(ok, "{out}");
        let rc = eventually(30, "the RuntimeClass following the Shim", || async {
            let rc = rcs.get_opt(SHIM).await.unwrap()?;
            let fixed = rc.overhead.clone()?.pod_fixed?;
            (fixed == quantities(&[("cpu", "500m")])).then_some(rc)
        })
        .await;
        assert!(!rc.labels().contains_key("tier"), "the dropped label stays");
        assert_eq!(rc.labels().get("team").map(String::as_str), Some("infra"));
        assert_eq!(
            rc.scheduling.unwrap().tolerations,
            None,
            "the dropped toleration stays"
        );
    })
    .await;
    rig.force_delete(SHIM).await;
    let _ = Api::<KubeNode>::all(rig.admin.clone())
        .delete(&rig.name, &DeleteParams::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_identity_cannot_give_a_shims_class_other_tolerations_selector_or_overhead()
{
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let name = "krc-policy";
    let _ = env.kubectl(&["delete", "runtimeclass", name, "--ignore-not-found"]);
    let shim_text = shim_yaml(
        name,
        &format!(
            r#"{{name: {name}, overhead: {{podFixed: {{cpu: 1}}}}, scheduling: {{nodeSelector: {{pool: a}}, tolerations: [{{key: pool, operator: Exists}}]}}}}"#
        ),
    );
    let (ok, out) = env.apply(&shim_text);
    assert!(ok, "{out}");
    let admin = client_for(&env.admin).await;
    let shim = Api::<Shim>::all(admin.clone()).get(name).await.unwrap();
    let c = client_for(&env.coordinator_identity()).await;
    let rcs: Api<RuntimeClass> = Api::all(c);
    let seen: Api<RuntimeClass> = Api::all(admin);
    // what the coordinator writes: accepted (the overhead as another form of the same quantity)
    let good = shim_agent::cluster::coordinator::runtime_class(&shim);
    let create = |rc: RuntimeClass| {
        let (rcs, seen) = (rcs.clone(), seen.clone());
        async move {
            let r = rcs.create(&PostParams::default(), &rc).await;
            if r.is_ok() {
                let _ = rcs.delete(name, &DeleteParams::default()).await;
                eventually(30, "the class gone", || async {
                    seen.get_opt(name).await.unwrap().is_none().then_some(())
                })
                .await;
            }
            r.map(|_| ()).map_err(|e| e.to_string())
        }
    };
    let mut same = good.clone();
    same.overhead.as_mut().unwrap().pod_fixed = Some(quantities(&[("cpu", "1000m")]));
    create(same).await.expect("the Shim's own class");
    let scheduling = "must have the Shim's tolerations and nodeSelector terms";
    let overhead = "must have the Shim's overhead";
    type Change = fn(&mut RuntimeClass);
    let cases: [(&str, Change, &str); 5] = [
        (
            "a toleration of every taint",
            |rc| {
                let t = rc
                    .scheduling
                    .as_mut()
                    .unwrap()
                    .tolerations
                    .as_mut()
                    .unwrap();
                t[0].key = None;
            },
            scheduling,
        ),
        (
            "no nodeSelector term",
            |rc| {
                let s = rc
                    .scheduling
                    .as_mut()
                    .unwrap()
                    .node_selector
                    .as_mut()
                    .unwrap();
                s.remove("pool");
            },
            scheduling,
        ),
        (
            "another nodeSelector term",
            |rc| {
                let s = rc
                    .scheduling
                    .as_mut()
                    .unwrap()
                    .node_selector
                    .as_mut()
                    .unwrap();
                s.insert("pool".into(), "b".into());
            },
            scheduling,
        ),
        ("no overhead", |rc| rc.overhead = None, overhead),
        (
            "a smaller overhead",
            |rc| {
                rc.overhead.as_mut().unwrap().pod_fixed = Some(quantities(&[("cpu", "1m")]));
            },
            overhead,
        ),
    ];
    for (what, change, message) in cases {
        let mut rc = good.clone();
        change(&mut rc);
        let e = create(rc).await.expect_err(what);
        assert!(e.contains(message), "{what}: {e}");
    }
    let _ = env.kubectl(&["delete", "shim", name, "--wait=false"]);
}
