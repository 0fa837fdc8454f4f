//! The agent's watch caches (Shims by their metadata, its Node, its pods, the ShimExtensions)
//! and when a round
//! is due: the first sync, the fingerprint of what a round reads, and the debounce.

use std::hash::{Hash, Hasher};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::sync::{mpsc, watch as tokio_watch};
use tokio::time::Instant;

use super::shim_cache::spawn_shim_cache;
use crate::api::Shim;
use crate::cluster::target::PodUse;
use crate::cluster::watch::{Tasks, listed_from_cache, spawn_reflector};

/// Quiet time after a watch event before a round starts, so changes that arrive together
/// share one transaction (and one restart): the round waits until nothing it reads changed for
/// this long...
pub const ROUND_QUIET_MILLIS: u64 = 25;
/// ...but no longer than this after the first one.
pub const ROUND_QUIET_MAX_MILLIS: u64 = 500;

/// The caches a round reads.
pub(super) struct Caches {
    pub(super) shims: Store<Shim>,
    pub(super) hooks: std::sync::Arc<crate::hooks::Hooks>,
    pub(super) node: Store<KubeNode>,
    pub(super) pods: Store<Pod>,
    /// Counts the changes of what a round plans from in the Shims ([`super::shim_cache`]).
    pub(super) specs: tokio_watch::Receiver<u64>,
    /// Whether the Shim cache is taking in events it has ([`super::shim_cache::ShimCacheHandle`]).
    pub(super) shims_reading: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// Counts the events of this node's Node (the cache has each before the count moves).
    pub(super) node_changes: tokio_watch::Receiver<u64>,
    _tasks: Tasks,
}

impl Caches {
    /// Start the watches of `node_name`'s agent; each event that may matter nudges a round.
    pub(super) fn start(c: &Client, node_name: &str, nudge: &mpsc::Sender<()>) -> Caches {
        // metadata only, the spec read per generation: no status write floods the nodes
        let shim_cache = spawn_shim_cache(c.clone(), nudge.clone());
        // every event of its Node nudges a round and is counted, so the slot gate sees the
        // reservation hints the coordinator writes there
        let (node_events, node_rx) = mpsc::channel(1);
        let (node, t2) = spawn_reflector(
            Api::<KubeNode>::all(c.clone()),
            listed_from_cache().fields(&format!("metadata.name={node_name}")),
            "node",
            node_events,
        );
        let (node_changes, t5) = count_node_events(node_rx, nudge.clone());
        let (pods, t3) = spawn_reflector(
            Api::<Pod>::all(c.clone()),
            listed_from_cache().fields(&format!("spec.nodeName={node_name}")),
            "pods",
            nudge.clone(),
        );
        // ShimExtensions: a cache the rounds read, no request per restart; a change to one
        // starts no round (the channel has no reader)
        let (ext, t4) = spawn_reflector(
            Api::<crate::api::extension::ShimExtension>::all(c.clone()),
            listed_from_cache(),
            "shimextensions",
            mpsc::channel(1).0,
        );
        Caches {
            shims: shim_cache.store,
            shims_reading: shim_cache.reading,
            hooks: std::sync::Arc::new(crate::hooks::Hooks::new(c.clone(), ext)),
            node,
            pods,
            specs: shim_cache.specs,
            node_changes,
            _tasks: Tasks(vec![shim_cache.task, t2, t3, t4, t5]),
        }
    }

