//! The agent's edges on the real API server: changes that arrive together, a static Shim of
//! the same name as a cluster Shim, and a node name that matches no Node.

use std::time::Duration;

use kube::Api;

use shim_agent::api::load::parse_shims;
use shim_agent::cluster::session;

use crate::support;
use crate::support::agent_rig::{Rig, cluster_node, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shims_applied_together_share_one_transaction_and_one_restart() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-batch").await else {
        return;
    };
    let names = ["ke-batch-a", "ke-batch-b", "ke-batch-c"];
    for n in names {
        rig.force_delete(n).await;
    }
    // applied before the agent starts, so its first round sees all three: arrivals while
    // it runs are spread over the API server's answers (tests/kube/late_batch.rs: one that
    // arrives while the node waits for a slot joins the transaction)
    let docs: Vec<String> = names
        .iter()
        .map(|n| shim_yaml(&rig.w, n, "1", ("test", "ke-batch")))
        .collect();
    let since = k8s_openapi::jiff::Timestamp::now();
    let (ok, out) = rig.env.apply(&docs.join("---\n"));
    assert!(ok, "{out}");
    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        for n in names {
            eventually(30, &format!("the label of {n}"), || async {
                (rig.label(n).await.as_deref() == Some("true")).then_some(())
            })
            .await;
        }
        // each Shim its Installed Event, and the Node one for the three
        let on_node = eventually(30, "the Installed Events", || async {
            for n in names {
                if installed_events(&rig, n, since).await.len() != 1 {
                    return None;
                }
            }
            Some(installed_events(&rig, &rig.name, since).await).filter(|e| !e.is_empty())
        })
        .await;
        assert_eq!(
            on_node,
            vec![format!(
                "Installed for 3 Shims: {}; each Shim's own Event says more",
                names.join(", ")
            )]
        );
    })
    .await;
    assert_eq!(
        *f.restarts.borrow(),
        1,
        "three Shims, one containerd restart"
    );
    for n in names {
        rig.force_delete(n).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_shim_wins_over_the_cluster_shim_of_the_same_name_and_the_node_says_so() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-static").await else {
        return;
    };
    let shim = "ke-static-spin";
    rig.force_delete(shim).await;
    // the node owner's file, with another artifact than the cluster's
    let dir = rig.w.root.resolve("/etc/shim-agent/shims.d").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let mine = shim_yaml(&rig.w, shim, "mine", ("test", "ke-static"));
    std::fs::write(dir.join("mine.yaml"), &mine).unwrap();
    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "cluster", ("test", "ke-static")));
        assert!(ok, "{out}");
        let state = eventually(30, "Conflict on the node", || async {
            let s = rig.state_annotation().await?;
            s.contains("StaticShimWins").then_some(s)
        })
        .await;
        assert!(state.contains("\"phase\":\"Conflict\""), "{state}");
        assert_eq!(
            rig.label(shim).await,
            None,
            "the cluster's Shim is not served here"
        );
    })
    .await;
    let st = support::live::state(&rig.w);
    assert_eq!(st.shims[shim].origin, shim_agent::state::Origin::Static);
    let digest_of = |y: &str| {
        let shim = parse_shims(y, "mine.yaml").unwrap().remove(0);
        shim.spec.fetch_strategy.anon_http.unwrap().sha256.unwrap()
    };
    assert_eq!(
        st.shims[shim].artifact_sha256,
        digest_of(&mine),
        "the static artifact runs"
    );
    rig.force_delete(shim).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_name_that_matches_no_node_ends_the_agent_with_an_error_that_says_so() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-noname").await else {
        return;
    };
    let f = fake(&rig.w);
    let n = cluster_node(&rig.w, &f);
    let mut config = rig.config();
    // the kubelet identity of ke-noname-node, but a name with no Node object
    config.node_name = "ke-no-such-node".into();
    config.node_wait = Duration::from_secs(2);
    let (_tx, rx) = tokio::sync::watch::channel(false);
    let e = session::run(&n, config, rx).await.unwrap_err().to_string();
    assert!(
        e.contains("no Node named \"ke-no-such-node\"") && e.contains("node.name"),
        "{e}"
    );
    assert_eq!(*f.restarts.borrow(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_restart_is_rolled_back_reported_as_failed_and_an_upgrade_is_an_event_too() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-rollback").await else {
        return;
    };
    let shim = "ke-rollback-spin";
    rig.fresh(shim).await;
    let mut f = fake(&rig.w);
    f.fail_restarts = vec![1]; // the first restart fails; the rollback's restart works
    let original = support::live::config(&rig.w);
    // this run's Events (a CI run's second pass finds the first pass's too)
    let since = k8s_openapi::jiff::Timestamp::now();
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-rollback")));
        let state = eventually(30, "Failed on the node", || async {
            let s = rig.state_annotation().await?;
            s.contains("\"phase\":\"Failed\"").then_some(s)
        })
        .await;
        assert!(state.contains("RolledBack"), "{state}");
        assert_eq!(rig.label(shim).await, None);
        eventually(30, "a RolledBack Event on the Shim", || async {
            rig.events_since(shim, since)
                .await
                .iter()
                .any(|(r, n)| r == "RolledBack" && n.contains("rolled back"))
                .then_some(())
        })
        .await;
        eventually(30, "Degraded on the Shim", || async {
            (rig.condition(shim, "Degraded").await? == ("True".into(), "RolledBack".into()))
                .then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(
        support::live::config(&rig.w),
        original,
        "rolled back to the same bytes"
    );
    // once containerd restarts again, the Shim installs and then upgrades, with Events
    f.fail_restarts.clear();
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "2", ("test", "ke-rollback")));
        eventually(30, "the install", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "3", ("test", "ke-rollback")));
        eventually(30, "Upgraded Events on the Shim and the Node", || async {
            let on_shim = rig.events_since(shim, since).await;
            let on_node = rig.events_since(&rig.name, since).await;
            (on_shim.iter().any(|(r, _)| r == "Upgraded")
                && on_node.iter().any(|(r, _)| r == "Upgraded"))
            .then_some(())
        })
        .await;
    })
    .await;
    rig.force_delete(shim).await;
}

