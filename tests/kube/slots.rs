//! Rollout slots on the real kube-apiserver: the admission policy holds each kubelet identity
//! to its own slot, and a deleted Node's slot becomes freeable only through Kubernetes' own
//! garbage collector.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::{ShimLease, ShimLeaseSpec};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::slots::{SLOT_FAILED, SLOT_SHIM_LABEL, slot_name};

use crate::support::kube::{SERIAL, client_for, eventually, kube_env};
use crate::support::shim_builder::ShimBuilder;

fn shim() -> String {
    ShimBuilder::new("kslots")
        // its own nodes only: a Shim left behind by an interrupted run selects no other test's node
        .node_selector("test", "kslots")
        .artifact(
            "https://example.com/shim.tar.gz",
            "3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0",
        )
        .yaml()
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

/// `slot` with `holder` and the holder's Node among the owners (as an agent takes it).
fn held_by(slot: &ShimLease, holder: Option<(&str, &str)>) -> ShimLease {
    let mut s = slot.clone();
    s.spec.holder_identity = holder.map(|(n, _)| n.to_string());
    let mut owners: Vec<OwnerReference> = s
        .owner_references()
        .iter()
        .filter(|o| o.kind != "Node")
        .cloned()
        .collect();
    if let Some((n, uid)) = holder {
        owners.push(owner("Node", "v1", n, uid));
    }
    s.metadata.owner_references = Some(owners);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_may_take_and_free_only_its_own_slot_and_a_deleted_nodes_slot_is_freed_via_gc() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    env.create_node("kslots-a", &[("test", "kslots")]).await;
    env.create_node("kslots-b", &[("test", "kslots")]).await;
    let (ok, out) = env.apply(&shim());
    assert!(ok, "{out}");
    let admin = env.admin_client().await;
    let shim = Api::<Shim>::all(admin.clone()).get("kslots").await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let uid_a = nodes.get("kslots-a").await.unwrap().uid().unwrap();

    let name = slot_name("kslots", 0);
    let leases: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
    let _ = leases.delete(&name, &DeleteParams::default()).await;
    let mut slot = ShimLease::new(&name, ShimLeaseSpec::default());
    slot.metadata.namespace = Some(NAMESPACE.into());
    slot.metadata.labels = Some([(SLOT_SHIM_LABEL.to_string(), "kslots".to_string())].into());
    slot.metadata.owner_references = Some(vec![shim.controller_owner_ref(&()).unwrap()]);
    eventually(10, "the old slot gone", || async {
        leases.create(&PostParams::default(), &slot).await.ok()
    })
    .await;

    let as_a: Api<ShimLease> =
        Api::namespaced(client_for(&env.node_identity("kslots-a")).await, NAMESPACE);
    let as_b: Api<ShimLease> =
        Api::namespaced(client_for(&env.node_identity("kslots-b")).await, NAMESPACE);
    let pp = PostParams::default();
    let denied = |r: Result<ShimLease, kube::Error>, what: &str, msg: &str| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what}: allowed"))
            .to_string();
        assert!(e.contains(msg), "{what}: {e}");
    };

    // a takes it for b: no
    let cur = as_a.get(&name).await.unwrap();
    denied(
        as_a.replace(&name, &pp, &held_by(&cur, Some(("kslots-b", "x"))))
            .await,
        "a takes for b",
        "may take a free slot only for itself",
    );
    // a takes it for itself, its Node as an owner: yes
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, Some(("kslots-a", &uid_a))))
        .await
        .expect("a takes its own");
    // b frees it, renews it, marks it, deletes it, or drops a's ownership: no
    denied(
        as_b.replace(&name, &pp, &held_by(&cur, None)).await,
        "b frees a's",
        "free only its own",
    );
    let mut renewed = cur.clone();
    renewed.spec.lease_transitions = Some(7);
    denied(
        as_b.replace(&name, &pp, &renewed).await,
        "b renews a's",
        "may not renew or mark the slot of kslots-a",
    );
    let mut marked = cur.clone();
    marked
        .annotations_mut()
        .insert(SLOT_FAILED.into(), "{}".into());
    denied(
        as_b.replace(&name, &pp, &marked).await,
        "b marks a's failed",
        "may not renew or mark",
    );
    // (no node deletes a slot at all: only the coordinator creates and retires them)
    let e = as_b
        .delete(&name, &DeleteParams::default())
        .await
        .expect_err("b deletes a's slot: allowed")
        .to_string();
    assert!(e.contains("forbidden"), "b deletes: {e}");
    let mut unowned = cur.clone();
    unowned.metadata.owner_references = Some(vec![shim.controller_owner_ref(&()).unwrap()]);
    denied(
        as_b.replace(&name, &pp, &unowned).await,
        "b drops a's ownership",
        "only its own Node as an owner",
    );
    // a marks its failure and frees its own: yes
    let cur = as_a
        .replace(&name, &pp, &marked)
        .await
        .expect("a marks its own");
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, None))
        .await
        .expect("a frees its own");

    // a takes it again, then Node a is deleted: the garbage collector drops the dangling
    // owner, and b may free it (the coordinator's duty)
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, Some(("kslots-a", &uid_a))))
        .await
        .unwrap();
    denied(
        as_b.replace(&name, &pp, &held_by(&cur, None)).await,
        "b frees a live node's",
        "free only its own",
    );
    nodes
        .delete("kslots-a", &DeleteParams::default())
        .await
        .unwrap();
    let cur = eventually(
        60,
        "the garbage collector to drop the dangling Node owner",
        || async {
            let s = leases.get(&name).await.ok()?;
            (!s.owner_references().iter().any(|o| o.kind == "Node")).then_some(s)
        },
    )
    .await;
    assert_eq!(cur.spec.holder_identity.as_deref(), Some("kslots-a"));
    let mut freed = cur.clone();
    freed.spec.holder_identity = None;
    as_b.replace(&name, &pp, &freed)
        .await
        .expect("a deleted node's slot is freed");
    let _ = Api::<Shim>::all(admin)
        .delete("kslots", &DeleteParams::default())
        .await;
}