    /// Until the watches synced and this node's Node exists.
    pub(super) async fn ready(&self) {
        let _ = self.shims.wait_until_ready().await;
        let _ = self.pods.wait_until_ready().await;
        let _ = self.node.wait_until_ready().await;
        loop {
            if !self.node.state().is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `node_wait` passed before the caches were ready. A Node cache that synced without
    /// this node's Node is a misconfigured name: an error. So is a Node this identity may not
    /// read (a kubelet's credentials read their own Node alone), found with one get. Other
    /// watches that have not synced are a slow or unreachable API server, or a missing
    /// permission: the watches retry with backoff, so the agent says so and keeps waiting.
    /// Exiting instead made every agent of a fleet list everything again when the API
    /// server was slow, which is what kept it slow (BENCHMARKS.md: 5000 agents).
    pub(super) async fn not_synced_yet(
        &self,
        client: &Client,
        node_name: &str,
        node_wait: Duration,
    ) -> anyhow::Result<()> {
        let secs = node_wait.as_secs();
        let set_it = "set node.name in the agent's config to this node's name in Kubernetes (`kubectl get nodes`)";
        let node_synced = node_cache_ready(self);
        if node_synced && self.node.state().is_empty() {
            anyhow::bail!("no Node named {node_name:?} in the cluster (waited {secs} s): {set_it}",)
        }
        if !node_synced
            && let Err(kube::Error::Api(s)) =
                Api::<KubeNode>::all(client.clone()).get(node_name).await
            && s.code == 403
        {
            anyhow::bail!(
                "no Node named {node_name:?} that this identity may read (the API server refused it: a kubelet's credentials read their own Node alone, a dedicated identity needs the manifests' shim-agent-dedicated-node role): {set_it}",
            )
        }
        tracing::warn!(
            "the watches have not synced in {secs} s; still waiting: check that the API server is reachable and that this identity may list Shims, its Node and its pods"
        );
        Ok(())
    }
}

/// Pass each event of the Node's reflector on to `nudge`, and count it.
fn count_node_events(
    mut events: mpsc::Receiver<()>,
    nudge: mpsc::Sender<()>,
) -> (tokio_watch::Receiver<u64>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio_watch::channel(0u64);
    let task = tokio::spawn(async move {
        while events.recv().await.is_some() {
            tx.send_modify(|n| *n = n.wrapping_add(1));
            let _ = nudge.try_send(());
        }
    });
    (rx, task)
}

/// Whether the Node cache had its first sync (without waiting for it).
fn node_cache_ready(caches: &Caches) -> bool {
    futures_util::FutureExt::now_or_never(caches.node.wait_until_ready()).is_some_and(|r| r.is_ok())
}

/// What a round depends on: Shim identities and generations, this Node's labels, the pods'
/// RuntimeClasses. Status writes and heartbeats do not change it.
pub(super) fn fingerprint(c: &Caches) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let mut shims: Vec<(String, Option<i64>, bool, Option<String>)> = c
        .shims
        .state()
        .iter()
        .map(|s| {
            (
                s.name(),
                s.metadata.generation,
                s.metadata.deletion_timestamp.is_some(),
                s.uid(),
            )
        })
        .map(|(n, g, d, u)| (n.to_string(), g, d, u))
        .collect();
    shims.sort();
    shims.hash(&mut h);
    for n in c.node.state() {
        n.labels().hash(&mut h);
    }
    let mut pods: Vec<PodUse> = c.pods.state().iter().map(|p| pod_use(p)).collect();
    pods.sort_by(|a, b| a.name.cmp(&b.name));
    for p in pods {
        (p.name, p.runtime_class, p.finished).hash(&mut h);
    }
    h.finish()
}

/// Wait until what a round depends on (`fingerprint`) stayed the same for
/// [`ROUND_QUIET_MILLIS`] with no more on its way (`busy`: the Shim cache reading what it was
/// told), at most [`ROUND_QUIET_MAX_MILLIS`] in all, draining `events`. Events that change
/// nothing a round reads (status, finalizer, our own annotation) do not extend it.
pub(super) async fn quiet(
    events: &mut mpsc::Receiver<()>,
    fingerprint: impl Fn() -> u64,
    busy: impl Fn() -> bool,
) {
    let until = Instant::now() + Duration::from_millis(ROUND_QUIET_MAX_MILLIS);
    let mut seen = fingerprint();
    loop {
        tokio::time::sleep(Duration::from_millis(ROUND_QUIET_MILLIS)).await;
        while events.try_recv().is_ok() {}
        let now = fingerprint();
        if (now == seen && !busy()) || Instant::now() >= until {
            return;
        }
        seen = now;
    }
}

pub(super) async fn sleep_until_opt(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A pod of this node as a round reads it.
pub(super) fn pod_use(p: &Pod) -> PodUse {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    PodUse {
        name: format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
        runtime_class: p.spec.as_ref().and_then(|s| s.runtime_class_name.clone()),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// A round waits while the Shim cache reads what it was told, not just until the store
    /// stood still for the quiet time.
    #[tokio::test(start_paused = true)]
    async fn the_quiet_time_waits_for_the_shim_cache_to_take_in_what_it_has() {
        let (_tx, mut events) = mpsc::channel(1);
        let t0 = Instant::now();
        let reading_until = t0 + Duration::from_millis(120);
        quiet(&mut events, || 7, || Instant::now() < reading_until).await;
        let waited = t0.elapsed();
        assert!(
            waited >= Duration::from_millis(120),
            "the round started while the cache was reading: {waited:?}"
        );
        assert!(waited < Duration::from_millis(120 + ROUND_QUIET_MILLIS + 1));

        // nothing on its way: one quiet time
        let t0 = Instant::now();
        quiet(&mut events, || 7, || false).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(ROUND_QUIET_MILLIS));

        // a cache that never ends its read (an API server down) holds no round past the most
        let t0 = Instant::now();
        quiet(&mut events, || 7, || true).await;
        assert_eq!(t0.elapsed(), Duration::from_millis(ROUND_QUIET_MAX_MILLIS));

        // a store that keeps changing holds it as long, and no longer
        let n = Cell::new(0u64);
        let t0 = Instant::now();
        quiet(
            &mut events,
            || {
                n.set(n.get() + 1);
                n.get()
            },
            || false,
        )
        .await;
        assert_eq!(t0.elapsed(), Duration::from_millis(ROUND_QUIET_MAX_MILLIS));
    }
}
