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

use futures_util::future::join_all;
use kube::ResourceExt;
use tokio::time::Instant;

use crate::cluster::lease_edits;
use crate::cluster::slots::{Failure, resume_token};
use crate::txn::Gate;
use crate::txn::error::GateError;

mod batch;
mod claim;
mod contend;
mod decide;
mod hinted;
mod slot_gate;

pub use slot_gate::{GateTimings, NodeHints, SlotGate};

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
