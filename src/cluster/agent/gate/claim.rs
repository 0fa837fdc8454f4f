//! Taking a slot and writing one's own, for every way of getting one (`contend.rs`,
//! `hinted.rs`, `batch.rs`): what a list of a Shim's slots showed, how a wait ended, the claim
//! itself (a replace guarded by the version it saw), a take of a slot as listed, a write of a
//! slot this node holds, and what interrupts a wait (the agent stops, or the wait for a first
//! slot is superseded).

use std::time::Duration;

use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};

use super::slot_gate::{SlotGate, api_failed, gone};
use crate::api::Shim;
use crate::api::lease::ShimLease;
use crate::cluster::api_answer::ApiAnswer;
use crate::cluster::lease_edits;
use crate::cluster::slots::slot_of;
use crate::txn::error::GateError;

/// How soon a node lists again when its watch did not start.
pub(super) const RETRY_WATCH: Duration = Duration::from_secs(5);
/// How a wait for a slot ended.
pub enum Waited {
    /// This node took the slot.
    Took(Box<ShimLease>),
    /// The relist time came (or the watch could not start, or a shutdown): list again.
    Relist,
    /// The watch ended before its time (an error, or the API server closed it): list again
    /// after [`pause_after_ended`].
    Ended,
}

/// What one list of a Shim's slots showed.
pub struct Seen<'s> {
    /// The list's resourceVersion, where the watch starts.
    pub resource_version: &'s str,
    /// Few rivals: a free slot reserved for nobody may be taken at once.
    pub few_rivals: bool,
    /// The open slot the list showed reserved for this node (held: it waits for the release).
    pub reserved: Option<u32>,
}

impl SlotGate<'_> {
    /// Take `lease`: `None` when another node was quicker (a 409), or it went (a 404).
    pub(super) async fn claim(
        &self,
        shim: &Shim,
        lease: ShimLease,
    ) -> Result<Option<ShimLease>, GateError> {
        let name = shim.name_any();
        let taken = self.taken(lease);
        match self
            .api
            .replace(&taken.name_any(), &PostParams::default(), &taken)
            .await
        {
            Ok(l) => {
                tracing::info!(shim = %name, slot = %l.name_any(), "took a rollout slot");
                Ok(Some(l))
            }
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(api_failed(
                &e,
                format!("cannot take slot {} of {name}: {e}", taken.name_any()),
            )),
        }
    }

    /// Take (or renew, if this node holds it) slot `i` of `shim` as listed in `leases`; `None`
    /// when it moved meanwhile (a 409 or 404: list again).
    pub(super) async fn take_now(
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

    /// Write `edit` of this node's own slot `lease`: a JSON Patch that tests this node is the
    /// holder (the coordinator's reservation writes move the resourceVersion meanwhile); when
    /// the API server refuses it, a replace of the slot read again, while this node holds it.
    pub(super) async fn write_own(
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

    /// Until the agent stops, or the wait for the first slot is superseded
    /// ([`SlotGate::until_superseded`]): the caller lists again, and its loop says which.
    pub(super) async fn interrupted(&self) {
        let superseded = async {
            match self.superseded.clone() {
                Some(mut s) if self.held().is_empty() => {
                    if s.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.shut() => {}
            _ = superseded => {}
        }
    }

    /// Resolves once the agent shuts down (never without a shutdown signal).
    pub(super) async fn shut(&self) {
        match self.shutdown.clone() {
            Some(mut s) => {
                while !*s.borrow() {
                    if s.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
            None => std::future::pending().await,
        }
    }
}
