//! The agent's side of the rollout (docs/design.md §5): a [`Gate`] that holds a slot Lease of
//! every cluster Shim a transaction restarts containerd for.
//!
//! # Protocol
//! - Acquire: one list of the Shim's slots; a slot this node holds is adopted (an agent that
//!   restarted finds its own), and a free open slot reserved for it (or, while the Shim has
//!   few rivals, for nobody, in the node's rendezvous order) is taken at once. Otherwise the
//!   node waits ([`contend`]): with few rivals on a watch of the Shim's slots, else on its
//!   Node for the slot the coordinator reserves for it and then on a watch of that slot
//!   alone, by name ([`hinted`]). A claim is a replace guarded by the resourceVersion the node
//!   saw: of two claimants one gets a 409 and goes on waiting. The holder's Node becomes an
//!   owner of the slot (so a deleted Node's slot can be freed, see the admission policy in
//!   `api::policies`).
//! - Renew: a replace with a new `renewTime`, right before the restart; anything but
//!   success and the restart does not happen. A slot written (taken or renewed) within
//!   `GateTimings::fresh` counts as renewed.
//! - Release: holder, failure mark and Node owner cleared; a slot whose Shim is gone is
//!   deleted instead (nothing else would collect it).
//! - Failure: the slot is kept and marked with the Shim generation, the resume token and the
//!   reason, so capacity shrinks by itself and the coordinator can halt the rollout.
//!
//! Static Shims and `recreate` Shims take no slot.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::api::lease::ShimLease;
use crate::api::names::NAMESPACE;
use crate::api::{RolloutType, Shim};
use crate::cluster::api_answer::ApiAnswer;
use crate::cluster::lease_edits;
use crate::cluster::slots::{
    Claim, Failure, SLOT_FAILED, SLOT_HOLDER_LABEL, SLOT_SHIM_LABEL, resume_token, slot_of,
};
use crate::txn::Gate;
use crate::txn::error::GateError;

mod batch;
mod claim;
mod contend;
mod decide;
mod hinted;

pub use hinted::NodeHints;

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
    api: Api<ShimLease>,
    me: String,
    my_uid: String,
    cluster: &'a [Shim],
    timings: GateTimings,
    /// For each slot held: its Shim, the Lease as last written, and when.
    held: Mutex<Vec<Held<'a>>>,
    /// Waiting for a slot ends when this turns true.
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    /// Waiting for the first slot ends when this changes: the Shims the transaction was
    /// planned from changed (see [`SlotGate::until_superseded`]).
    superseded: Option<tokio::sync::watch::Receiver<u64>>,
    /// Shims this node runs from its own `shims.d` (they win over a cluster Shim of the same
    /// name): the node owner's, no rollout.
    statics: BTreeSet<String>,
    /// This node's Node, where the coordinator names the slots reserved for it.
    hints: Option<NodeHints>,
}

type Held<'a> = (&'a Shim, ShimLease, Instant);

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
fn slots_listed_from_cache() -> ListParams {
    ListParams::default().match_any()
}

fn gone(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 404)
}

