//! A batch's slots at once: when a transaction changes several Shims, the node lists all of
//! their slots in one request and claims a free open slot of each at the same time, instead of
//! one round trip after another.
//!
//! Deadlock freedom is that of ordered acquisition: the node keeps only the longest prefix
//! (in name order) of what it got and gives the rest back before it waits for anything, so a
//! node never waits while it holds a slot of a Shim after the one it waits for. A slot taken
//! out of order is held for a round trip or two (a second look at the gaps, on a new list)
//! and never waited on.
//!
//! The first Shim's slot is claimed alone, before the others: a node that does not get it
//! would keep none of them, so it writes nothing more. Two nodes that start one batch at the
//! same moment then race for one slot, not for each, and the loser leaves the rest to the
//! winner instead of taking half of them and giving them back (one round trip more for a
//! node alone).

use futures_util::future::join_all;
use kube::ResourceExt;

use super::decide;
use super::slot_gate::{SlotGate, api_failed, slots_listed_from_cache};
use crate::api::Shim;
use crate::api::lease::ShimLease;
use crate::cluster::lease_edits;
use crate::cluster::slots::{Claim, SLOT_SHIM_LABEL, slot_of};
use crate::txn::error::GateError;

impl<'a> SlotGate<'a> {
    /// Every slot of `shims`, in name order: the whole batch at once where free, else the
    /// longest prefix, then a wait for the first one missing, and again.
    pub(super) async fn acquire_in_order(&self, shims: &[String]) -> Result<(), GateError> {
        let mut needs = self.needs(shims);
        while let Some(first) = needs.first().copied() {
            if needs.len() > 1 {
                let got = self.try_all(&needs).await?;
                for (shim, lease) in needs.iter().zip(got.iter()) {
                    self.hold(shim, lease.clone());
                }
                needs.drain(..got.len());
                if needs.is_empty() {
                    break;
                }
            }
            let first = needs.first().copied().unwrap_or(first);
            let lease = self.acquire_one(first).await?;
            self.hold(first, lease);
            needs.remove(0);
        }
        Ok(())
    }

    /// Try every Shim of `needs` (in name order) at once; the slots of the longest prefix
    /// taken, in order (the others taken are given back).
    pub(super) async fn try_all(&self, needs: &[&'a Shim]) -> Result<Vec<ShimLease>, GateError> {
        let names: Vec<String> = needs.iter().map(|s| s.name_any()).collect();
        let lp = slots_listed_from_cache()
            .labels(&format!("{SLOT_SHIM_LABEL} in ({})", names.join(",")));
        let list = self.api.list(&lp).await.map_err(|e| {
            api_failed(
                &e,
                format!("cannot list the slots of {}: {e}", names.join(", ")),
            )
        })?;
        // the head alone first: a node that cannot have it keeps nothing after it, so it tries
        // nothing after it either (two nodes starting one batch together would otherwise
        // split its slots between them, and each give back its share)
        let Some((head, tail)) = needs.split_first() else {
            return Ok(Vec::new());
        };
        let Some(first) = self.try_one(head, &list.items).await else {
            return Ok(Vec::new());
        };
        let tries = tail.iter().map(|shim| self.try_one(shim, &list.items));
        let mut got: Vec<Option<ShimLease>> = std::iter::once(Some(first))
            .chain(join_all(tries).await)
            .collect();
        if gap_before_taken(&got) {
            self.second_look(needs, &mut got, &lp).await;
        }
        let prefix = got.iter().take_while(|g| g.is_some()).count();
        let (kept, rest) = got.split_at(prefix);
        let back = rest
            .iter()
            .flatten()
            .map(|l| self.write_own(l.clone(), |l| lease_edits::release(l, &self.me)));
        for r in join_all(back).await {
            if let Err(e) = r {
                tracing::warn!("cannot give back a slot taken out of order: {e}");
            }
        }
        Ok(kept.iter().flatten().cloned().collect())
    }

    /// The list came from the API server's watch cache, which can be a moment behind: a
    /// holder that releases a batch's slots all at once has some of them still shown held.
    /// Before the slots after such a gap go back (and are taken again once the wait for the
    /// gap ends: two writes each), the gaps are tried once more on a new list. The slots
    /// after the gap are held one round trip longer, never over a wait.
    async fn second_look(
        &self,
        needs: &[&'a Shim],
        got: &mut [Option<ShimLease>],
        lp: &kube::api::ListParams,
    ) {
        let Ok(list) = self.api.list(lp).await else {
            return;
        };
        let missing: Vec<usize> = (0..got.len()).filter(|&i| got[i].is_none()).collect();
        let tries = missing.iter().map(|&i| self.try_one(needs[i], &list.items));
        for (i, l) in missing.iter().zip(join_all(tries).await) {
            got[*i] = l;
        }
    }

    /// Take (or adopt) a free open slot of `shim` from `leases` at once; `None` when there is
    /// none or a rival was quicker.
    async fn try_one(&self, shim: &Shim, leases: &[ShimLease]) -> Option<ShimLease> {
        let name = shim.name_any();
        let slots: Vec<_> = leases.iter().filter_map(|l| slot_of(shim, l)).collect();
        let tries = match decide::after_list(&self.me, &self.my_uid, &name, &slots).claim {
            Claim::Adopt(i) => vec![i],
            Claim::Take(tries) => tries,
            Claim::Wait => return None,
        };
        // a rival first to one: the next
        for i in tries {
            match self.take_now(shim, i, leases).await {
                Ok(Some(l)) => return Some(l),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(shim = %name, slot = i, "cannot take the slot: {e}");
                    return None;
                }
            }
        }
        None
    }
}

/// Whether a slot is missing before one that was taken: the taken ones after it would go back.
pub(super) fn gap_before_taken<T>(got: &[Option<T>]) -> bool {
    let prefix = got.iter().take_while(|g| g.is_some()).count();
    got[prefix..].iter().any(Option::is_some)
}

#[cfg(test)]
mod tests {
    use super::gap_before_taken;

    #[test]
    fn only_a_gap_with_slots_taken_after_it_is_looked_at_again() {
        assert!(!gap_before_taken::<u8>(&[]));
        assert!(!gap_before_taken(&[Some(1), Some(2)]));
        assert!(!gap_before_taken(&[Some(1), None, None]));
        assert!(gap_before_taken(&[Some(1), None, Some(3)]));
        assert!(gap_before_taken(&[None, Some(2)]));
    }
}
