//! A reservation reaches its node through the node's own Node (docs/design.md §5), on the real
//! API server. A node that waited on a watch of "the slots reserved for me" (a label selector)
//! was handed, by the API server's watch cache, every event of every slot to filter: 5000
//! such watches fell behind and were closed. The coordinator now writes, on the waiting
//! node's Node, which slot it keeps for it; the node watches that slot alone, by name, and
//! takes it at its release. A node whose announcement was lost announces again: without it,
//! the coordinator never saw it wait and it waited for good.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::{Api, ResourceExt};
use shim_agent::api::lease::{SLOT_CLOSED, SLOT_RESERVATIONS_ANNOTATION, ShimLease};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::lease_edits;
use shim_agent::cluster::reservation_hints::{Hints, parse};
use shim_agent::cluster::slots::slot_name;
use shim_agent::cluster::slots::slots_have_few_rivals;

use crate::support::agent_rig::{Rig, cluster_node, run_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

const SHIM: &str = "slot-hints";

/// The hint on Node `node`, if any.
async fn hint(rig: &Rig, node: &str) -> Option<Hints> {
    let n = Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
        .get(node)
        .await
        .ok()?;
    n.annotations()
        .get(SLOT_RESERVATIONS_ANNOTATION)
        .map(|h| parse(h))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_node_is_pointed_at_its_reserved_slot_and_watches_that_slot_alone() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new(SHIM).await else {
        return;
    };
    let (holder, idle) = ("slot-hints-a", "slot-hints-b");
    for r in [holder, idle] {
        rig.env.create_node(r, &[("test", SHIM)]).await;
    }
    rig.force_delete(SHIM).await;
    // N = 1 for three nodes: many rivals, so the coordinator reserves the slot
    let (ok, out) = rig.env.apply(&shim_yaml(&rig.w, SHIM, "1", ("test", SHIM)));
    assert!(ok, "{out}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop.clone()).await;
    let slots: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let name = slot_name(SHIM, 0);
    let open = eventually(30, "slot 0, open, stamped with many rivals", || async {
        slots
            .get_opt(&name)
            .await
            .ok()
            .flatten()
            .filter(|l| !l.annotations().contains_key(SLOT_CLOSED))
            .filter(|l| !slots_have_few_rivals([l]))
    })
    .await;
    // another node holds it
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let held = lease_edits::take(open, holder, &rig.node_uid(holder).await, now);
    slots
        .replace(&name, &Default::default(), &held)
        .await
        .unwrap();

    // the node's agent, each slot request it makes recorded, and its first word to its Node
    // (the announcement of the install) lost, as a loaded API server's timeout loses it: the
    // coordinator reserves only for a node whose Node says it waits
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = seen.clone();
    let lost = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let node_path = format!("/api/v1/nodes/{}", rig.name);
    let client = rig
        .observed_client(move |mut req: http::Request<kube::client::Body>| {
            let uri = req.uri().clone();
            if uri.path().ends_with("/shimleases") {
                let line = format!("{}?{}", uri.path(), uri.query().unwrap_or(""));
                record.lock().unwrap().push(line);
            }
            if req.method() == http::Method::PATCH
                && uri.path() == node_path
                && !lost.swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let elsewhere = format!("{node_path}-lost?{}", uri.query().unwrap_or(""));
                *req.uri_mut() = elsewhere.parse().unwrap();
            }
            req
        })
        .await;
    let f = fake(&rig.w);
    let n = cluster_node(&rig.w, &f);
    let agent = run_agent(&n, client, &rig.name, stop.clone());
    let body = async {
        let want = Hints::from([(SHIM.to_string(), 0)]);
        eventually(30, "the node's Node names slot 0", || async {
            (hint(&rig, &rig.name).await.as_ref() == Some(&want)).then_some(())
        })
        .await;
        assert_eq!(
            hint(&rig, idle).await,
            None,
            "a node that waits for nothing"
        );
        assert_eq!(*f.restarts.borrow(), 0, "nothing installed while waiting");
        // the release reaches the node through its watch of that slot
        tokio::time::sleep(Duration::from_millis(500)).await;
        let l = slots.get(&name).await.unwrap();
        slots
            .replace(&name, &Default::default(), &lease_edits::release(l, holder))
            .await
            .unwrap();
        eventually(30, "the Shim installed", || async {
            (rig.label(SHIM).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        // nobody waits any more: the hint goes
        eventually(30, "the hint dropped", || async {
            hint(&rig, &rig.name).await.is_none().then_some(())
        })
        .await;
        let _ = stop_tx.send(true);
    };
    tokio::join!(agent, body);
    let _ = coordinator.await;
    let seen = seen.lock().unwrap().clone();
    let watches: Vec<&String> = seen.iter().filter(|r| r.contains("watch=true")).collect();
    assert!(!watches.is_empty(), "no slot watch: {seen:#?}");
    let by_name = format!("fieldSelector=metadata.name%3D{name}");
    assert!(
        watches
            .iter()
            .all(|w| w.contains(&by_name) && !w.contains("labelSelector")),
        "the node watched other slots than its own, or by label: {watches:#?}"
    );
    // named after the node listed: watched from its state now, not from the list's version
    // (which replays every hand-off the slot saw meanwhile)
    let from_now = |w: &&String| w.split(['?', '&']).any(|p| p == "resourceVersion=0");
    assert!(watches.iter().all(from_now), "{watches:#?}");
    rig.force_delete(SHIM).await;
    for r in [holder, idle] {
        let _ = Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
            .delete(r, &Default::default())
            .await;
    }
}
