//! The agent's Shim cache on the real API server (issue 19: status without a flood): it
//! watches the Shims' metadata only, so the coordinator's status writes reach it without the
//! Shim; it reads a Shim whole when one is new or its generation changes.

use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::ObjectRef;
use shim_agent::api::Shim;
use shim_agent::cluster::agent::shim_cache::spawn_shim_cache;

use crate::support::kube::{SERIAL, eventually, kube_env};
use crate::support::live::{shim_yaml, world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_writes_reach_the_cache_as_metadata_and_a_new_generation_is_read_whole() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let w = world();
    let name = "kcache-spin";
    let admin = env.admin_client().await;
    let shims: Api<Shim> = Api::all(admin.clone());
    // a leftover of an earlier run, with the finalizer another test's coordinator added
    let _ = shims.delete(name, &Default::default()).await;
    let unfinalized = serde_json::json!({"metadata": {"finalizers": null}});
    let _ = shims
        .patch(name, &PatchParams::default(), &Patch::Merge(&unfinalized))
        .await;
    eventually(30, "the old Shim gone", || async {
        shims.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
    let (ok, out) = env.apply(&shim_yaml(&w, name, "1", ("test", "kcache")));
    assert!(ok, "{out}");
    let (tx, mut nudges) = tokio::sync::mpsc::channel(64);
    let client = crate::support::kube::client_for(&env.node_identity("kcache-node")).await;
    env.create_node("kcache-node", &[("test", "kcache")]).await;
    let (store, specs, _task) = spawn_shim_cache(client, tx);
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
