//! The agent's Shim cache on the real API server (issue 19: status without a flood): it
//! watches the Shims' metadata only, so the coordinator's status writes reach it without the
//! Shim; it reads a Shim whole when one is new or its generation changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use shim_agent::api::Shim;
use shim_agent::cluster::agent::shim_cache::spawn_shim_cache;

use crate::support::kube::{SERIAL, eventually, hold_as_watch, kube_env, observed_client_for};
use crate::support::live::{shim_yaml, world};

/// Shim `name` gone: a leftover of an earlier run, with the finalizer another test's
/// coordinator added.
async fn gone(shims: &Api<Shim>, name: &str) {
    let _ = shims.delete(name, &Default::default()).await;
    let unfinalized = serde_json::json!({"metadata": {"finalizers": null}});
    let _ = shims
        .patch(name, &PatchParams::default(), &Patch::Merge(&unfinalized))
        .await;
    eventually(30, "the old Shim gone", || async {
        shims.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_reach_the_cache_as_metadata_and_a_new_generation_is_read_whole() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let w = world();
    let name = "kcache-spin";
    let shims: Api<Shim> = Api::all(env.admin_client().await);
    gone(&shims, name).await;
    let (ok, out) = env.apply(&shim_yaml(&w, name, "1", ("test", "kcache")));
    assert!(ok, "{out}");
    let (tx, mut nudges) = tokio::sync::mpsc::channel(64);
    let client = crate::support::kube::client_for(&env.node_identity("kcache-node")).await;
    env.create_node("kcache-node", &[("test", "kcache")]).await;
    let cache = spawn_shim_cache(client, tx);
    let (store, specs) = (cache.store, cache.specs);
    let key = ObjectRef::<Shim>::new(name);
    let first = eventually(30, "the Shim in the cache", || async { store.get(&key) }).await;
    assert!(first.status.is_none(), "read before any status");
    let specs_at_first = *specs.borrow();

    // the coordinator's status writes: the cache follows the metadata (the resourceVersion)
    // and keeps the spec and status it read, so no write sent it the Shim
    let pp = PatchParams::default();
    for i in 0..5 {
        let status = serde_json::json!({"status": {"nodes": {"targeted": i, "installed": 0, "updating": 0, "failed": 0}}});
        shims
            .patch_status(name, &pp, &Patch::Merge(&status))
            .await
            .unwrap();
    }
    let now = shims.get(name).await.unwrap();
    let seen = eventually(30, "the last status write's metadata", || async {
        let s = store.get(&key)?;
        (s.metadata.resource_version == now.metadata.resource_version).then_some(s)
    })
    .await;
    assert!(
        seen.status.is_none(),
        "the status came with the metadata: {:?}",
        seen.status
    );
    assert_eq!(seen.spec, first.spec);
    assert_eq!(
        *specs.borrow(),
        specs_at_first,
        "a status write changes nothing a round plans from"
    );
    while nudges.try_recv().is_ok() {}

    // a new spec (generation 2) is read whole, with the status of the moment
    let (ok, out) = env.apply(&shim_yaml(&w, name, "2", ("test", "kcache")));
    assert!(ok, "{out}");
    let newer = eventually(30, "generation 2 in the cache", || async {
        let s = store.get(&key)?;
        (s.metadata.generation == Some(2)).then_some(s)
    })
    .await;
    assert_ne!(newer.spec, first.spec, "the new spec");
    assert!(newer.status.is_some(), "read whole: its status too");
    assert!(nudges.try_recv().is_ok(), "a change nudges the round");
    assert!(
        *specs.borrow() > specs_at_first,
        "a new generation is counted, so a wait for a slot ends and the node plans again"
    );

    let _ = shims.delete(name, &Default::default()).await;
    eventually(30, "the Shim gone from the cache", || async {
        store.get(&key).is_none().then_some(())
    })
    .await;
}

/// A round waits while the cache reads a Shim it was told of (a read slower than the quiet
/// time started a round without that Shim, and cost a second restart): the cache says it is
/// reading from the event until the Shim is in the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_says_it_is_reading_until_a_new_shim_is_in_the_store() {
    // long enough that a loaded machine sees the read begin well inside it
    const HELD_SECS: u64 = 8;
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let w = world();
    let name = "kcache-reading";
    let shims: Api<Shim> = Api::all(env.admin_client().await);
    gone(&shims, name).await;
    env.create_node("kcache-node", &[("test", "kcache")]).await;
    // the first read of this Shim becomes a watch the API server holds HELD_SECS: a slow read
    let held = Arc::new(AtomicUsize::new(0));
    let counted = held.clone();
    let mark = format!("metadata.name%3D{name}");
    let observe = move |mut req: http::Request<kube::client::Body>| {
        let query = req.uri().query().unwrap_or("").to_string();
        let read = req.uri().path().ends_with("/shims") && !query.contains("watch=true");
        if read && query.contains(&mark) && counted.fetch_add(1, Ordering::SeqCst) == 0 {
            hold_as_watch(&mut req, "kcache-node", HELD_SECS);
        }
        req
    };
    let client = observed_client_for(&env.node_identity("kcache-node"), observe).await;
    let (tx, _nudges) = tokio::sync::mpsc::channel(64);
    let cache = spawn_shim_cache(client, tx);
    let _ = cache.store.wait_until_ready().await;
    let reading: Arc<AtomicBool> = cache.reading.clone();
    // the store is ready a moment before the cache says its first list is taken in
    eventually(5, "synced: nothing to read", || async {
        (!reading.load(Ordering::SeqCst)).then_some(())
    })
    .await;

    let (ok, out) = env.apply(&shim_yaml(&w, name, "1", ("test", "kcache")));
    assert!(ok, "{out}");
    let key = ObjectRef::<Shim>::new(name);
    eventually(HELD_SECS - 3, "the read held", || async {
        (held.load(Ordering::SeqCst) > 0).then_some(())
    })
    .await;
    assert!(
        reading.load(Ordering::SeqCst),
        "a read under way is said, so no round begins without its Shim"
    );
    assert!(cache.store.get(&key).is_none());
    eventually(30, "the Shim in the store", || async {
        cache.store.get(&key)
    })
    .await;
    eventually(5, "the read said to be over", || async {
        (!reading.load(Ordering::SeqCst)).then_some(())
    })
    .await;
    let _ = shims.delete(name, &Default::default()).await;
}
