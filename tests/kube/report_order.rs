//! What a round reports, in what order: the Node's labels and state first, then the round's
//! Events. Events are best effort; a label is what the scheduler and the user wait for. Each
//! Event is a round trip (two per Shim: on the Shim and on the Node), and a batch of 50
//! Shims once waited about 0.8 s for its Events before its labels (BENCHMARKS.md, the daemon
//! benchmark). And an Event write the server holds is given up after 5 s, so the round ends
//! and the next one runs. The rollout slots of a committed change go back beside the label
//! patch, not before it: one round trip less on the way to the label.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::support::agent_rig::{Rig, with_coordinator_and_agent};
use crate::support::kube::{SERIAL, eventually, hold_as_watch};
use crate::support::live::{fake, shim_yaml};

/// How long the API server holds each of the agent's Event writes here.
const HELD_SECS: u64 = 15;

/// A client of the rig's node whose requests `matching` says become watches of its own Node
/// that the API server holds for [`HELD_SECS`] (a slow endpoint, on the real server), and a
/// count of them.
async fn holding(
    rig: &Rig,
    matching: fn(&http::Request<kube::client::Body>) -> bool,
) -> (kube::Client, Arc<AtomicUsize>) {
    let held = Arc::new(AtomicUsize::new(0));
    let (counted, node) = (held.clone(), rig.name.clone());
    let client = rig
        .observed_client(move |mut req: http::Request<kube::client::Body>| {
            if matching(&req) {
                counted.fetch_add(1, Ordering::SeqCst);
                hold_as_watch(&mut req, &node, HELD_SECS);
            }
            req
        })
        .await;
    (client, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_waits_for_no_event_of_its_round_nor_of_the_round_before() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("report-order").await else {
        return;
    };
    let (shim, second) = ("report-order-a", "report-order-b");
    rig.force_delete(shim).await;
    rig.force_delete(second).await;
    // every Event the agent writes becomes a watch of its own Node that the API server holds
    // for HELD_SECS: a slow Events endpoint, on the real server
    let (client, held) = holding(&rig, |req| {
        req.method() == http::Method::POST && req.uri().path().ends_with("/events")
    })
    .await;
    let f = fake(&rig.w);
    with_coordinator_and_agent(
        &rig,
        &f,
        client,
        |_| {},
        || async {
            let (ok, out) = rig
                .env
                .apply(&shim_yaml(&rig.w, shim, "1", ("test", "report-order")));
            assert!(ok, "{out}");
            // the label comes before the round's two Installed Events (held HELD_SECS each) end:
            // reported after them, it would come 2 × HELD_SECS after the install
            eventually(
                HELD_SECS - 3,
                "the label, while the Events are held",
                || async { (rig.label(shim).await.as_deref() == Some("true")).then_some(()) },
            )
            .await;
            eventually(HELD_SECS - 3, "the round's Events sent", || async {
                (held.load(Ordering::SeqCst) >= 2).then_some(())
            })
            .await;
            // and the next round does not wait for them either: an Event write is given up
            // after EVENT_WITHIN (5 s), where it once held the agent until the server let go
            let (ok, out) =
                rig.env
                    .apply(&shim_yaml(&rig.w, second, "1", ("test", "report-order")));
            assert!(ok, "{out}");
            eventually(HELD_SECS - 3, "the next Shim's label", || async {
                (rig.label(second).await.as_deref() == Some("true")).then_some(())
            })
            .await;
        },
    )
    .await;
    rig.force_delete(shim).await;
    rig.force_delete(second).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_does_not_wait_for_the_release_of_its_slot() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("release-order").await else {
        return;
    };
    let shim = "release-order-a";
    rig.fresh(shim).await;
    // every patch of a slot becomes a watch the API server holds for HELD_SECS; with a claim
    // counted as the renewal for a minute, the only such patch is the release
    let (client, held) = holding(&rig, |req| {
        req.method() == http::Method::PATCH && req.uri().path().contains("/shimleases/")
    })
    .await;
    let f = fake(&rig.w);
    with_coordinator_and_agent(
        &rig,
        &f,
        client,
        |agent| agent.gate_timings.fresh = std::time::Duration::from_secs(60),
        || async {
            let (ok, out) = rig
                .env
                .apply(&shim_yaml(&rig.w, shim, "1", ("test", "release-order")));
            assert!(ok, "{out}");
            // given back before the label patch, the label would come after the held release
            eventually(
                HELD_SECS - 3,
                "the label, while the release of its slot is held",
                || async { (rig.label(shim).await.as_deref() == Some("true")).then_some(()) },
            )
            .await;
            eventually(HELD_SECS - 3, "the release sent", || async {
                (held.load(Ordering::SeqCst) >= 1).then_some(())
            })
            .await;
            assert_eq!(*f.restarts.borrow(), 1, "one containerd restart");
        },
    )
    .await;
    rig.fresh(shim).await;
}
