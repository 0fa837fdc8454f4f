//! The agent's rules of the rollout protocol (docs/design.md §5), as pure decisions over what
//! the node saw: what it does after one list of a Shim's slots, and with each slot a watch
//! brings it. The gate's loops (`mod.rs`, `batch.rs`, `contend.rs`, `hinted.rs`) only list,
//! watch and write; the coordinator's side is `coordinator/slot_plan.rs`.

use std::collections::BTreeSet;

use crate::cluster::slots::{Claim, Closed, Slot, candidates, claim, few_rivals_of};

/// What one list of a Shim's slots showed this node, and what it does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Adopt the slot it holds, take one now (in this order), or wait.
    pub claim: Claim,
    /// Whether a free slot reserved for nobody is taken at once (a small cluster, a new
    /// Shim's first slots), as the coordinator stamped the slots.
    pub few_rivals: bool,
    /// The open slot the coordinator reserved for this node, if any.
    pub reserved: Option<u32>,
}

/// The next step of node `me` (UID `my_uid`) that needs a slot of Shim `shim` and listed
/// `slots`: a slot it holds is adopted (an agent that restarted finds its own); a free open slot
/// reserved for it is taken, and with few rivals the free open slots reserved for nobody too,
/// in the node's rendezvous order (nodes claiming at once spread over them); else it waits.
/// Retired slots do not count in N, and slots held by failed nodes are never tried (they do
/// not come free by themselves).
pub fn after_list(me: &str, my_uid: &str, shim: &str, slots: &[Slot]) -> Listed {
    let n = slots
        .iter()
        .filter(|s| s.closed != Some(Closed::Retired))
        .count() as u32;
    let skip: BTreeSet<u32> = slots
        .iter()
        .filter(|s| !s.is_free() && s.failed.is_some())
        .map(|s| s.index)
        .collect();
    let order = candidates(my_uid, shim, n, n as usize, &skip);
    let few = few_rivals_of(slots);
    Listed {
        claim: claim(me, slots, &order, few),
        few_rivals: few,
        reserved: slots
            .iter()
            .find(|s| s.reserved.as_deref() == Some(me) && s.is_open())
            .map(|s| s.index),
    }
}

/// What a waiting node does with a slot a watch brought.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Claim it: free, open, and this node's (reserved for it, or for nobody while it takes
    /// unreserved slots), or held by it already (an adopt a write of the coordinator beat).
    Take,
    /// The coordinator restamped the slots (the fleet outgrew them): free slots reserved for
    /// nobody are no longer taken at once. List again, and wait for a reservation.
    Relist,
    /// Not this node's: wait on.
    Pass,
}

/// The step of node `me` for `slot` (`None`: no slot of the Shim it waits for) when it
/// waits `unreserved` (taking free slots reserved for nobody) or for its reservation.
pub fn on_watched(me: &str, slot: Option<&Slot>, unreserved: bool) -> Watched {
    let Some(s) = slot else {
        return Watched::Pass;
    };
    if unreserved && !few_rivals_of(std::slice::from_ref(s)) {
        return Watched::Relist;
    }
    match claim(me, std::slice::from_ref(s), &[s.index], unreserved) {
        Claim::Wait => Watched::Pass,
        Claim::Adopt(_) | Claim::Take(_) => Watched::Take,
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
