//! The [`SlotGate`] itself, at the bottom of the gate's files: what it holds (the node, its
//! Shims, the slots it took and when), how it is built, the slots it still needs, and the
//! helpers every way of taking a slot shares (a list from the watch cache, what a failed
//! request means). The rules it follows are in `decide.rs`; the list, the waits and the writes
//! in the files above this one.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, PostParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::lease::ShimLease;
use crate::api::names::NAMESPACE;
use crate::api::{RolloutType, Shim};
use crate::cluster::api_answer::ApiAnswer;
use crate::cluster::slots::{SLOT_FAILED, SLOT_HOLDER_LABEL};
use crate::cluster::{lease_edits, reservation_hints};
use crate::txn::error::GateError;

/// How a node waits for slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateTimings {
    /// How long a wait lasts, ±25 %, before the slots are listed again. A reservation
    /// reaches a waiting node through its watch, and a watch that ends brings a new list:
    /// this is the safety net, not the news.
    pub relist: Duration,
    /// Added to this node's wall clock in the times it writes (tests: skewed clocks; the
    /// protocol never compares them with another node's clock).
    pub clock_skew_secs: i64,
    /// Longest a ShimExtension may defer a restart while this node holds its slot (hooks).
    pub max_deferral: Duration,
    /// A slot this node wrote (took or renewed) this recently counts as renewed: the
    /// renewal before the restart is then the claim itself, one write less per node.
    pub fresh: Duration,
}

impl Default for GateTimings {
    fn default() -> Self {
        GateTimings {
            relist: Duration::from_secs(200),
            clock_skew_secs: 0,
            max_deferral: Duration::from_secs(300),
            fresh: Duration::from_secs(1),
        }
    }
}

/// Slots of the cluster's Shims, for one transaction of one node.
pub struct SlotGate<'a> {
    pub(super) api: Api<ShimLease>,
    pub(super) me: String,
    pub(super) my_uid: String,
    pub(super) cluster: &'a [Shim],
    pub(super) timings: GateTimings,
    /// For each slot held: its Shim, the Lease as last written, and when.
    pub(super) held: Mutex<Vec<Held<'a>>>,
    /// Waiting for a slot ends when this turns true.
    pub(super) shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    /// Waiting for the first slot ends when this changes: the Shims the transaction was
    /// planned from changed (see [`SlotGate::until_superseded`]).
    pub(super) superseded: Option<tokio::sync::watch::Receiver<u64>>,
    /// Shims this node runs from its own `shims.d` (they win over a cluster Shim of the same
    /// name): the node owner's, no rollout.
    pub(super) statics: BTreeSet<String>,
    /// This node's Node, where the coordinator names the slots reserved for it.
    pub(super) hints: Option<NodeHints>,
}

pub(super) type Held<'a> = (&'a Shim, ShimLease, Instant);

fn now(skew_secs: i64) -> MicroTime {
    let t = k8s_openapi::jiff::Timestamp::now();
    MicroTime(
        t.checked_add(k8s_openapi::jiff::SignedDuration::from_secs(skew_secs))
            .unwrap_or(t),
    )
}

/// A list of slots as the API server's watch cache has them (resourceVersion 0), not a quorum
/// read (see [`crate::cluster::watch::listed_from_cache`]): every take is a replace guarded by
/// the version listed, so a list that is behind costs a 409 and a watch event, never a slot
/// taken twice.
pub(super) fn slots_listed_from_cache() -> ListParams {
    ListParams::default().match_any()
}

pub(super) fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 404)
}

/// A read or write of the slots that failed with `e`, said as `what`: unavailable when it may
/// pass soon (the API server was away or overloaded), refused otherwise.
pub(super) fn api_failed(e: &kube::Error, what: String) -> GateError {
    if ApiAnswer::of(e).passes() {
        GateError::SlotUnavailable(what)
    } else {
        GateError::SlotRefused(what)
    }
}

/// This node's Node as its agent's cache holds it, and a count of its changes.
#[derive(Clone)]
pub struct NodeHints {
    pub node: Store<KubeNode>,
    pub changes: watch::Receiver<u64>,
}

impl NodeHints {
    /// The slot of `shim` the Node says is reserved for it.
    pub(super) fn slot_of(&self, shim: &str) -> Option<u32> {
        let node = self.node.state().into_iter().next()?;
        reservation_hints::of_node(&node).get(shim).copied()
    }
}

fn rolls_out(shim: &Shim) -> bool {
    !shim
        .spec
        .rollout_strategy
        .as_ref()
        .is_some_and(|s| s.type_ == RolloutType::Recreate)
}

