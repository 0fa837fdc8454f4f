//! A batch's slots on the real API server: a node claims the first Shim's slot of its batch
//! alone, before the others. While a rival holds that slot, the node writes no slot at all;
//! once the rival lets it go, the node takes the whole batch. Before, it took every other free
//! slot of the batch and gave each back (it may keep only a prefix in name order), so two
//! nodes starting one batch together split it and wrote it twice (BENCHMARKS.md, the daemon
//! benchmark). A list that is behind a release gets a second look before anything goes back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::ListParams;
use kube::{Api, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::agent::gate::{GateTimings, SlotGate};
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;
use shim_agent::txn::Gate;

use crate::support::agent_rig::Rig;
use crate::support::kube::{SERIAL, eventually, observed_client_for};
use crate::support::live::shim_yaml;

const SHIMS: [&str; 6] = [
    "slot-head-0",
    "slot-head-1",
    "slot-head-2",
    "slot-head-3",
    "slot-head-4",
    "slot-head-5",
];

/// Each Shim's slot, in `SHIMS` order (`None`: not made yet).
async fn slots(admin: &kube::Client) -> Vec<Option<ShimLease>> {
    let api: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
    let lp = ListParams::default().labels(&format!("{SLOT_SHIM_LABEL} in ({})", SHIMS.join(",")));
    let slots = api.list(&lp).await.map(|l| l.items).unwrap_or_default();
    SHIMS
        .iter()
        .map(|s| {
            slots
                .iter()
                .find(|l| l.labels().get(SLOT_SHIM_LABEL).map(String::as_str) == Some(s))
                .cloned()
        })
        .collect()
}

/// The holder of each Shim's slot, in `SHIMS` order.
async fn holders(admin: &kube::Client) -> Vec<Option<String>> {
    let slots = slots(admin).await;
    slots
        .into_iter()
        .map(|l| l.and_then(|l| l.spec.holder_identity))
        .collect()
}

/// The six Shims applied for the nodes labelled `test=<label>` (the rig's and `rival`, made
/// here), fresh (nothing left of an earlier run: Shim, RuntimeClass, slots), and a coordinator
/// that made a slot of each.
struct Batch {
    /// The Shims as the API server holds them, and their names, in `SHIMS` order.
    shims: Vec<Shim>,
    names: Vec<String>,
    stop: tokio::sync::watch::Sender<bool>,
    coordinator: tokio::task::JoinHandle<()>,
}

impl Batch {
    async fn apply(rig: &Rig, label: &str, rival: &str) -> Batch {
        rig.env.create_node(rival, &[("test", label)]).await;
        for s in SHIMS {
            rig.fresh(s).await;
        }
        let docs: Vec<String> = SHIMS
            .iter()
            .map(|s| shim_yaml(&rig.w, s, "1", ("test", label)))
            .collect();
        let (ok, out) = rig.env.apply(&docs.join("---\n"));
        assert!(ok, "{out}");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let coordinator = rig.spawn_coordinator(stopped).await;
        eventually(30, "a slot of every Shim", || async {
            slots(&rig.admin)
                .await
                .iter()
                .all(Option::is_some)
                .then_some(())
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await; // the coordinator's stamps settle
        let all = Api::<Shim>::all(rig.admin.clone())
            .list(&Default::default())
            .await
            .unwrap()
            .items;
        let shims = SHIMS
            .iter()
            .filter_map(|n| all.iter().find(|s| s.name_any() == *n).cloned())
            .collect();
        Batch {
            shims,
            names: SHIMS.iter().map(|s| s.to_string()).collect(),
            stop,
            coordinator,
        }
    }

    /// Stop the coordinator and remove the Shims and their slots.
    async fn end(self, rig: &Rig) {
        let _ = self.stop.send(true);
        let _ = self.coordinator.await;
        for s in SHIMS {
            rig.fresh(s).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_cannot_have_the_first_slot_of_its_batch_writes_no_other() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("slot-head").await else {
        return;
    };
    let rival = "slot-head-rival";
    let batch = Batch::apply(&rig, "slot-head", rival).await;
    let (shims, names) = (&batch.shims, &batch.names);

    // the rival holds the first Shim's slot
    let rival_gate = rig.gate_as(rival, shims).await;
    rival_gate.acquire(&names[..1]).await.unwrap();

    // every slot write this node sends
    let writes = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = writes.clone();
    let client = observed_client_for(
        &rig.kubeconfig,
        move |req: http::Request<kube::client::Body>| {
            let write = req.method() != http::Method::GET;
            if write && req.uri().path().contains("/shimleases") {
                let w = format!("{} {}", req.method(), req.uri().path());
                seen.lock().unwrap().push(w);
            }
            req
        },
    )
    .await;
    let my_uid = rig.node_uid(&rig.name).await;
    let gate = SlotGate::new(client, &rig.name, &my_uid, shims, GateTimings::default());
    let watch = async {
        // long enough for a whole try of the batch and its give-backs
        tokio::time::sleep(Duration::from_secs(3)).await;
        let while_held = writes.lock().unwrap().clone();
        let held = holders(&rig.admin).await;
        rival_gate.release().await;
        (while_held, held)
    };
    let (acquired, (while_held, held)) = tokio::join!(gate.acquire(names), watch);
    assert!(
        while_held.is_empty(),
        "slot writes while a rival held the batch's first slot: {while_held:?}"
    );
    assert_eq!(
        held,
        [vec![Some(rival.to_string())], vec![None; SHIMS.len() - 1]].concat(),
        "the other slots were left free"
    );
    acquired.unwrap();
    assert_eq!(
        holders(&rig.admin).await,
        vec![Some(rig.name.clone()); SHIMS.len()],
        "the node took the whole batch once the first slot was free"
    );
    gate.release().await;
    batch.end(&rig).await;
}

/// The API server's watch cache can be a moment behind: a node whose batch list still shows
/// a slot held that its holder has just released takes it on a second look, and gives back
/// none of the slots after it. Before, it gave back every slot after that one, waited for it,
/// and took them all again: two writes more for each (BENCHMARKS.md, the daemon benchmark:
/// about 40 of a 50-Shim batch's slots on the second node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_listed_behind_a_release_takes_that_slot_on_a_second_look_and_gives_none_back() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("slot-look").await else {
        return;
    };
    let rival = "slot-look-rival";
    let batch = Batch::apply(&rig, "slot-look", rival).await;
    let (shims, names) = (&batch.shims, &batch.names);

    // the rival holds the third Shim's slot, then gives it back; `behind` is a version of
    // the slots from before that release
    let rival_gate = rig.gate_as(rival, shims).await;
    rival_gate.acquire(&names[2..3]).await.unwrap();
    let leases: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let behind = leases
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    rival_gate.release().await;

    // the node's first list of its batch is read at `behind`, as a cache a moment behind
    // would answer it; every slot write it sends is recorded
    let writes = Arc::new(Mutex::new(Vec::<String>::new()));
    let (seen, lists) = (writes.clone(), Arc::new(Mutex::new(0u32)));
    let client = observed_client_for(
        &rig.kubeconfig,
        move |mut req: http::Request<kube::client::Body>| {
            let path = req.uri().path().to_string();
            if !path.contains("/shimleases") {
                return req;
            }
            if req.method() != http::Method::GET {
                seen.lock()
                    .unwrap()
                    .push(format!("{} {path}", req.method()));
                return req;
            }
            let query = req.uri().query().unwrap_or_default().to_string();
            let batch_list = query.contains("%28") && !query.contains("watch=true");
            let mut n = lists.lock().unwrap();
            if batch_list && *n == 0 {
                *n += 1;
                let q = query
                    .replace("resourceVersion=0", &format!("resourceVersion={behind}"))
                    .replace(
                        "resourceVersionMatch=NotOlderThan",
                        "resourceVersionMatch=Exact",
                    );
                *req.uri_mut() = format!("{path}?{q}").parse().unwrap();
            }
            req
        },
    )
    .await;
    let my_uid = rig.node_uid(&rig.name).await;
    let gate = SlotGate::new(client, &rig.name, &my_uid, shims, GateTimings::default());
    tokio::time::timeout(Duration::from_secs(30), gate.acquire(names))
        .await
        .expect("the batch within 30 s")
        .unwrap();
    assert_eq!(
        holders(&rig.admin).await,
        vec![Some(rig.name.clone()); SHIMS.len()],
        "the node holds the whole batch"
    );
    let writes = writes.lock().unwrap().clone();
    // a give-back is a patch of the node's own slot; claims are replaces
    assert!(
        writes.iter().all(|w| w.starts_with("PUT ")),
        "claims only, nothing given back: {writes:?}"
    );
    gate.release().await;
    batch.end(&rig).await;
}
