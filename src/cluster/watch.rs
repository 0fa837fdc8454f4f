//! Watches that keep a local cache ([`Store`]) and nudge a round on every change.
//!
//! kube-runtime's watcher resumes from the last resourceVersion after a dropped connection
//! and relists only on `410 Gone`; with `default_backoff` a failing API server is retried
//! with capped exponential backoff (no busy loop, no crash). Bookmarks keep the
//! resourceVersion fresh on quiet watches, so a reconnect rarely needs a relist.

use std::fmt::Debug;
use std::hash::Hash;

use futures_util::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Start a reflector over `api` with `config`; every event sends `()` on `nudge` (dropped
/// when a nudge is already pending). The task ends when the returned handle is aborted.
pub fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    nudge: mpsc::Sender<()>,
) -> (Store<K>, JoinHandle<()>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => {
                    if failing {
                        tracing::info!(watch = what, "watch restored");
                        failing = false;
                    }
                    let _ = nudge.try_send(());
                }
                Err(e) => {
                    crate::telemetry::watch_restarted(what);
                    if !failing {
                        tracing::warn!(watch = what, "watch failed; retrying with backoff: {e}");
                    }
                    failing = true;
                }
            }
        }
    });
    (reader, task)
}

/// The watch configuration of an agent's caches: (re)listed from the API server's watch
/// cache (resourceVersion 0), as the kubelet's informers list, not with a quorum read. A
/// consistent list costs the API server a read from etcd and a wait (up to 3 s) for its
/// cache to catch up; thousands of agents starting or relisting at once turned that into
/// list timeouts and 429s that kept a 5000-node rollout from starting. The watch that follows
/// brings whatever the listed state missed.
///
/// Unpaged: kube sends no `resourceVersion=0` with a page limit (and the API server ignores
/// a limit on a read from its cache); what an agent lists is its own Node, its own Pods and
/// the cluster's Shims and ShimExtensions.
pub fn listed_from_cache() -> watcher::Config {
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    config
}

/// Aborts the reflector tasks when dropped.
#[derive(Default)]
pub struct Tasks(pub Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
