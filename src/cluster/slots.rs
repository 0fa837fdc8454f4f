//! Rollout slots (docs/design.md §5), the pure part both roles share: how many slots a Shim
//! gets, what a slot Lease says, when a rollout halts, and how a node claims one. No I/O; the
//! Lease writes are in [`super::agent::gate`] (agents) and the coordinator, whose plan for the
//! slots is [`super::coordinator::slot_plan`].
//!
//! # Rules
//! - A node needs a slot of a Shim for every containerd restart that Shim's change causes.
//!   `rolling` gives N = maxUpdate slots (an integer, or a percentage of the targeted nodes
//!   rounded down, at least 1); `recreate` gives no limit and no slots. Without a
//!   `rolloutStrategy` a Shim rolls with N = 1 and maxFailures 0: one node at a time, and the
//!   first failure halts.
//! - A slot is *free* when it has no holder, and *open* when it carries no close mark. Nodes
//!   take only free open slots, and a release keeps the mark. The coordinator keeps
//!   `held + free open ≤ N`, so however agents race, no node takes a slot beyond the current
//!   N: when N shrinks, slots above it are retired (closed, deleted once free), and the
//!   other slots, held or free, stay closed until the holders fit the new bound.
//! - A failed node keeps its slot, marked with the failure, so capacity shrinks by itself.
//!   Failures of the Shim's current generation since the last resume count; more than
//!   maxFailures halts the rollout: every slot is closed, nodes mid-update finish (and their
//!   slots stay closed when they release them). A new
//!   generation or a new value of the resume annotation on the Shim reopens it.
//! - Nothing frees a live node's slot on a timer; a deleted Node's slot is freed.
//! - A Shim has few rivals when the nodes it targets fit in its slots (or are two at most):
//!   then a free slot reserved for nobody is taken at once, and the coordinator reserves none
//!   ([`few_rivals`], read from the stamps on the slots by both sides alike). A slot reserved
//!   for a node stays so, once free, for [`CLAIM_WITHIN`]; the gate's own waits stay below it.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

use crate::api::lease::ShimLease;
use crate::api::{RolloutType, Shim};
use crate::retry::{draw, spread};

pub use crate::api::lease::{
    SLOT_CLOSED, SLOT_COUNT, SLOT_FAILED, SLOT_FREED, SLOT_HOLDER_LABEL, SLOT_RESERVED_LABEL,
    SLOT_SHIM_LABEL, SLOT_TARGETED,
};
pub use crate::api::names::RESUME_ANNOTATION;

/// The name of slot `index` of `shim`.
pub fn slot_name(shim: &str, index: u32) -> String {
    format!("{shim}-slot-{index}")
}

/// The index of a slot Lease of `shim` named `name`.
pub fn slot_index(shim: &str, name: &str) -> Option<u32> {
    name.strip_prefix(shim)?
        .strip_prefix("-slot-")?
        .parse()
        .ok()
}

/// The rollout limits of a Shim: `None` slots means no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub slots: Option<u32>,
    pub max_failures: u32,
}

/// N and maxFailures for `shim` with `targeted` nodes.
pub fn limits(shim: &Shim, targeted: u32) -> Limits {
    let strategy = shim.spec.rollout_strategy.as_ref();
    let rolling = strategy.and_then(|s| s.rolling.as_ref());
    let max_failures = rolling
        .and_then(|r| r.max_failures)
        .map_or(0, |f| f.max(0) as u32);
    if strategy.is_some_and(|s| s.type_ == RolloutType::Recreate) {
        return Limits {
            slots: None,
            max_failures,
        };
    }
    let n = match rolling.and_then(|r| r.max_update.as_ref()) {
        None => 1,
        Some(IntOrString::Int(i)) => (*i).max(1) as u32,
        Some(IntOrString::String(s)) => {
            let pct: u64 = s.trim_end_matches('%').parse().unwrap_or(100);
            ((u64::from(targeted) * pct.min(100)) / 100).max(1) as u32
        }
    };
    Limits {
        slots: Some(n),
        max_failures,
    }
}

/// A node's failure, kept on its slot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The Shim generation the node failed to apply.
    pub generation: i64,
    /// The resume annotation's value then ("" if none).
    #[serde(default)]
    pub resume: String,
    pub reason: String,
}

/// Why nobody may take a slot now (its close mark, which outlives a release).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    /// Above N: deleted once free.
    Retired,
    /// The rollout halted (failures beyond maxFailures, or an extension's refusal).
    Halted,
    /// More nodes hold slots than N allows (N shrank): kept closed until the holders fit.
    Budget,
    /// A mark this build does not know (a newer coordinator's): closed all the same.
    Unknown,
}

impl Closed {
    /// The mark's wire text.
    pub fn as_str(self) -> &'static str {
        match self {
            Closed::Retired => "retired",
            Closed::Halted => "halted",
            Closed::Budget => "budget",
            Closed::Unknown => "closed",
        }
    }
}

