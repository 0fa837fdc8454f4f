//! The coordinator's rules of the rollout protocol (docs/design.md §5), pure: where a Shim's
//! rollout stands ([`rollout_of`]: its limits, its halt, the nodes waiting for a slot,
//! [`waiters`]); which slot Leases to create, close, open, free, retire, stamp and reserve,
//! from the slots as read ([`plan_slots`]); which writes go first ([`narrows`]); when a slot is
//! stamped again for a changed fleet ([`retarget`]); which Leases an earlier Shim of the name
//! left ([`orphan_slots`]). Who is reserved which slot is [`super::reservations`],
//! shared with the agent; the writes themselves are [`super::slot_writes`]; what a slot is, and
//! how a node claims one, is the shared protocol in [`crate::cluster::slots`].

use std::collections::BTreeSet;

use kube::ResourceExt;
use tokio::time::Instant;

use super::reservations::{Reservations, Waiter};
use super::status::NodeView;
use crate::api::Shim;
use crate::api::lease::ShimLease;
use crate::cluster::nodestate::NodePhase;
use crate::cluster::slots::{
    Closed, Limits, Slot, few_rivals, halted, limits, resume_token, slots_have_few_rivals,
};
use crate::cluster::target::targets;

/// One write the coordinator makes to a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlotAction {
    /// Create slot `index`, closed with this mark when `Some`.
    Create { index: u32, closed: Option<Closed> },
    /// Delete a free slot above the bound.
    Delete {
        index: u32,
        resource_version: String,
    },
    /// Set (Some) or clear (None) the close mark.
    Mark {
        index: u32,
        closed: Option<Closed>,
        resource_version: String,
    },
    /// Empty the holder (a deleted Node, or a stale holder) and clear its failure.
    Free {
        index: u32,
        resource_version: String,
    },
    /// Stamp the current N on a slot (every Create and Mark stamps it too).
    Stamp {
        index: u32,
        resource_version: String,
    },
    /// Keep the slot for `node` next (`None`: for nobody): [`super::reservations`].
    Reserve {
        index: u32,
        node: Option<String>,
        resource_version: String,
    },
}

impl SlotAction {
    /// The slot it writes.
    pub fn index(&self) -> u32 {
        match self {
            SlotAction::Create { index, .. }
            | SlotAction::Delete { index, .. }
            | SlotAction::Mark { index, .. }
            | SlotAction::Free { index, .. }
            | SlotAction::Stamp { index, .. }
            | SlotAction::Reserve { index, .. } => *index,
        }
    }
}

/// The coordinator's writes for a Shim's slots. `gone` says whether a holder is no longer a
/// Node (or, with a stale timeout, no longer renewing).
pub fn plan_slots(
    limits: Limits,
    halted: bool,
    slots: &[Slot],
    gone: impl Fn(&Slot) -> bool,
) -> Vec<SlotAction> {
    let mut out = Vec::new();
    let mut freed = BTreeSet::new();
    for s in slots.iter().filter(|s| !s.is_free() && gone(s)) {
        freed.insert(s.index);
        out.push(SlotAction::Free {
            index: s.index,
            resource_version: s.resource_version.clone(),
        });
    }
    let free = |s: &Slot| s.is_free() || freed.contains(&s.index);
    let n = limits.slots.unwrap_or(0);
    retire_above(n, slots, &free, &freed, &mut out);
    let held = slots.iter().filter(|s| !free(s)).count() as u32;
    let mut open = Opening {
        budget: if halted { 0 } else { n.saturating_sub(held) },
        halted,
    };
    for index in 0..n {
        match slots.iter().find(|s| s.index == index) {
            None => out.push(SlotAction::Create {
                index,
                closed: open.next(),
            }),
            // Freed this round: its new resourceVersion is not known yet; next round marks it.
            Some(s) if freed.contains(&s.index) => {}
            Some(s) if free(s) => mark(s, open.next(), &mut out),
            // Held: the holder finishes whatever the mark says, but the mark decides whether
            // the slot is open once released. Closed while halted, and while more nodes hold
            // slots than N allows (after N shrank), so no release lets a new node in.
            Some(s) => {
                let closed = if halted {
                    Some(Closed::Halted)
                } else if held > n {
                    Some(Closed::Budget)
                } else {
                    None
                };
                mark(s, closed, &mut out);
            }
        }
    }
    out
}

