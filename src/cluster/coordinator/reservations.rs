//! Slot reservations (docs/design.md §5), the coordinator's rule, pure: which waiting node each open slot of a Shim is
//! kept for next, so that a hand-off reaches one node instead of every node waiting behind it.
//!
//! The coordinator labels each open slot, held or free, with the node that takes it next
//! (`containerd.x-k8s.io/slot-reserved-for`) and names it on that node's Node
//! (`cluster::reservation_hints`); the waiting node watches that one slot, by name, and
//! claims it once it is free, as it claims any slot (a node with no Node at hand, at start,
//! watches the slots reserved for it by label). Nobody
//! else may take a slot reserved for another node (the admission policy), and no node may
//! write the label.
//!
//! # Rules
//! - The waiting nodes are those whose state for the Shim says a change is under way
//!   (installing, upgrading, uninstalling), that hold none of its slots and held none in the
//!   last [`HELD_COOLDOWN`] (a node that just released still reports its old phase for a
//!   moment). They queue by how often a reservation passed them over, then by when their phase
//!   began, then by name: first come, first served.
//! - A slot may be reserved while it is open and not kept by a failed node. Each waiting node
//!   gets at most one reservation per Shim; a reservation stands while its node still waits
//!   and, once the slot is free, for at most [`CLAIM_WITHIN`]: a node that does not claim by
//!   then (still downloading, stopped, or waiting for an earlier Shim of its batch) is passed
//!   over and queues behind those never passed over. That expiry, on the coordinator's own
//!   monotonic clock, is also what breaks a wait across a batch's Shims.
//! - Slots left with no one to reserve them for are unreserved: any node may take them.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::cluster::slots::{CLAIM_WITHIN, Slot};

/// How long after the coordinator last saw a node hold a slot of a Shim it does not count as
/// waiting for another (its state may still show the phase it just finished).
pub const HELD_COOLDOWN: Duration = Duration::from_secs(15);

/// A node waiting for a slot of a Shim, as the coordinator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    pub node: String,
    /// When its phase began (RFC 3339: sorts as time).
    pub since: String,
    /// How often a reservation of this Shim expired on it.
    pub passed_over: u32,
}

/// One write of a reservation: slot `index` kept for `node` (`None`: for nobody).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    pub index: u32,
    pub node: Option<String>,
    pub resource_version: String,
}

/// The reservation writes for a Shim's `slots`, given the nodes `waiting` (unsorted), the
/// slots whose reservation `expired`, and the slots `untouched` (written otherwise this round,
/// or above N).
pub fn plan_reservations(
    slots: &[Slot],
    waiting: &[Waiter],
    expired: &BTreeSet<u32>,
    untouched: &BTreeSet<u32>,
) -> Vec<Reserve> {
    let holders: BTreeSet<&str> = slots.iter().filter_map(|s| s.holder.as_deref()).collect();
    let mut queue: Vec<&Waiter> = waiting
        .iter()
        .filter(|w| !holders.contains(w.node.as_str()))
        .collect();
    queue.sort_by(|a, b| {
        (a.passed_over, &a.since, &a.node).cmp(&(b.passed_over, &b.since, &b.node))
    });
    let waits = |n: &str| queue.iter().any(|w| w.node == n);
    let reservable = |s: &Slot| s.is_open() && !(s.holder.is_some() && s.failed.is_some());
    let mut slots: Vec<&Slot> = slots
        .iter()
        .filter(|s| !untouched.contains(&s.index))
        .collect();
    slots.sort_by_key(|s| s.index);
    // the reservations that stand, once per node
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    let mut standing: BTreeSet<u32> = BTreeSet::new();
    for s in &slots {
        if let Some(r) = s.reserved.as_deref()
            && reservable(s)
            && waits(r)
            && !expired.contains(&s.index)
            && kept.insert(r)
        {
            standing.insert(s.index);
        }
    }
    let mut next = queue.iter().filter(|w| !kept.contains(w.node.as_str()));
    let mut out = Vec::new();
    for s in slots.iter().filter(|s| !standing.contains(&s.index)) {
        let node = if reservable(s) {
            next.next().map(|w| w.node.clone())
        } else {
            None
        };
        if node != s.reserved {
            out.push(Reserve {
                index: s.index,
                node,
                resource_version: s.resource_version.clone(),
            });
        }
    }
    out
}

/// What the coordinator remembers of a Shim's reservations between rounds, on its own
/// monotonic clock: since when each free slot waits for the node it is reserved for, which
/// nodes a reservation passed over, and when each node last held a slot.
#[derive(Debug, Default)]
pub struct Reservations {
    /// Slot index -> (reserved node, free and reserved for it since).
    unclaimed: BTreeMap<u32, (String, Instant)>,
    passed_over: BTreeMap<String, u32>,
    held: BTreeMap<String, Instant>,
}

impl Reservations {
    /// Note the slots as read at `now`.
    pub fn observe(&mut self, slots: &[Slot], now: Instant) {
        for s in slots {
            if let Some(h) = &s.holder {
                self.held.insert(h.clone(), now);
            }
        }
        self.held
            .retain(|_, at| now.duration_since(*at) < HELD_COOLDOWN);
        let waiting_free: BTreeMap<u32, &str> = slots
            .iter()
            .filter(|s| s.holder.is_none() && s.is_open())
            .filter_map(|s| Some((s.index, s.reserved.as_deref()?)))
            .collect();
        self.unclaimed
            .retain(|i, (node, _)| waiting_free.get(i) == Some(&node.as_str()));
        for (i, node) in waiting_free {
            self.unclaimed
                .entry(i)
                .or_insert_with(|| (node.to_string(), now));
        }
    }

    /// The slots whose reservation ran out at `now`.
    pub fn expired(&self, now: Instant) -> BTreeSet<u32> {
        self.unclaimed
            .iter()
            .filter(|(_, (_, since))| now.duration_since(*since) >= CLAIM_WITHIN)
            .map(|(i, _)| *i)
            .collect()
    }

    /// The reservations of `expired` slots are being moved: their nodes were passed over.
    pub fn pass_over(&mut self, slots: &[Slot], expired: &BTreeSet<u32>) {
        for s in slots.iter().filter(|s| expired.contains(&s.index)) {
            if let Some(r) = &s.reserved {
                *self.passed_over.entry(r.clone()).or_default() += 1;
            }
            self.unclaimed.remove(&s.index);
        }
    }

    /// How often a reservation passed `node` over.
    pub fn passed_over(&self, node: &str) -> u32 {
        self.passed_over.get(node).copied().unwrap_or(0)
    }

    /// Whether `node` held a slot too recently to be waiting for another.
    pub fn held_recently(&self, node: &str) -> bool {
        self.held.contains_key(node)
    }

    /// When the next reservation runs out, or a node's cooldown ends (it may wait again).
    pub fn next_due(&self) -> Option<Instant> {
        let runs_out = self
            .unclaimed
            .values()
            .map(|(_, since)| *since + CLAIM_WITHIN);
        let cooled = self.held.values().map(|at| *at + HELD_COOLDOWN);
        runs_out.chain(cooled).min()
    }
}

#[cfg(test)]
#[path = "reservations_tests.rs"]
mod tests;
