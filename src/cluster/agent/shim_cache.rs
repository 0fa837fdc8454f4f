//! The agent's Shims without the status flood: it watches only the Shims' metadata and reads
//! a Shim whole only when one is new or its `generation` changed (issue 19 item 3).
//!
//! During a rollout the coordinator writes each Shim's status every few seconds. A full watch
//! sent the whole Shim, spec and status, to every node at each write; the metadata watch sends
//! the metadata only, and the spec, which is what a node works from, is read once per
//! generation. The cache keeps the metadata current (labels, annotations, finalizers, the
//! deletion timestamp) on the spec last read. The status it holds is as old as that read: no
//! agent decision reads a Shim's status.
//!
//! A read goes by `list` with a field selector on the name (nodes hold list and watch on Shims,
//! not get), or one list of all Shims when several changed at once (a batch, a relist). A read
//! that fails is tried again with backoff before the cache moves on, so it never shows a
//! generation it has not read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::StreamExt;
use kube::api::{ListParams, PartialObjectMeta, VersionMatch};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{Event, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::api::Shim;

/// More Shims to read than this at once: one list of all instead.
const READ_ONE_BY_ONE: usize = 3;
/// Longest pause between tries of a read that fails.
const READ_RETRY_MAX: Duration = Duration::from_secs(30);

/// Whether `cached` holds the spec `meta` describes: the same object (UID) at the same
/// generation.
pub fn holds_spec(cached: Option<&Shim>, meta: &PartialObjectMeta<Shim>) -> bool {
    cached
        .is_some_and(|c| c.uid() == meta.uid() && c.metadata.generation == meta.metadata.generation)
}

/// Whether a round plans anything else from `after` than from `before`: a Shim new or gone,
/// created again, at a new generation, or being deleted. Metadata alone (a status write's
/// resourceVersion, a label) is not.
pub fn spec_changed(before: Option<&Shim>, after: Option<&Shim>) -> bool {
    let key = |s: &Shim| {
        (
            s.uid(),
            s.metadata.generation,
            s.metadata.deletion_timestamp.is_some(),
        )
    };
    before.map(key) != after.map(key)
}

/// `cached` with the metadata of `meta` (its spec and status as read).
pub fn with_metadata(mut cached: Shim, meta: &PartialObjectMeta<Shim>) -> Shim {
    cached.metadata = meta.metadata.clone();
    cached
}

/// The agent's Shim cache ([`spawn_shim_cache`]).
pub struct ShimCacheHandle {
    /// The Shims, whole: the metadata current, the spec of the generation last read.
    pub store: Store<Shim>,
    /// Goes up at each change of what a round plans from ([`spec_changed`]), so a node that
    /// waits for a rollout slot knows when to plan again.
    pub specs: watch::Receiver<u64>,
    /// Set while the cache takes in events it has (reading the Shims they name): more
    /// changes are on their way into the store, so a round waits (see
    /// [`super::caches::quiet`]); a read slower than the quiet time started a round without
    /// the Shim being read, and its change took a second transaction and restart.
    pub reading: Arc<AtomicBool>,
    pub task: JoinHandle<()>,
}

/// The Shims of the cluster as a reflector store, kept from their metadata; `nudge` on every
/// change.
pub fn spawn_shim_cache(client: Client, nudge: mpsc::Sender<()>) -> ShimCacheHandle {
    let (reader, writer) = reflector::store();
    let (specs_tx, specs) = watch::channel(0u64);
    let reading = Arc::new(AtomicBool::new(false));
    let busy = reading.clone();
    let task = tokio::spawn(async move {
        let metas = Api::<PartialObjectMeta<Shim>>::all(client.clone());
        let mut cache = ShimCache {
            api: Api::all(client),
            writer,
            known: BTreeMap::new(),
            pending: Vec::new(),
            specs: specs_tx,
        };
        let stream = watcher(metas, crate::cluster::watch::listed_from_cache()).default_backoff();
        let mut stream = std::pin::pin!(stream);
        let mut failing = false;
        while let Some(first) = stream.next().await {
            // the events already here with it (a batch of new Shims): their reads go together
            busy.store(true, Ordering::SeqCst);
            let mut batch = vec![first];
            while let Some(Some(ev)) = stream.next().now_or_never() {
                batch.push(ev);
            }
            let mut events = Vec::new();
            for ev in batch {
                match ev {
                    Ok(ev) => {
                        if failing {
                            tracing::info!(watch = "shims", "watch restored");
                            failing = false;
                        }
                        events.push(ev);
                    }
                    Err(e) => {
                        crate::telemetry::watch_restarted("shims");
                        if !failing {
                            tracing::warn!(
                                watch = "shims",
                                "watch failed; retrying with backoff: {e}"
                            );
                        }
                        failing = true;
                    }
                }
            }
            let changed = cache.apply_all(events).await;
            busy.store(false, Ordering::SeqCst);
            if changed {
                let _ = nudge.try_send(());
            }
        }
    });
    ShimCacheHandle {
        store: reader,
        specs,
        reading,
        task,
    }
}

struct ShimCache {
    api: Api<Shim>,
    writer: Writer<Shim>,
    /// The Shims in the store, by name.
    known: BTreeMap<String, Shim>,
    /// The metadata of a relist under way.
    pending: Vec<PartialObjectMeta<Shim>>,
    /// Counts the changes of what a round plans from.
    specs: watch::Sender<u64>,
}

impl ShimCache {
    /// Take in metadata events in order, the Shims their updates need read in one go first;
    /// true when the store changed.
    async fn apply_all(&mut self, events: Vec<Event<PartialObjectMeta<Shim>>>) -> bool {
        let updates: Vec<PartialObjectMeta<Shim>> = events
            .iter()
            .filter_map(|ev| match ev {
                Event::Apply(m) => Some(m.clone()),
                _ => None,
            })
            .collect();
        let mut read = self.read_all(&updates).await;
        let mut changed = false;
        for ev in events {
            changed |= self.apply(ev, &mut read).await;
        }
        changed
    }

    /// Take in one metadata event (`read`: the Shims read for the batch's updates); true when
    /// the store changed.
    async fn apply(
        &mut self,
        ev: Event<PartialObjectMeta<Shim>>,
        read: &mut BTreeMap<String, Shim>,
    ) -> bool {
        match ev {
            Event::Init => {
                self.pending.clear();
                false
            }
            Event::InitApply(m) => {
                self.pending.push(m);
                false
            }
            Event::InitDone => {
                let metas = std::mem::take(&mut self.pending);
                let full = self.read_all(&metas).await;
                self.writer.apply_watcher_event(&Event::Init);
                for s in full.values() {
                    self.writer
                        .apply_watcher_event(&Event::InitApply(s.clone()));
                }
                self.writer.apply_watcher_event(&Event::InitDone);
                let same = full.len() == self.known.len()
                    && full
                        .iter()
                        .all(|(n, s)| !spec_changed(self.known.get(n), Some(s)));
                if !same {
                    self.specs.send_modify(|n| *n = n.wrapping_add(1));
                }
                self.known = full;
                true
            }
            Event::Apply(m) => {
                let name = m.name_any();
                let full = match self.known.get(&name) {
                    Some(c) if holds_spec(Some(c), &m) => Some(with_metadata(c.clone(), &m)),
                    _ => match read.remove(&name) {
                        Some(r) if holds_spec(Some(&r), &m) => Some(with_metadata(r, &m)),
                        _ => self.read_all(std::slice::from_ref(&m)).await.remove(&name),
                    },
                };
                let Some(full) = full else { return false };
                self.writer.apply_watcher_event(&Event::Apply(full.clone()));
                if spec_changed(self.known.get(&name), Some(&full)) {
                    self.specs.send_modify(|n| *n = n.wrapping_add(1));
                }
                self.known.insert(name, full);
                true
            }
            Event::Delete(m) => {
                let name = m.name_any();
                let gone = self.known.remove(&name).map(|c| with_metadata(c, &m));
                if let Some(g) = gone {
                    self.writer.apply_watcher_event(&Event::Delete(g));
                    self.specs.send_modify(|n| *n = n.wrapping_add(1));
                }
                true
            }
        }
    }

    /// The Shims `metas` describe, whole: the cached ones that hold their spec, the others
    /// read (one by one, or all at once when many). Tried until the read succeeds.
    async fn read_all(&self, metas: &[PartialObjectMeta<Shim>]) -> BTreeMap<String, Shim> {
        let stale: Vec<&PartialObjectMeta<Shim>> = metas
            .iter()
            .filter(|m| !holds_spec(self.known.get(&m.name_any()), m))
            .collect();
        let mut read = BTreeMap::new();
        if !stale.is_empty() {
            let names: Vec<String> = stale.iter().map(|m| m.name_any()).collect();
            // events come in order: the last one's version is the newest (versions are opaque)
            let newest = stale
                .last()
                .and_then(|m| m.metadata.resource_version.clone());
            read = self.read(&names, newest.as_deref()).await;
        }
        metas
            .iter()
            .filter_map(|m| {
                let name = m.name_any();
                let full = match self.known.get(&name) {
                    Some(c) if holds_spec(Some(c), m) => with_metadata(c.clone(), m),
                    _ => read.get(&name)?.clone(),
                };
                Some((name, full))
            })
            .collect()
    }

    /// Read the Shims named, not older than the version `newest` the watch showed (served
    /// from the API server's watch cache, as the event was), retrying with backoff until the
    /// API server answers.
    async fn read(&self, names: &[String], newest: Option<&str>) -> BTreeMap<String, Shim> {
        let mut pause = Duration::from_millis(200);
        loop {
            match self.try_read(names, newest).await {
                Ok(m) => return m,
                Err(e) => {
                    tracing::warn!(
                        retry_in_ms = pause.as_millis() as u64,
                        "cannot read the Shims {}: {e}",
                        names.join(", ")
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(READ_RETRY_MAX);
                }
            }
        }
    }

    async fn try_read(
        &self,
        names: &[String],
        newest: Option<&str>,
    ) -> kube::Result<BTreeMap<String, Shim>> {
        let base = match newest {
            Some(rv) => ListParams::default()
                .at(rv)
                .matching(VersionMatch::NotOlderThan),
            None => ListParams::default(),
        };
        let lists: Vec<ListParams> = if names.len() > READ_ONE_BY_ONE {
            vec![base]
        } else {
            names
                .iter()
                .map(|n| base.clone().fields(&format!("metadata.name={n}")))
                .collect()
        };
        let mut out = BTreeMap::new();
        for lp in &lists {
            for s in self.api.list(lp).await?.items {
                out.insert(s.name_any(), s);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(uid: &str, generation: i64, label: &str) -> PartialObjectMeta<Shim> {
        use kube::api::PartialObjectMetaExt;
        kube::api::ObjectMeta {
            name: Some("s".into()),
            uid: Some(uid.into()),
            generation: Some(generation),
            labels: Some([("l".to_string(), label.to_string())].into()),
            ..Default::default()
        }
        .into_response_partial::<Shim>()
    }

    fn shim(uid: &str, generation: i64) -> Shim {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, uid: {uid}, generation: {generation}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n",
            "a".repeat(64)
        );
        crate::api::load::parse_shims(&y, "t.yaml")
            .unwrap()
            .remove(0)
    }

    #[test]
    fn a_spec_is_read_again_only_for_a_new_object_or_generation() {
        let cached = shim("u1", 2);
        // a status write or a label: same UID and generation, the spec is still good
        assert!(holds_spec(Some(&cached), &meta("u1", 2, "x")));
        assert!(
            !holds_spec(Some(&cached), &meta("u1", 3, "x")),
            "a new spec"
        );
        assert!(
            !holds_spec(Some(&cached), &meta("u2", 2, "x")),
            "created again"
        );
        assert!(!holds_spec(None, &meta("u1", 2, "x")), "never read");
        // the metadata follows the event, the spec stays as read
        let updated = with_metadata(cached.clone(), &meta("u1", 2, "y"));
        assert_eq!(updated.labels().get("l").map(String::as_str), Some("y"));
        assert_eq!(updated.spec, cached.spec);
    }

    #[test]
    fn a_round_plans_again_for_a_new_spec_or_a_deletion_but_not_for_metadata() {
        let cached = shim("u1", 2);
        let status_write = with_metadata(cached.clone(), &meta("u1", 2, "y"));
        assert!(!spec_changed(Some(&cached), Some(&status_write)));
        assert!(spec_changed(None, Some(&cached)), "new");
        assert!(spec_changed(Some(&cached), None), "gone");
        assert!(
            spec_changed(Some(&cached), Some(&shim("u1", 3))),
            "a new generation"
        );
        assert!(
            spec_changed(Some(&cached), Some(&shim("u2", 2))),
            "created again"
        );
        let mut deleting = cached.clone();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(
            spec_changed(Some(&cached), Some(&deleting)),
            "being deleted"
        );
    }
}