/// The slots at or above the bound N (or all, with no limit) are retired: deleted when free
/// (and not freed this round), marked retired while held.
fn retire_above(
    n: u32,
    slots: &[Slot],
    free: &impl Fn(&Slot) -> bool,
    freed: &BTreeSet<u32>,
    out: &mut Vec<SlotAction>,
) {
    for s in slots.iter().filter(|s| s.index >= n) {
        if free(s) {
            if !freed.contains(&s.index) {
                out.push(SlotAction::Delete {
                    index: s.index,
                    resource_version: s.resource_version.clone(),
                });
            }
        } else if s.closed != Some(Closed::Retired) {
            mark(s, Some(Closed::Retired), out);
        }
    }
}

/// How many free slots may open: the budget left, in slot order; the rest stay closed
/// (halted, or over the budget).
struct Opening {
    budget: u32,
    halted: bool,
}

impl Opening {
    /// The close mark of the next free slot.
    fn next(&mut self) -> Option<Closed> {
        if self.budget > 0 {
            self.budget -= 1;
            None
        } else if self.halted {
            Some(Closed::Halted)
        } else {
            Some(Closed::Budget)
        }
    }
}

/// Mark `s` closed as `closed` says, unless it is already.
fn mark(s: &Slot, closed: Option<Closed>, out: &mut Vec<SlotAction>) {
    if closed != s.closed {
        out.push(SlotAction::Mark {
            index: s.index,
            closed,
            resource_version: s.resource_version.clone(),
        });
    }
}

/// Stamps of N on the kept slots (below N) that show another N, or whose targeted nodes
/// `retarget(N, slot)` says to stamp again, and that `planned` does not already write: so the
/// nodes waiting on them see N change and choose their candidates again, without watching
/// every slot.
pub fn plan_stamps(
    limits: Limits,
    slots: &[Slot],
    planned: &[SlotAction],
    retarget: impl Fn(u32, &Slot) -> bool,
) -> Vec<SlotAction> {
    let Some(n) = limits.slots else {
        return Vec::new();
    };
    let written = |i: u32| planned.iter().any(|a| a.index() == i);
    let stale = |s: &Slot| s.count != Some(n) || retarget(n, s);
    slots
        .iter()
        .filter(|s| s.index < n && stale(s) && !written(s.index))
        .map(|s| SlotAction::Stamp {
            index: s.index,
            resource_version: s.resource_version.clone(),
        })
        .collect()
}

/// True for a write that takes capacity away (deletes or closes a slot). These go first, and
/// the others (stamps of the new N, openings, frees) only once all of them landed: a node
/// that claimed a slot above a shrunk N while the coordinator planned makes that slot's
/// delete fail, and a slot below N left open and stamped with the new N would then admit
/// one more holder than N allows (`tests/kube/fleet.rs` caught it). Without the stamps, the
/// open slots still show the old N, under which their claims were planned.
pub fn narrows(action: &SlotAction) -> bool {
    match action {
        SlotAction::Delete { .. } => true,
        SlotAction::Mark { closed, .. } => closed.is_some(),
        SlotAction::Create { .. }
        | SlotAction::Free { .. }
        | SlotAction::Stamp { .. }
        | SlotAction::Reserve { .. } => false,
    }
}

/// Whether `slot`'s targeted-nodes stamp must be written again for a Shim with `n` slots that
/// targets `targeted` nodes: the nodes read "few rivals" from it, so it is restamped when
/// that verdict changed (slots made before the coordinator's cache held the fleet, a fleet
/// that grew or shrank), not at every change of the count.
pub fn retarget(n: u32, slot: &Slot, targeted: u32) -> bool {
    few_rivals(n, slot.targeted) != few_rivals(n, Some(targeted))
}

