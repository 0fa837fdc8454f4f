//! A batch of new Shims costs the coordinator one round trip, not one per Shim: each Shim's
//! finalizer, RuntimeClass and status are written beside the other Shims', as their slots
//! are. Written one Shim after another, a 50-Shim batch waited about 25 ms per Shim for its
//! RuntimeClasses before the last Shim's slots could follow (BENCHMARKS.md, the daemon
//! benchmark).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use kube::Api;
use kube::api::ListParams;
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::coordinator::{self, CLASS_WRITES_AT_ONCE, SHIM_WRITES_AT_ONCE};
use shim_agent::cluster::slots::SLOT_SHIM_LABEL;

use crate::support::agent_rig::{Rig, fast};
use crate::support::kube::{SERIAL, eventually, hold_as_watch, observed_client_for};
use crate::support::live::{shim_builder, shim_yaml};

/// How long the API server holds each RuntimeClass write of the batch here.
const HELD_SECS: u64 = 15;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_writes_a_batch_of_runtime_classes_side_by_side() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("coord-batch").await else {
        return;
    };
    let shims = ["coord-batch-a", "coord-batch-b", "coord-batch-c"];
    for s in shims {
        rig.force_delete(s).await;
    }
    let docs: Vec<String> = shims
        .iter()
        .map(|s| shim_yaml(&rig.w, s, "1", ("test", "coord-batch")))
        .collect();
    let (ok, out) = rig.env.apply(&docs.join("---\n"));
    assert!(ok, "{out}");
    // each RuntimeClass write of the batch becomes a watch of the test's Node that the API
    // server holds for HELD_SECS: a slow RuntimeClass endpoint, on the real server
    let held = Arc::new(AtomicUsize::new(0));
    let (counted, node) = (held.clone(), rig.name.clone());
    let client = observed_client_for(
        &rig.env.coordinator_identity(),
        move |mut req: http::Request<kube::client::Body>| {
            let path = req.uri().path();
            if req.method() == http::Method::PATCH && path.contains("/runtimeclasses/coord-batch-")
            {
                counted.fetch_add(1, Ordering::SeqCst);
                hold_as_watch(&mut req, &node, HELD_SECS);
            }
            req
        },
    )
    .await;
    // started once all three exist, so its first round sees the whole batch
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = tokio::spawn(coordinator::run(client, rig.name.clone(), fast(), stop));
    // one after another, the second write would start only when the first one ends
    eventually(
        HELD_SECS - 3,
        "the batch's RuntimeClass writes all under way",
        || async { (held.load(Ordering::SeqCst) >= shims.len()).then_some(()) },
    )
    .await;
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    for s in shims {
        rig.force_delete(s).await;
    }
}

/// A Shim created while another Shim's writes wait on a slow reply gets its slot at once: the
/// finalizer, RuntimeClass and status writes run off the coordinator's loop, so its next round
/// does not wait for them. Before, a round began only when every write of the one before had
/// come back: a batch's late Shims waited about 0.45 s for their slots behind the first
/// Shims' RuntimeClass applies (BENCHMARKS.md, the daemon benchmark).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_write_of_one_shim_does_not_hold_back_the_next_shims_slot() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("coord-late").await else {
        return;
    };
    let (first, late) = ("coord-late-a", "coord-late-b");
    for s in [first, late] {
        rig.fresh(s).await;
    }
    let (ok, out) = rig
        .env
        .apply(&shim_yaml(&rig.w, first, "1", ("test", "coord-late")));
    assert!(ok, "{out}");
    // the first Shim's first write (its finalizer) becomes a watch of the test's Node that
    // the API server holds for HELD_SECS: a slow reply, on the real server
    let held = Arc::new(AtomicUsize::new(0));
    let (counted, node) = (held.clone(), rig.name.clone());
    let client = observed_client_for(
        &rig.env.coordinator_identity(),
        move |mut req: http::Request<kube::client::Body>| {
            let first_write = req.method() == http::Method::PATCH
                && req.uri().path().ends_with(&format!("/shims/{first}"));
            if first_write && counted.fetch_add(1, Ordering::SeqCst) == 0 {
                hold_as_watch(&mut req, &node, HELD_SECS);
            }
            req
        },
    )
    .await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = tokio::spawn(coordinator::run(client, rig.name.clone(), fast(), stop));
    // (the two waits end within HELD_SECS of the hold's start, so the slot is written while
    // the write is held)
    eventually(HELD_SECS - 7, "the first Shim's write held", || async {
        (held.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    let (ok, out) = rig
        .env
        .apply(&shim_yaml(&rig.w, late, "1", ("test", "coord-late")));
    assert!(ok, "{out}");
    let slots: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);
    let of = ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={late}"));
    eventually(
        HELD_SECS - 10,
        "the late Shim's slot, while the first one's write is held",
        || async { (!slots.list(&of).await.ok()?.items.is_empty()).then_some(()) },
    )
    .await;
    assert_eq!(
        held.load(Ordering::SeqCst),
        1,
        "the held write was not tried again yet"
    );
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    for s in [first, late] {
        rig.fresh(s).await;
    }
}

/// Two Shims that name one RuntimeClass, reconciled side by side in one round: neither
/// applies it (the admission policy would refuse each: a class belongs to the one Shim that
/// names it) and both say `RuntimeClassConflict`, naming the other, round after round. Once
/// one of them goes, the other gets its class. Without the rule both tried every round and
/// failed on the policy, and neither said why in its status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shims_naming_one_runtime_class_both_report_the_conflict_until_one_goes() {
    use k8s_openapi::api::node::v1::RuntimeClass;
    use kube::ResourceExt;
    use kube::api::DeleteParams;

    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("coord-rc").await else {
        return;
    };
    let (a, b, class) = ("coord-rc-a", "coord-rc-b", "coord-rc-shared");
    let classes: Api<RuntimeClass> = Api::all(rig.admin.clone());
    let _ = classes.delete(class, &DeleteParams::default()).await;
    for s in [a, b] {
        rig.force_delete(s).await;
    }
    let doc = |name: &str| {
        shim_builder(&rig.w, name, "1")
            .node_selector("test", "coord-rc")
            .runtime_class(class)
            .yaml()
    };
    let (ok, out) = rig.env.apply(&format!("{}---\n{}", doc(a), doc(b)));
    assert!(ok, "{out}");
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop).await;
    let both_say_so = || async {
        for (me, other) in [(a, b), (b, a)] {
            let shim = rig.shim(me).await?;
            let ready = shim
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "Ready")?;
            let message = ready.message.unwrap_or_default();
            let named = message.contains(&format!("named by Shim {other}"));
            if ready.reason.as_deref() != Some("RuntimeClassConflict") || !named {
                return None;
            }
        }
        classes.get_opt(class).await.ok()?.is_none().then_some(())
    };
    eventually(30, "both in conflict, and no class", both_say_so).await;
    // and it stays so, round after round
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(both_say_so().await.is_some(), "the conflict did not hold");
    // one goes: the other gets its class
    rig.force_delete(b).await;
    eventually(30, "a's class", || async {
        let rc = classes.get_opt(class).await.ok()??;
        let owners: Vec<String> = rc
            .owner_references()
            .iter()
            .map(|o| o.name.clone())
            .collect();
        (owners == [a] && rc.handler == a).then_some(())
    })
    .await;
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    rig.force_delete(a).await;
    let _ = classes.delete(class, &DeleteParams::default()).await;
}