impl From<&str> for Closed {
    fn from(s: &str) -> Closed {
        match s {
            "retired" => Closed::Retired,
            "halted" => Closed::Halted,
            "budget" => Closed::Budget,
            _ => Closed::Unknown,
        }
    }
}

/// A mark reads as its wire text (`slot.closed.as_deref() == Some("retired")`).
impl std::ops::Deref for Closed {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

/// A slot Lease as the coordinator and agents read it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Slot {
    pub index: u32,
    pub holder: Option<String>,
    /// The node the coordinator keeps it for next ([`SLOT_RESERVED_LABEL`]).
    pub reserved: Option<String>,
    pub failed: Option<Failure>,
    pub closed: Option<Closed>,
    /// N as the coordinator last stamped it (`None`: not stamped yet).
    pub count: Option<u32>,
    /// The nodes the Shim targeted as the coordinator last stamped them
    /// ([`crate::api::lease::SLOT_TARGETED`]).
    pub targeted: Option<u32>,
    pub resource_version: String,
}

impl Slot {
    pub fn is_free(&self) -> bool {
        self.holder.as_deref().unwrap_or_default().is_empty()
    }
    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }
}

/// A slot Lease of `shim` as a [`Slot`] (`None` for another Shim's, or a Lease that is no
/// slot). An unreadable failure mark still counts as a failure.
///
/// A Lease without this Shim's UID among its owners is not this one's: a Shim deleted and
/// created again under its name must not inherit the old one's holders, failures or closed
/// slots, which stay until the garbage collector removes them with their owner (or, held by
/// a node when the Shim went, until the coordinator deletes them: `orphan_slots`).
pub fn slot_of(shim: &Shim, lease: &ShimLease) -> Option<Slot> {
    let name = shim.metadata.name.as_deref()?;
    let labels = lease.metadata.labels.as_ref()?;
    if labels.get(SLOT_SHIM_LABEL).map(String::as_str) != Some(name) {
        return None;
    }
    if let Some(uid) = shim.metadata.uid.as_deref()
        && !owned_by_shim(lease, uid)
    {
        return None;
    }
    let index = slot_index(name, lease.metadata.name.as_deref()?)?;
    let ann = lease.metadata.annotations.as_ref();
    let failed = ann.and_then(|a| a.get(SLOT_FAILED)).map(|v| {
        serde_json::from_str(v).unwrap_or_else(|_| Failure {
            generation: -1,
            resume: String::new(),
            reason: v.clone(),
        })
    });
    Some(Slot {
        index,
        holder: lease.spec.holder_identity.clone().filter(|h| !h.is_empty()),
        reserved: labels
            .get(SLOT_RESERVED_LABEL)
            .filter(|r| !r.is_empty())
            .cloned(),
        failed,
        closed: ann
            .and_then(|a| a.get(SLOT_CLOSED))
            .map(|c| Closed::from(c.as_str())),
        count: ann
            .and_then(|a| a.get(SLOT_COUNT))
            .and_then(|c| c.parse().ok()),
        targeted: ann
            .and_then(|a| a.get(SLOT_TARGETED))
            .and_then(|c| c.parse().ok()),
        resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
    })
}

/// Whether `lease` names the Shim with `uid` among its owners.
fn owned_by_shim(lease: &ShimLease, uid: &str) -> bool {
    lease
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Shim" && o.uid == uid)
}

/// True when the Lease lists the Node `name` among its owners: a holder takes its slot with
/// its Node as an owner, and only the garbage collector removes it once that Node is gone.
pub fn owned_by_node(lease: &ShimLease, name: &str) -> bool {
    lease
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Node" && o.name == name)
}

/// The resume annotation's value on `shim`.
pub fn resume_token(shim: &Shim) -> String {
    shim.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESUME_ANNOTATION))
        .cloned()
        .unwrap_or_default()
}

/// Failures that count against maxFailures now: of this generation, since the last resume.
pub fn counted_failures<'a>(
    slots: &'a [Slot],
    generation: i64,
    resume: &'a str,
) -> impl Iterator<Item = &'a Slot> {
    slots.iter().filter(move |s| {
        !s.is_free()
            && s.failed
                .as_ref()
                .is_some_and(|f| f.generation == generation && f.resume == resume)
    })
}

/// True when the failures exceed maxFailures.
pub fn halted(slots: &[Slot], limits: Limits, generation: i64, resume: &str) -> bool {
    counted_failures(slots, generation, resume).count() as u32 > limits.max_failures
}

/// The slots a waiting node watches: the `k` highest by rendezvous hash of (node UID, Shim,
/// index) among `0..n` not in `skip` (slots held by failed nodes never come free by
/// themselves). Different nodes spread over different slots; a change of N moves few.
pub fn candidates(node_uid: &str, shim: &str, n: u32, k: usize, skip: &BTreeSet<u32>) -> Vec<u32> {
    let mut scored: Vec<(u64, u32)> = (0..n)
        .filter(|i| !skip.contains(i))
        .map(|i| (draw(&[node_uid, shim, &i.to_string()]), i))
        .collect();
    scored.sort_unstable_by(|a, b| b.cmp(a));
    scored.into_iter().take(k).map(|(_, i)| i).collect()
}

