//! The agent against a real kube-apiserver (tests/support/kube.rs), under the node's own
//! kubelet identity (system:node:<name>, NodeRestriction and RBAC as on a real node). The
//! host side is the scripted containerd of tests/support/live.rs; the node-env tests run the
//! same path with the real systemd and containerd.

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::cluster::{STATE_ANNOTATION, node_label};

use crate::support;
use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_shim_is_installed_labelled_and_published_with_a_ready_status() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ka-apply").await else {
        return;
    };
    let f = fake(&rig.w);
    let shim = "ka-apply-spin";
    rig.force_delete(shim).await;
    with_agent(&rig, &f, || async {
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ka-apply")));
        assert!(ok, "{out}");
        eventually(30, "the node label", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        let rc = eventually(30, "the RuntimeClass", || async {
            Api::<RuntimeClass>::all(rig.admin.clone())
                .get_opt(shim)
                .await
                .unwrap()
        })
        .await;
        assert_eq!(rc.handler, shim);
        let sel = rc.scheduling.unwrap().node_selector.unwrap();
        assert_eq!(sel.get(&node_label(shim)).map(String::as_str), Some("true"));
        eventually(30, "Ready=True", || async {
            (rig.condition(shim, "Ready").await == Some(("True".into(), "AllNodesReady".into())))
                .then_some(())
        })
        .await;
        let s = rig.shim(shim).await.unwrap();
        let counts = s.status.clone().unwrap().nodes.unwrap();
        assert_eq!(
            (counts.targeted, counts.installed, counts.failed),
            (1, 1, 0)
        );
        assert!(
            s.finalizers()
                .contains(&"containerd.x-k8s.io/cleanup".to_string())
        );
        let state = rig.node().await.annotations()[STATE_ANNOTATION].clone();
        assert!(state.contains("\"phase\":\"Installed\""), "{state}");
        // Events on the Shim and on the Node
        let events: Api<Event> = Api::namespaced(rig.admin.clone(), "default");
        eventually(30, "Installed Events on the Shim and the Node", || async {
            let list = events.list(&Default::default()).await.ok()?;
            let on = |kind: &str, name: &str| {
                list.items.iter().any(|e| {
                    e.reason.as_deref() == Some("Installed")
                        && e.regarding.as_ref().is_some_and(|r| {
                            r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                        })
                })
            };
            (on("Shim", shim) && on("Node", &rig.name)).then_some(())
        })
        .await;
        let (ok, table) = rig.env.kubectl(&["get", "shims", shim]);
        assert!(ok, "{table}");
        eprintln!("{table}");
        let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(&row[..6], [shim, shim, "1", "1", "0", "True"], "{table}");
    })
    .await;
    assert_eq!(*f.restarts.borrow(), 1, "one containerd restart");
    assert!(f.serving.borrow().contains(shim));
    rig.force_delete(shim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_artifact_upgrades_the_node_with_one_restart() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ka-upgrade").await else {
        return;
    };
    let f = fake(&rig.w);
    let shim = "ka-upgrade-spin";
    rig.force_delete(shim).await;
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ka-upgrade")));
        eventually(30, "Ready after the install", || async {
            (rig.condition(shim, "Ready").await.map(|c| c.0).as_deref() == Some("True"))
                .then_some(())
        })
        .await;
        eventually(30, "the state annotation", || async {
            rig.node()
                .await
                .annotations()
                .get(STATE_ANNOTATION)
                .map(|_| ())
        })
        .await;
        let digest = |n: KubeNode| {
            n.annotations()
                .get(STATE_ANNOTATION)
                .cloned()
                .unwrap_or_default()
        };
        let before = digest(rig.node().await);
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "2", ("test", "ka-upgrade")));
        assert!(ok, "{out}");
        eventually(30, "the new digest on the node", || async {
            let now = digest(rig.node().await);
            (now != before && now.contains("\"phase\":\"Installed\"")).then_some(())
        })
        .await;
        eventually(30, "Ready at generation 2", || async {
            let s = rig.shim(shim).await?;
            let st = s.status?;
            (st.observed_generation == Some(2)
                && st
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True"))
            .then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(
        *f.restarts.borrow(),
        2,
        "one restart for the install, one for the upgrade"
    );
    rig.force_delete(shim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_no_longer_selected_is_unlabelled_first_and_then_uninstalled_once_its_pods_are_gone()
{
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ka-relabel").await else {
        return;
    };
    let f = fake(&rig.w);
    let shim = "ka-relabel-spin";
    rig.force_delete(shim).await;
    let original = support::live::config(&rig.w);
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ka-relabel")));
        eventually(30, "the RuntimeClass", || async {
            Api::<RuntimeClass>::all(rig.admin.clone())
                .get_opt(shim)
                .await
                .unwrap()
        })
        .await;
        // a pod on the node uses the RuntimeClass
        let pods: Api<Pod> = Api::namespaced(rig.admin.clone(), "default");
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "ka-relabel-user"},
            "spec": {"nodeName": rig.name, "runtimeClassName": shim,
                     "automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "busybox"}]},
        }))
        .unwrap();
        let _ = pods
            .delete("ka-relabel-user", &DeleteParams::default().grace_period(0))
            .await;
        pods.create(&PostParams::default(), &pod).await.unwrap();
        // the node is no longer selected
        let patch = serde_json::json!({"metadata": {"labels": {"test": "elsewhere"}}});
        Api::<KubeNode>::all(rig.admin.clone())
            .patch(&rig.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let state = eventually(30, "Blocked naming the pod", || async {
            let n = rig.node().await;
            let s = n.annotations().get(STATE_ANNOTATION).cloned()?;
            s.contains("Blocked").then_some(s)
        })
        .await;
        assert!(state.contains("default/ka-relabel-user"), "{state}");
        assert_eq!(
            rig.label(shim).await,
            None,
            "the label is off while blocked"
        );
        assert!(
            f.serving.borrow().contains(shim),
            "still installed while a pod uses it"
        );
        pods.delete("ka-relabel-user", &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
        eventually(30, "the uninstall", || async {
            let n = rig.node().await;
            (!n.annotations().contains_key(STATE_ANNOTATION)).then_some(())
        })
        .await;
        // both steps went out as Events on the Shim, the blocked one naming the pod
        let events: Api<Event> = Api::namespaced(rig.admin.clone(), "default");
        eventually(
            30,
            "UninstallBlocked and Uninstalled Events on the Shim",
            || async {
                let list = events.list(&Default::default()).await.ok()?;
                let on_shim = |reason: &str| {
                    list.items.iter().find(|e| {
                        e.reason.as_deref() == Some(reason)
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(shim)
                    })
                };
                let blocked = on_shim("UninstallBlocked")?.note.clone()?;
                on_shim("Uninstalled")?;
                blocked.contains("default/ka-relabel-user").then_some(())
            },
        )
        .await;
    })
    .await;
    assert!(!f.serving.borrow().contains(shim));
    assert_eq!(
        support::live::config(&rig.w),
        original,
        "config bytes restored"
    );
    rig.force_delete(shim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_shim_cleans_the_node_removes_the_runtimeclass_and_then_the_finalizer() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ka-delete").await else {
        return;
    };
    let f = fake(&rig.w);
    let shim = "ka-delete-spin";
    rig.force_delete(shim).await;
    let original = support::live::config(&rig.w);
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ka-delete")));
        eventually(30, "the RuntimeClass", || async {
            Api::<RuntimeClass>::all(rig.admin.clone())
                .get_opt(shim)
                .await
                .unwrap()
        })
        .await;
        Api::<Shim>::all(rig.admin.clone())
            .delete(shim, &DeleteParams::default())
            .await
            .unwrap();
        eventually(30, "the Shim gone (finalizer removed)", || async {
            rig.shim(shim).await.is_none().then_some(())
        })
        .await;
        assert_eq!(rig.label(shim).await, None);
        let rc = Api::<RuntimeClass>::all(rig.admin.clone())
            .get_opt(shim)
            .await
            .unwrap();
        assert!(rc.is_none_or(|r| r.metadata.deletion_timestamp.is_some()));
    })
    .await;
    assert_eq!(
        support::live::config(&rig.w),
        original,
        "config bytes restored"
    );
    assert!(!f.serving.borrow().contains(shim));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_install_is_adopted_on_first_boot_without_a_second_restart() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ka-adopt").await else {
        return;
    };
    let shim = "ka-adopt-spin";
    rig.force_delete(shim).await;
    // the image builder's half: `install --root` into the node's image
    let yaml = shim_yaml(&rig.w, shim, "1", ("test", "ka-adopt"));
    let parsed = shim_agent::api::load::parse_shims(&yaml, "shim.yaml")
        .unwrap()
        .remove(0);
    let opts = shim_agent::cli::image::InstallOptions {
        platform: shim_agent::artifact::node_platform(),
        containerd_version: None,
        progress: false,
    };
    shim_agent::cli::image::install_offline(&rig.w.root, &rig.w.settings, &parsed, &opts)
        .await
        .unwrap();
    // first boot: containerd starts with the baked config
    let f = fake(&rig.w);
    assert!(f.serving.borrow().contains(shim));
    with_agent(&rig, &f, || async {
        let (ok, out) = rig.env.apply(&yaml);
        assert!(ok, "{out}");
        eventually(30, "the label on the adopted node", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        eventually(30, "Ready=True", || async {
            (rig.condition(shim, "Ready").await?.0 == "True").then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(*f.restarts.borrow(), 0, "adopted without a restart");
    let st = support::live::state(&rig.w);
    assert_eq!(
        st.shims[shim].state,
        shim_agent::state::ShimState::Installed
    );
    assert_eq!(st.shims[shim].origin, shim_agent::state::Origin::Cluster);
    rig.force_delete(shim).await;
}