/// A batch's RuntimeClass writes go [`CLASS_WRITES_AT_ONCE`] at a time, and its finalizer and
/// status writes [`SHIM_WRITES_AT_ONCE`] at a time, beside them: with every such write held,
/// that many of each are under way and no more. Sent all at once, a 50-Shim batch's 150
/// writes went side by side with its 50 slot creates, and the API server answered some of
/// the slots 0.4 s late; with one limit of eight Shims for all three kinds, the
/// RuntimeClasses, which pods wait for, waited behind the other Shims' finalizers and
/// statuses (BENCHMARKS.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_writes_a_few_shims_at_a_time() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("coord-turns").await else {
        return;
    };
    let shims: Vec<String> = (0..CLASS_WRITES_AT_ONCE + 2)
        .map(|i| format!("coord-turns-{i:02}"))
        .collect();
    for s in &shims {
        rig.fresh(s).await;
    }
    let docs: Vec<String> = shims
        .iter()
        .map(|s| shim_yaml(&rig.w, s, "1", ("test", "coord-turns")))
        .collect();
    let (ok, out) = rig.env.apply(&docs.join("---\n"));
    assert!(ok, "{out}");
    let (classes, finalizers) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (class_count, finalizer_count, node) =
        (classes.clone(), finalizers.clone(), rig.name.clone());
    let client = observed_client_for(
        &rig.env.coordinator_identity(),
        move |mut req: http::Request<kube::client::Body>| {
            let path = req.uri().path().to_string();
            if req.method() == http::Method::PATCH && path.contains("/runtimeclasses/coord-turns-")
            {
                class_count.fetch_add(1, Ordering::SeqCst);
                hold_as_watch(&mut req, &node, HELD_SECS);
            } else if req.method() == http::Method::PATCH
                && path.contains("/shims/coord-turns-")
                && !path.ends_with("/status")
            {
                finalizer_count.fetch_add(1, Ordering::SeqCst);
                hold_as_watch(&mut req, &node, HELD_SECS);
            }
            req
        },
    )
    .await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = tokio::spawn(coordinator::run(client, rig.name.clone(), fast(), stop));
    eventually(HELD_SECS - 7, "a turn of each kind under way", || async {
        (classes.load(Ordering::SeqCst) >= CLASS_WRITES_AT_ONCE
            && finalizers.load(Ordering::SeqCst) >= SHIM_WRITES_AT_ONCE)
            .then_some(())
    })
    .await;
    // every write that could start has started by now: the others wait for a turn
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        (
            classes.load(Ordering::SeqCst),
            finalizers.load(Ordering::SeqCst)
        ),
        (CLASS_WRITES_AT_ONCE, SHIM_WRITES_AT_ONCE),
        "(RuntimeClass, finalizer) writes under way at once, against what the coordinator allows"
    );
    let _ = stop_tx.send(true);
    let _ = coordinator.await;
    for s in &shims {
        rig.fresh(s).await;
    }
}