/// How long a node waits before claiming a free slot it saw: spread over `0..max` by a hash
/// of its UID and of the slot's version it saw free (`seen`, the slot's resourceVersion), so
/// the nodes watching one slot do not all write at once, and each hand-off draws anew. A delay
/// fixed per node made the nodes with the longest delays wait last, and the hand-offs slow
/// down as a rollout went on (the first claim came after half the window at mid-rollout).
pub fn claim_delay(node_uid: &str, shim: &str, seen: &str, max: Duration) -> Duration {
    spread(&[node_uid, shim, seen, "delay"], max)
}

/// What a node does with the slots of a Shim it needs one of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// It already holds this one (a restarted agent adopts its own slot).
    Adopt(u32),
    /// Take one of these free open slots, tried in this order: never empty. A node whose
    /// claim a rival won (a 409) tries the next: it then watches from its list's version,
    /// which brings only what changed after the list, so a free slot the list showed and
    /// nobody touched since would not come again.
    Take(Vec<u32>),
    /// Nothing to take: wait for a slot reserved for this node.
    Wait,
}

/// The claim of node `me` given the slots it sees: one it holds; else a free open slot
/// reserved for it; else, when `unreserved` (few rivals), the free open slots reserved for
/// nobody in `order` (this node's rendezvous order, so nodes claiming at once spread), after
/// its reserved one if it has one.
pub fn claim(me: &str, slots: &[Slot], order: &[u32], unreserved: bool) -> Claim {
    if let Some(s) = slots.iter().find(|s| s.holder.as_deref() == Some(me)) {
        return Claim::Adopt(s.index);
    }
    let takeable = |s: &&Slot| s.is_free() && s.is_open();
    let reserved = slots
        .iter()
        .filter(takeable)
        .find(|s| s.reserved.as_deref() == Some(me))
        .map(|s| s.index);
    let free = order
        .iter()
        .filter(|_| unreserved)
        .filter_map(|i| slots.iter().find(|s| s.index == *i))
        .filter(takeable)
        .filter(|s| s.reserved.is_none())
        .map(|s| s.index);
    let tries: Vec<u32> = reserved.into_iter().chain(free).collect();
    if tries.is_empty() {
        Claim::Wait
    } else {
        Claim::Take(tries)
    }
}

/// How long a free slot stays reserved for a node that does not claim it.
pub const CLAIM_WITHIN: Duration = Duration::from_secs(10);

/// Whether a Shim has few rivals per slot, so a free slot reserved for nobody is taken at
/// once rather than waited for: the nodes it targeted when the coordinator created its slots
/// (`targeted`, stamped on them) fit in its `n` slots, or are two at most (one 409 costs less
/// than a wait for the coordinator). Without it, 5000 nodes rushed 250 new slots at once.
/// Anything bigger waits for its reservation, which the coordinator makes within a round trip
/// of the node's state saying it waits; the Shim's status is not read (agents watch the
/// Shims' metadata only). The coordinator reserves nothing for a Shim with few rivals: a
/// reservation there only made a batch's nodes wait on each other (a node reserved a slot
/// of a later Shim while it still waited for an earlier one held by the other) until it ran
/// out.
pub fn few_rivals(n: u32, targeted: Option<u32>) -> bool {
    targeted.unwrap_or(0) <= n.max(2)
}

/// The nodes a slot's Shim targeted when the coordinator created it, as stamped on the slot.
pub fn slot_targeted(lease: &ShimLease) -> Option<u32> {
    use kube::ResourceExt;
    lease
        .annotations()
        .get(crate::api::lease::SLOT_TARGETED)?
        .parse()
        .ok()
}

/// [`few_rivals`] as a Shim's slots say it: N and the targeted nodes as the coordinator stamped
/// them (the largest of each), so the coordinator and every node decide alike from the same
/// objects (a node that counted the slots it listed, before all existed, waited for a
/// reservation the coordinator, counting N, would not make). No stamp: few.
pub fn slots_have_few_rivals<'l>(slots: impl IntoIterator<Item = &'l ShimLease>) -> bool {
    use kube::ResourceExt;
    let (mut n, mut targeted) = (None::<u32>, None::<u32>);
    for l in slots {
        let count = l.annotations().get(crate::api::lease::SLOT_COUNT);
        n = n.max(count.and_then(|c| c.parse().ok()));
        targeted = targeted.max(slot_targeted(l));
    }
    few_rivals(n.unwrap_or(1), targeted)
}

/// [`few_rivals`] as the slots say it: N and the targeted nodes as the coordinator stamped
/// them (the largest of each; slots not stamped yet count as N = 1), so the coordinator and
/// every node decide alike.
pub fn few_rivals_of(slots: &[Slot]) -> bool {
    let n = slots.iter().filter_map(|s| s.count).max();
    let targeted = slots.iter().filter_map(|s| s.targeted).max();
    few_rivals(n.unwrap_or(1), targeted)
}

#[cfg(test)]
#[path = "slots_tests.rs"]
pub(crate) mod tests;