/// The Leases labelled as slots of `shim` that no Shim owns: left by an earlier Shim of the
/// same name. A slot held when its Shim went keeps its holder's Node as an owner, so the
/// garbage collector only strips the Shim's reference, and the Lease blocks the slot's name
/// for a Shim created again under it. The coordinator deletes them. A Lease owned by another
/// UID is left to the garbage collector: this coordinator's Shim may be the stale one.
pub fn orphan_slots<'l>(
    shim: &Shim,
    leases: impl IntoIterator<Item = &'l ShimLease>,
) -> Vec<&'l ShimLease> {
    let Some(name) = shim.metadata.name.as_deref() else {
        return Vec::new();
    };
    leases
        .into_iter()
        .filter(|l| {
            l.metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(crate::cluster::slots::SLOT_SHIM_LABEL))
                .is_some_and(|v| v == name)
        })
        .filter(|l| !l.owner_references().iter().any(|o| o.kind == "Shim"))
        .collect()
}

/// Where a Shim's rollout stands, as [`rollout_of`] decides it: its limits, halt, slots, the
/// nodes waiting for one, and the Leases an earlier Shim of its name left.
pub struct Rollout {
    pub limits: Limits,
    /// The nodes the Shim selects.
    pub targeted: u32,
    pub halted: bool,
    pub slots: Vec<(Slot, ShimLease)>,
    /// The nodes waiting for a slot, and the slots whose reservation ran out.
    pub waiting: Vec<Waiter>,
    pub expired: BTreeSet<u32>,
    /// Leases left by an earlier Shim of this name ([`orphan_slots`]).
    pub orphans: Vec<ShimLease>,
}

/// The nodes waiting for a slot of `shim`: a change of it under way by their state (an
/// install or upgrade it still targets, an uninstall), and no slot held too recently.
pub fn waiters(shim: &Shim, nodes: &[NodeView], memory: &Reservations) -> Vec<Waiter> {
    let name = shim.name_any();
    nodes
        .iter()
        .filter_map(|n| {
            let st = n.states.get(&name)?;
            let changing = match st.phase {
                NodePhase::Installing | NodePhase::Upgrading => targets(shim, &n.labels),
                NodePhase::Uninstalling => true,
                _ => false,
            };
            (changing && !memory.held_recently(&n.name)).then(|| Waiter {
                node: n.name.clone(),
                since: st.since.clone(),
                passed_over: memory.passed_over(&n.name),
            })
        })
        .collect()
}

/// The rollout of `shim` now, from the Nodes, its slots with their Leases, and every slot
/// Lease (`all`, for those an earlier Shim of the name left); `memory` notes its slots and
/// passes over the nodes whose reservation ran out. With few rivals nobody waits: the nodes
/// take free slots at once, reserved for nobody.
pub fn rollout_of<'l>(
    shim: &Shim,
    nodes: &[NodeView],
    slots: Vec<(Slot, ShimLease)>,
    all: impl IntoIterator<Item = &'l ShimLease>,
    memory: &mut Reservations,
    now: Instant,
) -> Rollout {
    let targeted = nodes.iter().filter(|n| targets(shim, &n.labels)).count() as u32;
    let limits = limits(shim, targeted);
    let plain: Vec<Slot> = slots.iter().map(|(s, _)| s.clone()).collect();
    let halted = halted(
        &plain,
        limits,
        shim.metadata.generation.unwrap_or_default(),
        &resume_token(shim),
    );
    memory.observe(&plain, now);
    let expired = memory.expired(now);
    memory.pass_over(&plain, &expired);
    // few rivals: the nodes take free slots at once, reserved for nobody
    let few = slots_have_few_rivals(slots.iter().map(|(_, l)| l));
    let waiting = if few {
        Vec::new()
    } else {
        waiters(shim, nodes, memory)
    };
    let orphans = orphan_slots(shim, all).into_iter().cloned().collect();
    Rollout {
        limits,
        targeted,
        halted,
        slots,
        waiting,
        expired,
        orphans,
    }
}

#[cfg(test)]
#[path = "slot_plan_tests.rs"]
mod tests;