/// A read or write of the slots that failed with `e`, said as `what`: unavailable when it may
/// pass soon (the API server was away or overloaded), refused otherwise.
fn api_failed(e: &kube::Error, what: String) -> GateError {
    if ApiAnswer::of(e).passes() {
        GateError::SlotUnavailable(what)
    } else {
        GateError::SlotRefused(what)
    }
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
    fn is_superseded(&self) -> bool {
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

    fn held(&self) -> Vec<Held<'a>> {
        self.held.lock().map(|h| h.clone()).unwrap_or_default()
    }

    fn set_held(&self, v: Vec<Held<'a>>) {
        if let Ok(mut h) = self.held.lock() {
            *h = v;
        }
    }

    /// `lease` taken by this node (holder, times, and its Node as an owner).
    fn taken(&self, lease: ShimLease) -> ShimLease {
        lease_edits::take(
            lease,
            &self.me,
            &self.my_uid,
            now(self.timings.clock_skew_secs),
        )
    }

    async fn acquire_one(&self, shim: &Shim) -> Result<ShimLease, GateError> {
        let name = shim.name_any();
        let lp = slots_listed_from_cache().labels(&format!("{SLOT_SHIM_LABEL}={name}"));
        // the watches in a row that ended early
        let mut ended = 0;
        loop {
            if self.shutting_down() {
                return Err(GateError::ShuttingDown);
            }
            if self.is_superseded() {
                return Err(GateError::Superseded);
            }
            let list = self
                .api
                .list(&lp)
                .await
                .map_err(|e| api_failed(&e, format!("cannot list the slots of {name}: {e}")))?;
            let rv = list.metadata.resource_version.clone().unwrap_or_default();
            let leases: Vec<ShimLease> = list.items;
            let slots: Vec<_> = leases.iter().filter_map(|l| slot_of(shim, l)).collect();
            let listed = decide::after_list(&self.me, &self.my_uid, &name, &slots);
            let at_once = match listed.claim {
                Claim::Adopt(i) => {
                    tracing::info!(shim = %name, slot = i, "adopting the slot this node holds");
                    vec![i]
                }
                // reserved for this node, or few rivals: take one now, the next when a
                // rival was first to one (the watch below brings no slot left as listed)
                Claim::Take(tries) => tries,
                Claim::Wait => Vec::new(),
            };
            // a rival was first to each, or the list was behind: the watch from the list's
            // version brings what changed, where a list again could show the same
            for i in at_once {
                if let Some(l) = self.take_now(shim, i, &leases).await? {
                    return Ok(l);
                }
            }
            crate::telemetry::doing(Some(format!("waiting for a slot for {name}")));
            let seen = claim::Seen {
                resource_version: &rv,
                few_rivals: listed.few_rivals,
                reserved: listed.reserved,
            };
            match self.contend(shim, seen).await? {
                claim::Waited::Took(l) => return Ok(*l),
                claim::Waited::Relist => ended = 0,
                claim::Waited::Ended => {
                    ended += 1;
                    let pause = contend::pause_after_ended(ended, &self.my_uid, &name, &rv);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.interrupted() => {}
                    }
                }
            }
        }
    }

    /// Take (or renew, if this node holds it) slot `i` of `shim` as listed in `leases`; `None`
    /// when it moved meanwhile (a 409 or 404: list again).
    async fn take_now(
        &self,
        shim: &Shim,
        i: u32,
        leases: &[ShimLease],
    ) -> Result<Option<ShimLease>, GateError> {
        let name = shim.name_any();
        let Some(l) = leases
            .iter()
            .find(|l| slot_of(shim, l).is_some_and(|s| s.index == i))
        else {
            return Ok(None);
        };
        match self
            .api
            .replace(
                &l.name_any(),
                &PostParams::default(),
                &self.taken(l.clone()),
            )
            .await
        {
            Ok(l) => {
                tracing::info!(shim = %name, slot = i, "took a rollout slot");
                Ok(Some(l))
            }
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(api_failed(
                &e,
                format!("cannot take slot {i} of {name}: {e}"),
            )),
        }
    }

    fn shutting_down(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|s| *s.borrow())
    }

    /// Write `edit` of this node's own slot `lease`: a JSON Patch that tests this node is the
    /// holder (the coordinator's reservation writes move the resourceVersion meanwhile); when
    /// the API server refuses it, a replace of the slot read again, while this node holds it.
    async fn write_own(
        &self,
        lease: ShimLease,
        edit: impl Fn(ShimLease) -> ShimLease,
    ) -> Result<ShimLease, GateError> {
        let name = lease.name_any();
        let patch = lease_edits::own_patch(&lease, &edit(lease.clone()), &self.me);
        match self
            .api
            .patch(&name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
        {
            Ok(l) => return Ok(l),
            Err(e) if ApiAnswer::of(&e).passes() => {
                return Err(api_failed(&e, format!("slot {name}: {e}")));
            }
            // the holder test failed, or the patch no longer applies: read and see
            Err(e) => tracing::debug!(slot = %name, "patch of its own slot refused: {e}"),
        }
        let mut cur = lease;
        for _ in 0..3 {
            match self
                .api
                .replace(&name, &PostParams::default(), &edit(cur.clone()))
                .await
            {
                Ok(l) => return Ok(l),
                Err(e) if gone(&e) => {
                    cur = self
                        .api
                        .get(&name)
                        .await
                        .map_err(|e| api_failed(&e, format!("slot {name}: {e}")))?;
                    if cur.spec.holder_identity.as_deref() != Some(self.me.as_str()) {
                        return Err(GateError::SlotLost {
                            slot: name,
                            me: self.me.clone(),
                        });
                    }
                }
                Err(e) => return Err(api_failed(&e, format!("slot {name}: {e}"))),
            }
        }
        Err(GateError::SlotUnavailable(format!(
            "slot {name} keeps changing"
        )))
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
    /// The Shims of `shims` this node needs a slot of and does not hold yet, in name order
    /// (the order every node takes them in).
    fn needs(&self, shims: &[String]) -> Vec<&'a Shim> {
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

    fn hold(&self, shim: &'a Shim, lease: ShimLease) {
        let mut held = self.held();
        held.push((shim, lease, Instant::now()));
        self.set_held(held);
    }
}

impl Gate for SlotGate<'_> {
    /// Every slot `shims` need, taken in name order, so no two nodes wait on each other. A
    /// batch first tries its first slot, then all the others at once ([`batch`]), and keeps
    /// the longest prefix it got; it waits only for the first one missing, then tries the
    /// rest again. When that fails, nothing was tried: the slots of the prefix go back as
    /// they were, not marked failed (a failure mark counts against `maxFailures`).
    async fn acquire(&self, shims: &[String]) -> Result<(), GateError> {
        let r = self.acquire_in_order(shims).await;
        if r.is_err() {
            self.release().await;
        }
        r
    }

    /// Every held slot not written within `fresh` renewed, all at once.
    async fn renew(&self) -> Result<(), GateError> {
        let renewals = self.held().into_iter().map(|(shim, lease, at)| async move {
            if at.elapsed() < self.timings.fresh {
                return Ok((shim, lease, at));
            }
            let l = self.write_own(lease, |l| self.taken(l)).await?;
            Ok((shim, l, Instant::now()))
        });
        let out = join_all(renewals)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, GateError>>()?;
        self.set_held(out);
        Ok(())
    }

    /// Every held slot given back, all at once.
    async fn release(&self) {
        let releases = self.held().into_iter().map(|(shim, lease, _)| async move {
            let shim_gone = !lease
                .owner_references()
                .iter()
                .any(|o| o.kind == "Shim" && Some(&o.uid) == shim.metadata.uid.as_ref());
            if shim_gone {
                // the garbage collector deletes the slot with its Shim (a node may not)
                return;
            }
            let r = self
                .write_own(lease, |l| lease_edits::release(l, &self.me))
                .await;
            match r {
                Ok(_) => tracing::debug!(shim = %shim.name_any(), "released the rollout slot"),
                Err(e) => {
                    tracing::warn!(shim = %shim.name_any(), "cannot release the rollout slot: {e}")
                }
            }
        });
        join_all(releases).await;
        self.set_held(Vec::new());
    }

    /// Every held slot kept and marked with the failure, all at once.
    async fn failed(&self, reason: &str) {
        let marks = self.held().into_iter().map(|(shim, lease, _)| async move {
            let f = Failure {
                generation: shim.metadata.generation.unwrap_or_default(),
                resume: resume_token(shim),
                reason: reason.chars().take(256).collect(),
            };
            let r = self
                .write_own(lease, |l| lease_edits::mark_failed(l, &f))
                .await;
            if let Err(e) = r {
                tracing::warn!(shim = %shim.name_any(), "cannot mark the rollout slot failed: {e}");
            }
        });
        join_all(marks).await;
        self.set_held(Vec::new());
    }
}

#[cfg(test)]
mod tests;
