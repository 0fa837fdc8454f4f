//! A Shim that arrives while the node waits for a rollout slot joins the transaction it waits
//! with, on the real API server. `kubectl apply` of several Shims creates them one request
//! after another; when the first came alone and its slot was not free yet, the node waited
//! with a plan of one Shim, installed it, restarted containerd, and only then planned the
//! others: two restarts for one apply (a CI run of `agent_edges` saw it). The wait for the
//! first slot now ends when the Shims change, and the node plans again.

use kube::{Api, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::{SLOT_CLOSED, ShimLease};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;
use shim_agent::txn::Gate;

use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

const FIRST: &str = "late-batch-a";
const LATE: &str = "late-batch-b";

/// `shim`'s slot 0, once it exists.
async fn slot(admin: &kube::Client, shim: &str) -> Option<ShimLease> {
    let api: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
    let lp = kube::api::ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={shim}"));
    api.list(&lp).await.ok()?.items.into_iter().next()
}

/// The holder of `shim`'s slot 0, once the slot exists.
async fn holder(admin: &kube::Client, shim: &str) -> Option<Option<String>> {
    let l = slot(admin, shim).await?;
    Some(l.spec.holder_identity.filter(|h| !h.is_empty()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_applied_while_the_node_waits_for_a_slot_joins_its_transaction() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("late-batch").await else {
        return;
    };
    let rival = "late-batch-rival";
    rig.env.create_node(rival, &[("test", "late-batch")]).await;
    for s in [FIRST, LATE] {
        rig.force_delete(s).await;
    }
    // the first Shim's slot, made by a coordinator, held by a rival node
    let (ok, out) = rig
        .env
        .apply(&shim_yaml(&rig.w, FIRST, "1", ("test", "late-batch")));
    assert!(ok, "{out}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop).await;
    // open: a coordinator makes it closed until it knows no extension holds the rollout
    eventually(30, "the first Shim's slot, open", || async {
        slot(&rig.admin, FIRST)
            .await
            .filter(|l| !l.annotations().contains_key(SLOT_CLOSED))
    })
    .await;
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    let shims: Vec<Shim> = vec![
        Api::<Shim>::all(rig.admin.clone())
            .get(FIRST)
            .await
            .unwrap(),
    ];
    let rival_gate = rig.gate_as(rival, &shims).await;
    let first = [FIRST.to_string()];
    let took = rival_gate.acquire(&first);
    tokio::time::timeout(std::time::Duration::from_secs(30), took)
        .await
        .expect("the rival takes the open slot within 30 s")
        .unwrap();

    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        // the node plans the first Shim alone and waits for its slot
        eventually(30, "the node announcing the first Shim", || async {
            rig.state_annotation().await.filter(|s| s.contains(FIRST))
        })
        .await;
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, LATE, "1", ("test", "late-batch")));
        assert!(ok, "{out}");
        // the late Shim is in the node's plan before the slot comes free
        eventually(30, "the node announcing the late Shim", || async {
            rig.state_annotation().await.filter(|s| s.contains(LATE))
        })
        .await;
        assert_eq!(
            holder(&rig.admin, FIRST).await,
            Some(Some(rival.to_string())),
            "the rival still holds the first slot"
        );
        assert_eq!(*f.restarts.borrow(), 0, "nothing installed while waiting");
        rival_gate.release().await;
        for n in [FIRST, LATE] {
            eventually(30, &format!("the label of {n}"), || async {
                (rig.label(n).await.as_deref() == Some("true")).then_some(())
            })
            .await;
        }
    })
    .await;
    assert_eq!(
        *f.restarts.borrow(),
        1,
        "the late Shim joined the waiting transaction: one containerd restart for both"
    );
    for s in [FIRST, LATE] {
        rig.force_delete(s).await;
    }
}
