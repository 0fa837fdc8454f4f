//! A node whose claim of a free slot a rival won (a 409) takes the next free slot its list
//! showed, at once, on the real API server. Before, it went on to watch the slots from its
//! list's version, which brings only what changed after the list: a free slot nobody touched
//! since never came, and the node waited for its relist (minutes) beside a free slot. A CI
//! run saw it: one of the four nodes of `hooks::unknown_versions_…` lost its first claim and
//! never took the fourth slot in the test's 60 s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::{SLOT_CLOSED, ShimLease};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::agent::gate::{GateTimings, SlotGate};
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;
use shim_agent::cluster::slots::slots_have_few_rivals;
use shim_agent::txn::Gate;

use crate::support::agent_rig::Rig;
use crate::support::kube::{SERIAL, eventually, observed_client_for};
use crate::support::live::shim_builder;

const RIVAL: &str = "slot-claims-rival";

/// The test's Shim with two slots for two nodes (the rig's and [`RIVAL`]): few rivals, so a
/// node takes a free slot reserved for nobody. The slots made by a coordinator, which then
/// stops: nothing else writes them (each write would be a watch event that brings a slot to
/// the waiting node anyway). The Shim as the API server holds it.
async fn two_slots(rig: &Rig, shim: &str) -> Vec<Shim> {
    rig.env.create_node(RIVAL, &[("test", shim)]).await;
    rig.fresh(shim).await;
    let yaml = shim_builder(&rig.w, shim, "1")
        .node_selector("test", shim)
        .rolling(IntOrString::Int(2), 1)
        .yaml();
    let (ok, out) = rig.env.apply(&yaml);
    assert!(ok, "{out}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stopped).await;
    eventually(30, "two open slots, stamped with few rivals", || async {
        let l = slots(rig).list(&of(shim)).await.ok()?.items;
        let open = l.iter().all(|s| !s.annotations().contains_key(SLOT_CLOSED));
        (l.len() == 2 && open && slots_have_few_rivals(&l)).then_some(())
    })
    .await;
    let _ = stop.send(true);
    let _ = coordinator.await;
    vec![Api::<Shim>::all(rig.admin.clone()).get(shim).await.unwrap()]
}

fn slots(rig: &Rig) -> Api<ShimLease> {
    Api::namespaced(rig.admin.clone(), NAMESPACE)
}

fn of(shim: &str) -> ListParams {
    ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={shim}"))
}

/// The holder of each slot of `shim`, by slot name.
async fn holders(rig: &Rig, shim: &str) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = slots(rig)
        .list(&of(shim))
        .await
        .unwrap()
        .items
        .iter()
        .map(|l| {
            (
                l.name_any(),
                l.spec.holder_identity.clone().unwrap_or_default(),
            )
        })
        .collect();
    h.sort();
    h
}

/// A gate of the rig's node whose first slot claim loses: right before it goes out, `patch`
/// (a merge patch) is applied to that slot, so the claim's resourceVersion is old (a 409).
/// With the names of the slots it claimed, in order.
async fn racing_gate<'s>(
    rig: &Rig,
    shims: &'s [Shim],
    patch: String,
) -> (SlotGate<'s>, Arc<Mutex<Vec<String>>>) {
    let env = rig.env;
    let claims = Arc::new(Mutex::new(Vec::<String>::new()));
    let seen = claims.clone();
    let raced = Arc::new(AtomicBool::new(false));
    let client = observed_client_for(
        &rig.kubeconfig,
        move |req: http::Request<kube::client::Body>| {
            let path = req.uri().path().to_string();
            if req.method() == http::Method::PUT && path.contains("/shimleases/") {
                let slot = path.rsplit('/').next().unwrap_or_default().to_string();
                seen.lock().unwrap().push(slot.clone());
                if !raced.swap(true, Ordering::SeqCst) {
                    let args = ["-n", NAMESPACE, "patch", "shimlease", &slot, "--type=merge"];
                    let (ok, out) = env.kubectl(&[&args[..], &["-p", &patch]].concat());
                    assert!(ok, "{out}");
                }
            }
            req
        },
    )
    .await;
    let my_uid = rig.node_uid(&rig.name).await;
    let gate = SlotGate::new(client, &rig.name, &my_uid, shims, GateTimings::default());
    (gate, claims)
}

