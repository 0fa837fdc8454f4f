//! A slot an earlier Shim of the same name left behind, on the real API server. A slot held
//! when its Shim went keeps its holder's Node as an owner, so Kubernetes' garbage collector
//! only strips the Shim's reference and the Lease stays. A Shim created again under that name
//! then found its slot name taken, and the Lease without a Shim owner passed for its slot 0,
//! held by a node that was done with it: every other node waited for it forever (an e2e run
//! waited on a three-Shim uninstall). The coordinator now deletes such a Lease and makes the
//! slot anew.

use std::time::Duration;

use kube::{Api, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::{SLOT_CLOSED, ShimLease};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::slots::slot_name;
use shim_agent::txn::Gate;

use crate::support::agent_rig::Rig;
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::shim_yaml;

const SHIM: &str = "slot-orphan";

/// Slot 0 of the Shim, once it exists open (and is not the Lease `not`).
async fn open_slot(rig: &Rig, not: Option<&ShimLease>) -> ShimLease {
    let api: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let not = not.and_then(|l| l.uid());
    eventually(30, "slot 0, open", || async {
        api.get_opt(&slot_name(SHIM, 0))
            .await
            .ok()
            .flatten()
            .filter(|l| !l.annotations().contains_key(SLOT_CLOSED))
            .filter(|l| not.is_none() || l.uid() != not)
    })
    .await
}

async fn the_shim(rig: &Rig) -> Vec<Shim> {
    vec![Api::<Shim>::all(rig.admin.clone()).get(SHIM).await.unwrap()]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_created_again_gets_new_slots_though_a_node_held_the_old_ones() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("slot-orphan").await else {
        return;
    };
    let rival = "slot-orphan-rival";
    rig.env.create_node(rival, &[("test", "slot-orphan")]).await;
    rig.force_delete(SHIM).await;
    let yaml = shim_yaml(&rig.w, SHIM, "1", ("test", "slot-orphan"));
    let (ok, out) = rig.env.apply(&yaml);
    assert!(ok, "{out}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop).await;
    let old = open_slot(&rig, None).await;

    // the rival holds the slot when the Shim goes (its finalizer taken off by hand)
    let shims = the_shim(&rig).await;
    let rival_gate = rig.gate_as(rival, &shims).await;
    let first = [SHIM.to_string()];
    tokio::time::timeout(Duration::from_secs(30), rival_gate.acquire(&first))
        .await
        .expect("the rival takes the open slot within 30 s")
        .unwrap();
    rig.force_delete(SHIM).await;
    let api: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    eventually(
        30,
        "the garbage collector's work: the Shim's reference gone",
        || async {
            let l = api.get_opt(&slot_name(SHIM, 0)).await.ok()??;
            let shim_owned = l.owner_references().iter().any(|o| o.kind == "Shim");
            (!shim_owned).then_some(())
        },
    )
    .await;

    // created again: a slot of its own, which this node takes
    let (ok, out) = rig.env.apply(&yaml);
    assert!(ok, "{out}");
    let shims = the_shim(&rig).await;
    // a new Lease under the slot's name
    let new = open_slot(&rig, Some(&old)).await;
    let owners: Vec<String> = new
        .owner_references()
        .iter()
        .map(|o| o.uid.clone())
        .collect();
    assert_eq!(
        owners,
        vec![shims[0].uid().unwrap()],
        "owned by the new Shim alone"
    );
    let gate = rig.gate_as(&rig.name, &shims).await;
    tokio::time::timeout(Duration::from_secs(30), gate.acquire(&first))
        .await
        .expect("the node takes the new Shim's slot within 30 s")
        .unwrap();
    gate.release().await;
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    rig.force_delete(SHIM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_whose_name_was_taken_is_made_once_the_name_is_free_with_nothing_else_changing() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("slot-taken").await else {
        return;
    };
    let (shim, other) = ("slot-taken", "slot-taken-other");
    for s in [shim, other] {
        rig.force_delete(s).await;
    }
    let api: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let _ = api.delete(&slot_name(shim, 0), &Default::default()).await;
    // slot 0's name taken by a Lease of another Shim (a Shim of this name deleted a moment
    // ago, whose Lease the garbage collector has not taken yet): the coordinator leaves it
    let (ok, out) = rig
        .env
        .apply(&shim_yaml(&rig.w, other, "1", ("test", "none")));
    assert!(ok, "{out}");
    let owner = Api::<Shim>::all(rig.admin.clone())
        .get(other)
        .await
        .unwrap();
    let mut blocker = ShimLease::new(&slot_name(shim, 0), Default::default());
    blocker.metadata.namespace = Some(NAMESPACE.into());
    blocker.metadata.labels = Some(
        [(
            shim_agent::cluster::slots::SLOT_SHIM_LABEL.to_string(),
            shim.to_string(),
        )]
        .into(),
    );
    blocker.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "containerd.x-k8s.io/v1alpha1".into(),
            kind: "Shim".into(),
            name: other.into(),
            uid: owner.uid().unwrap(),
            ..Default::default()
        },
    ]);
    api.create(&Default::default(), &blocker).await.unwrap();
    let (ok, out) = rig
        .env
        .apply(&shim_yaml(&rig.w, shim, "1", ("test", "slot-taken")));
    assert!(ok, "{out}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop).await;
    // the coordinator's first round wrote the slots (a create refused: the name is taken),
    // then the finalizer
    eventually(30, "the coordinator's first round", || async {
        let s = rig.shim(shim).await?;
        (!s.finalizers().is_empty()).then_some(())
    })
    .await;
    // the name comes free, and nothing else changes: the slot is made once the refused
    // create's hold ends (it was held for good)
    api.delete(&slot_name(shim, 0), &Default::default())
        .await
        .unwrap();
    let uid = rig.shim(shim).await.unwrap().uid();
    eventually(
        45,
        "slot 0 made for the Shim once its name is free",
        || async {
            let l = api.get_opt(&slot_name(shim, 0)).await.ok()??;
            l.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == uid.as_ref())
                .then_some(())
        },
    )
    .await;
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    for s in [shim, other] {
        rig.force_delete(s).await;
    }
}