impl<'a> SlotGate<'a> {
    pub fn new(
        client: Client,
        me: &str,
        my_uid: &str,
        cluster: &'a [Shim],
        timings: GateTimings,
    ) -> Self {
        SlotGate {
            api: Api::namespaced(client, NAMESPACE),
            me: me.to_string(),
            my_uid: my_uid.to_string(),
            cluster,
            timings,
            held: Mutex::new(Vec::new()),
            shutdown: None,
            superseded: None,
            statics: BTreeSet::new(),
            hints: None,
        }
    }

    /// Never gate these Shims: the node's static ones.
    pub fn except(mut self, statics: impl IntoIterator<Item = String>) -> Self {
        self.statics.extend(statics);
        self
    }

    /// End any wait for a slot when `shutdown` turns true (the transaction then aborts before
    /// anything on the host changed).
    pub fn until(mut self, shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    /// End a wait for the first slot with [`GateError::Superseded`] when `specs` changes (a
    /// Shim new, gone or at a new generation since the round read them): nothing was tried, so
    /// the node plans again and a Shim applied while it waited joins the same transaction
    /// instead of costing a second restart. A node that holds a slot already keeps waiting for
    /// the rest (giving the slot back would cost its place).
    pub fn until_superseded(mut self, specs: tokio::sync::watch::Receiver<u64>) -> Self {
        self.superseded = Some(specs);
        self
    }

    /// Wait for a reserved slot as this node's Node names it ([`NodeHints`]): a watch of that
    /// one slot by name. Without it the node watches the slots reserved for it by label,
    /// which the API server hands every slot event to be filtered.
    pub fn hinted_by(mut self, hints: NodeHints) -> Self {
        self.hints = Some(hints);
        self
    }

    /// Whether the wait for the first slot ends: the Shims changed, and none is held yet.
    pub(super) fn is_superseded(&self) -> bool {
        self.held().is_empty()
            && self
                .superseded
                .as_ref()
                .is_some_and(|s| s.has_changed().unwrap_or(false))
    }

    /// At start: give back slots this node holds from before (an agent that crashed after
    /// its transaction), except failed ones, which stay until a retry succeeds.
    pub async fn release_leftovers(client: Client, me: &str) {
        let api: Api<ShimLease> = Api::namespaced(client, NAMESPACE);
        let lp = slots_listed_from_cache().labels(&format!("{SLOT_HOLDER_LABEL}={me}"));
        let Ok(list) = api.list(&lp).await else {
            return;
        };
        for mut l in list.items {
            let failed = l.annotations().contains_key(SLOT_FAILED);
            if failed || l.spec.holder_identity.as_deref() != Some(me) {
                continue;
            }
            tracing::info!(slot = %l.name_any(), "releasing a slot left from before this start");
            l = lease_edits::release(l, me);
            let _ = api.replace(&l.name_any(), &PostParams::default(), &l).await;
        }
    }

    pub(super) fn held(&self) -> Vec<Held<'a>> {
        self.held.lock().map(|h| h.clone()).unwrap_or_default()
    }

    pub(super) fn set_held(&self, v: Vec<Held<'a>>) {
        if let Ok(mut h) = self.held.lock() {
            *h = v;
        }
    }

    /// `lease` taken by this node (holder, times, and its Node as an owner).
    pub(super) fn taken(&self, lease: ShimLease) -> ShimLease {
        lease_edits::take(
            lease,
            &self.me,
            &self.my_uid,
            now(self.timings.clock_skew_secs),
        )
    }

    pub(super) fn shutting_down(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|s| *s.borrow())
    }

    /// The Shims of `shims` this node needs a slot of and does not hold yet, in name order
    /// (the order every node takes them in).
    pub(super) fn needs(&self, shims: &[String]) -> Vec<&'a Shim> {
        let held = self.held();
        let mut needs: Vec<&'a Shim> = shims
            .iter()
            .filter(|name| !self.statics.contains(*name)) // the node's own: no rollout
            .filter_map(|name| self.cluster.iter().find(|s| s.name_any() == **name))
            .filter(|shim| rolls_out(shim))
            .filter(|shim| !held.iter().any(|(s, _, _)| s.name_any() == shim.name_any()))
            .collect();
        needs.sort_by_key(|s| s.name_any());
        needs.dedup_by_key(|s| s.name_any());
        needs
    }

    pub(super) fn hold(&self, shim: &'a Shim, lease: ShimLease) {
        let mut held = self.held();
        held.push((shim, lease, Instant::now()));
        self.set_held(held);
    }
}
