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