/// A batch that holds the slot of its first Shim while it waits for its second gives the
/// first back as it was when the wait ends without a slot (here: the agent stops). Nothing
/// was tried, so nothing is marked failed: a failure mark would count against the first
/// Shim's `maxFailures` and could halt its rollout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_stops_waiting_gives_back_the_slots_it_took_unmarked() {
    use kube::ResourceExt;
    use shim_agent::api::lease::{SLOT_FAILED, ShimLease};
    use shim_agent::cluster::{NAMESPACE, lease_edits, slots::slot_name};
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-bwait").await else {
        return;
    };
    let (a, b) = ("ke-bwait-a", "ke-bwait-b");
    for n in [a, b] {
        rig.force_delete(n).await;
    }
    let other = "ke-bwait-other";
    rig.env
        .create_node(other, &[("test", "ke-bwait-other")])
        .await;
    let other_uid = Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
        .get(other)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let leases: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        // B's only slot, held by another node (which never gives it back)
        rig.env
            .apply(&shim_yaml(&rig.w, b, "1", ("test", "ke-bwait-nobody")));
        let slot = eventually(30, "B's slot", || async {
            leases.get_opt(&slot_name(b, 0)).await.unwrap()
        })
        .await;
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let held = lease_edits::take(slot, other, &other_uid, now);
        leases
            .replace(&slot_name(b, 0), &Default::default(), &held)
            .await
            .unwrap();
        // A and B for this node, together: one batch (the Node gets the label both select
        // once both exist), A's slot taken, B's waited for
        let docs = [a, b].map(|n| shim_yaml(&rig.w, n, "1", ("bwait", "go")));
        let (ok, out) = rig.env.apply(&docs.join("---\n"));
        assert!(ok, "{out}");
        eventually(30, "A's slot", || async {
            leases.get_opt(&slot_name(a, 0)).await.unwrap()
        })
        .await;
        let label = serde_json::json!({"metadata": {"labels": {"bwait": "go"}}});
        Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
            .patch(
                &rig.name,
                &Default::default(),
                &kube::api::Patch::Merge(&label),
            )
            .await
            .unwrap();
        eventually(30, "A's slot held by this node", || async {
            let l = leases.get_opt(&slot_name(a, 0)).await.unwrap()?;
            (l.spec.holder_identity.as_deref() == Some(rig.name.as_str())).then_some(())
        })
        .await;
    })
    .await;
    let l = leases.get(&slot_name(a, 0)).await.unwrap();
    assert_eq!(l.spec.holder_identity, None, "A's slot given back");
    assert!(
        !l.annotations().contains_key(SLOT_FAILED),
        "not marked failed: {:?}",
        l.annotations()
    );
    assert_eq!(*f.restarts.borrow(), 0, "nothing was tried");
    for n in [a, b] {
        rig.force_delete(n).await;
    }
}

/// The notes of the Installed Events about `name` (a Shim or the Node) since `since`.
async fn installed_events(
    rig: &Rig,
    name: &str,
    since: k8s_openapi::jiff::Timestamp,
) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(rig.admin.clone(), "default");
    let list = events.list(&Default::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("Installed")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.event_time.as_ref().is_some_and(|t| t.0 >= since)
        })
        .filter_map(|e| e.note)
        .collect()
}