/// The gate's slot of `shim` within 10 s: far below the relist (150 s at the least) that a
/// node waits for when its watch brings nothing.
async fn acquire_soon(gate: &SlotGate<'_>, shim: &str, claims: &Mutex<Vec<String>>) {
    let took =
        tokio::time::timeout(Duration::from_secs(10), gate.acquire(&[shim.to_string()])).await;
    let claims = claims.lock().unwrap().clone();
    assert!(took.is_ok(), "no slot in 10 s; claims: {claims:?}");
    took.unwrap().unwrap();
}

async fn clean_up(rig: &Rig, shim: &str) {
    rig.fresh(shim).await;
    let _ = Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
        .delete(RIVAL, &Default::default())
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_claim_a_rival_won_takes_the_next_free_slot_it_listed() {
    let _serial = SERIAL.lock().await;
    let shim = "slot-claims";
    let Some(rig) = Rig::new(shim).await else {
        return;
    };
    let shims = two_slots(&rig, shim).await;
    // the rival takes the slot the node claims first
    let patch = format!(r#"{{"spec":{{"holderIdentity":"{RIVAL}"}}}}"#);
    let (gate, claims) = racing_gate(&rig, &shims, patch).await;
    acquire_soon(&gate, shim, &claims).await;
    let claims = claims.lock().unwrap().clone();
    assert_eq!(claims.len(), 2, "{claims:?}");
    let mut want = vec![
        (claims[0].clone(), RIVAL.to_string()),
        (claims[1].clone(), rig.name.clone()),
    ];
    want.sort();
    assert_eq!(
        holders(&rig, shim).await,
        want,
        "the rival won the first, the node took the other"
    );
    gate.release().await;
    clean_up(&rig, shim).await;
}

/// An agent that starts again finds its own slot (kept, marked failed) and adopts it; a write
/// of the coordinator (it reopens the slot for the Shim's new generation) that lands between
/// the node's list and its claim makes the claim a 409. The node adopts the slot from its
/// watch, which brings that write. Before, it waited there for a free slot, its own being
/// held (by itself): until its relist, minutes (a CI run of `agent_edges::a_failed_restart_…`,
/// whose install after a rollback never came within 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_adopt_a_write_beat_adopts_its_slot_from_its_watch() {
    let _serial = SERIAL.lock().await;
    let shim = "slot-adopts";
    let Some(rig) = Rig::new(shim).await else {
        return;
    };
    let shims = two_slots(&rig, shim).await;
    // the node held a slot, and its transaction failed: it keeps it, marked
    let before = rig.gate_as(&rig.name, &shims).await;
    before.acquire(&[shim.to_string()]).await.unwrap();
    before.failed("the restart failed").await;
    let held: Vec<String> = holders(&rig, shim)
        .await
        .into_iter()
        .filter(|(_, h)| *h == rig.name)
        .map(|(s, _)| s)
        .collect();
    assert_eq!(held.len(), 1, "{held:?}");
    // the agent again: its claim of that slot is beaten by a write
    let patch = r#"{"metadata":{"annotations":{"slot-claims.test/moved":"yes"}}}"#.to_string();
    let (gate, claims) = racing_gate(&rig, &shims, patch).await;
    acquire_soon(&gate, shim, &claims).await;
    assert_eq!(*claims.lock().unwrap(), [held[0].clone(), held[0].clone()]);
    let mine = holders(&rig, shim).await;
    assert_eq!(
        mine.iter().filter(|(_, h)| *h == rig.name).count(),
        1,
        "{mine:?}"
    );
    gate.release().await;
    clean_up(&rig, shim).await;
}
