//! Taking a slot, for both ways of waiting for one (`contend.rs`, `hinted.rs`): what a list
//! of a Shim's slots showed, how a wait ended, the claim itself (a replace guarded by the version it saw), and what interrupts a wait (the
//! agent stops, or the wait for a first slot is superseded).

use std::time::Duration;

use kube::ResourceExt;
use kube::api::PostParams;

use super::{SlotGate, gone};
use crate::api::Shim;
use crate::api::lease::ShimLease;
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
            Err(e) => Err(super::api_failed(
                &e,
                format!("cannot take slot {} of {name}: {e}", taken.name_any()),
            )),
        }
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
