//! How the agent reads collections: from the API server's watch cache (a `resourceVersion`
//! on every list), never with a quorum read (no `resourceVersion`), which costs the API
//! server a read from etcd and a wait for its cache each time. Thousands of agents starting
//! or listing their slots again at once made those reads time out (BENCHMARKS.md, 5000
//! agents).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::agent_rig::{Rig, with_coordinator_and_agent};
use crate::support::kube::SERIAL;
use crate::support::live::fake;

/// The collections an agent reads (the last segment of a list's path).
const COLLECTIONS: [&str; 5] = ["nodes", "pods", "shims", "shimextensions", "shimleases"];

/// The node agent's transport, every request's path and query recorded.
async fn recording_client(rig: &Rig, seen: Arc<Mutex<Vec<String>>>) -> kube::Client {
    rig.observed_client(move |req: http::Request<kube::client::Body>| {
        if req.method() == http::Method::GET {
            let uri = req.uri();
            let line = format!("{}?{}", uri.path(), uri.query().unwrap_or(""));
            seen.lock().unwrap().push(line);
        }
        req
    })
    .await
}

/// The lists among `requests` (GETs of a collection, not watches) made as quorum reads.
fn quorum_lists(requests: &[String]) -> Vec<String> {
    requests
        .iter()
        .filter(|r| {
            let (path, query) = r.split_once('?').unwrap_or((r, ""));
            let collection = path
                .rsplit('/')
                .next()
                .is_some_and(|s| COLLECTIONS.contains(&s));
            let params: Vec<&str> = query.split('&').collect();
            collection
                && !params.contains(&"watch=true")
                && !params.iter().any(|p| p.starts_with("resourceVersion="))
        })
        .cloned()
        .collect()
}

#[test]
fn a_list_without_a_resource_version_is_a_quorum_read() {
    let seen = [
        "/api/v1/nodes?fieldSelector=metadata.name%3Dn".to_string(),
        "/api/v1/nodes?fieldSelector=metadata.name%3Dn&resourceVersion=0&resourceVersionMatch=NotOlderThan".into(),
        "/api/v1/nodes?watch=true&resourceVersion=12".into(),
        "/api/v1/nodes/n".into(),
    ];
    assert_eq!(quorum_lists(&seen), [seen[0].clone()]);
}

#[tokio::test(flavor = "current_thread")]
async fn the_agent_lists_from_the_watch_cache_never_with_a_quorum_read() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("lists").await else {
        return;
    };
    let shims = ["lists-a", "lists-b"];
    for s in shims {
        rig.force_delete(s).await;
    }
    let seen = Arc::new(Mutex::new(Vec::new()));
    let client = recording_client(&rig, seen.clone()).await;
    let f = fake(&rig.w);
    with_coordinator_and_agent(
        &rig,
        &f,
        client,
        |_| {},
        || async {
            // two Shims at once: the agent's caches, a batch of slots, and each Shim's read
            rig.apply_and_await_labels(&shims, "lists").await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        },
    )
    .await;
    let seen = seen.lock().unwrap().clone();
    let lists = |c: &str| {
        seen.iter()
            .filter(|r| r.split('?').next().is_some_and(|p| p.ends_with(c)))
            .count()
    };
    // the agent did list what it watches, and its slots
    for c in ["nodes", "pods", "shims", "shimleases"] {
        assert!(lists(c) > 0, "no request for {c}: {seen:#?}");
    }
    let quorum = quorum_lists(&seen);
    assert!(quorum.is_empty(), "quorum reads: {quorum:#?}");
    for s in shims {
        rig.force_delete(s).await;
    }
}
