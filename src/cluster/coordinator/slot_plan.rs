//! The coordinator's plan for a Shim's slot Leases (docs/design.md §5), pure: which to
//! create, close, open, free, retire, stamp and reserve, from the slots as read. The writes
//! themselves are [`super::slot_writes`]; what a slot is, and how a node claims one, is the
//! shared protocol in [`crate::cluster::slots`].

use std::collections::BTreeSet;

use crate::cluster::slots::{Closed, Limits, Slot};

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
    /// Keep the slot for `node` next (`None`: for nobody): [`crate::cluster::reservations`].
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

#[cfg(test)]
#[path = "slot_plan_tests.rs"]
mod tests;
