//! An agent's Events on the real API server go out in the background, a few at a time: a
//! round waits for none of them, and a batch's Events never reach the API server all at
//! once. Sent all at once at the end of the round, a 50-Shim batch's 100 Events met the next
//! node's slot claims and label patch at the API server and held them back, and the node's
//! next round waited for them (BENCHMARKS.md, the daemon benchmark).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use shim_agent::events::EVENTS_AT_ONCE;

use crate::support::agent_rig::{Rig, with_coordinator_and_agent};
use crate::support::kube::{SERIAL, eventually, hold_as_watch};
use crate::support::live::{fake, shim_yaml};

/// How long the API server holds each Event write here.
const HELD_SECS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_waits_for_no_event_and_sends_a_few_at_a_time() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kevents").await else {
        return;
    };
    // a batch of three: six Event writes (one on each Shim, one on the Node for each)
    let batch = ["kevents-a", "kevents-b", "kevents-c"];
    let late = "kevents-late";
    for s in batch.iter().chain([&late]) {
        rig.fresh(s).await;
    }
    // every Event write becomes a watch of the test's Node that the API server holds
    let held = Arc::new(AtomicUsize::new(0));
    let (counted, node) = (held.clone(), rig.name.clone());
    let client = rig
        .observed_client(move |mut req: http::Request<kube::client::Body>| {
            let event = req.method() == http::Method::POST && req.uri().path().ends_with("/events");
            if event {
                counted.fetch_add(1, Ordering::SeqCst);
                hold_as_watch(&mut req, &node, HELD_SECS);
            }
            req
        })
        .await;
    let f = fake(&rig.w);
    with_coordinator_and_agent(
        &rig,
        &f,
        client,
        |_| {},
        || async {
            rig.apply_and_await_labels(&batch, "kevents").await;
            eventually(10, "the batch's first Event writes under way", || async {
                (held.load(Ordering::SeqCst) >= EVENTS_AT_ONCE).then_some(())
            })
            .await;
            // the next round goes ahead while those writes are held (a round that waited for its
            // Events gave up on them only after 5 s)
            let (ok, out) = rig
                .env
                .apply(&shim_yaml(&rig.w, late, "1", ("test", "kevents")));
            assert!(ok, "{out}");
            eventually(
                3,
                "the next Shim labelled while the Events are held",
                || async { (rig.label(late).await.as_deref() == Some("true")).then_some(()) },
            )
            .await;
            assert_eq!(
                held.load(Ordering::SeqCst),
                EVENTS_AT_ONCE,
                "more Event writes under way at once than an agent allows"
            );
        },
    )
    .await;
    for s in batch.iter().chain([&late]) {
        rig.fresh(s).await;
    }
}
