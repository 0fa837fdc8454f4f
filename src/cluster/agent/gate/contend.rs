//! Waiting for a slot and claiming it: the hand-off between the node that releases a slot and
//! the next one that takes it, which sets the pace of a rollout (a hand-off per restart per
//! slot).
//!
//! The coordinator keeps each open slot for the node that takes it next
//! ([`crate::cluster::reservations`]). A waiting node watches only the slots reserved for it
//! (`slot-of=<shim>,slot-reserved-for=<node>`, from the list's resourceVersion), so a hand-off
//! reaches the one node it is for, and that node claims the slot as soon as an event shows it
//! free and open: a replace guarded by the version it saw. Nobody else may take it (the
//! admission policy). A node reserved nothing yet receives no events at all.
//!
//! While a Shim has few rivals per slot (the nodes it targets fit in its N slots, or are two
//! at most), a node also takes a free slot reserved for nobody at once, from its list or from
//! a watch of all the Shim's slots (a new Shim's first slot created, a slot released), so a
//! small cluster does not wait for the coordinator. A watch that ends, the relist time or a
//! shutdown: back to the list.

use std::pin::pin;
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{PostParams, WatchEvent, WatchParams};

use super::{SlotGate, gone};
use crate::api::Shim;
use crate::api::lease::{SLOT_RESERVED_LABEL, ShimLease};
use crate::cluster::slots::{SLOT_SHIM_LABEL, claim_delay, slot_of};
use crate::txn::error::GateError;

/// How soon a node lists again when its watch did not start.
const RETRY_WATCH: Duration = Duration::from_secs(5);
/// At most how long a node waits before it lists again when its watch ended early (drawn per
/// node, Shim and list).
const AFTER_ENDED: Duration = Duration::from_secs(2);

/// `relist` ±25 %, drawn from the node's UID, the Shim and the list's resourceVersion.
fn relist_after(relist: Duration, node_uid: &str, shim: &str, listed: &str) -> Duration {
    relist * 3 / 4 + claim_delay(node_uid, shim, listed, relist / 2)
}

/// What one list of a Shim's slots showed.
pub struct Seen<'s> {
    /// The list's resourceVersion, where the watch starts.
    pub resource_version: &'s str,
    /// Few rivals: a free slot reserved for nobody may be taken at once.
    pub few_rivals: bool,
}

impl SlotGate<'_> {
    /// Until this node took a slot reserved for it (`Some`), or it must list the slots again
    /// (`None`).
    pub(super) async fn contend(
        &self,
        shim: &Shim,
        seen: Seen<'_>,
    ) -> Result<Option<ShimLease>, GateError> {
        let name = shim.name_any();
        let after = relist_after(
            self.timings.relist,
            &self.my_uid,
            &name,
            seen.resource_version,
        );
        // few rivals (a small cluster, a new Shim's first slots): watch all of the Shim's
        // slots and take the first free one, reserved for this node or for nobody, without
        // waiting for the coordinator; else only the slots reserved for this node
        let all = seen.few_rivals;
        let selector = if all {
            format!("{SLOT_SHIM_LABEL}={name}")
        } else {
            format!("{SLOT_SHIM_LABEL}={name},{SLOT_RESERVED_LABEL}={}", self.me)
        };
        // kube's client reads for 295 s at most
        let wp = WatchParams::default()
            .labels(&selector)
            .timeout(after.as_secs().clamp(1, 290) as u32);
        let mut events = match self.api.watch(&wp, seen.resource_version).await {
            Ok(s) => s.boxed(),
            Err(e) => {
                tracing::debug!(shim = %name, "cannot watch the slots: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(after.min(RETRY_WATCH)) => {}
                    _ = self.shut() => {}
                }
                return Ok(None);
            }
        };
        let mut relist = pin!(tokio::time::sleep(after));
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                        if !self.mine_to_take(shim, &l, all) {
                            continue;
                        }
                        // a rival was first: the watch brings what came next
                        if let Some(l) = self.claim(shim, l).await? {
                            return Ok(Some(l));
                        }
                    }
                    // the reservation moved to another node, or the slot went
                    Some(Ok(WatchEvent::Deleted(_) | WatchEvent::Bookmark(_))) => {}
                    // an error (a 410), or the API server ended the watch early (it closes
                    // the watches it cannot feed fast enough): list again, after a pause of
                    // this node's own, so a fleet whose watches ended together does not list
                    // together
                    _ => {
                        let pause = claim_delay(&self.my_uid, &name, seen.resource_version, AFTER_ENDED);
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = &mut relist => {}
                            _ = self.shut() => {}
                        }
                        return Ok(None);
                    }
                },
                _ = &mut relist => return Ok(None),
                _ = self.shut() => return Ok(None),
            }
        }
    }

    /// Whether `lease` is a slot of `shim` this node may take now: free, open, and reserved
    /// for it (or for nobody, with few rivals).
    fn mine_to_take(&self, shim: &Shim, lease: &ShimLease, few_rivals: bool) -> bool {
        let Some(s) = slot_of(shim, lease) else {
            return false;
        };
        let for_me = match s.reserved.as_deref() {
            Some(r) => r == self.me,
            None => few_rivals,
        };
        s.is_free() && s.is_open() && for_me
    }

    /// Take `lease`: `None` when another node was quicker (a 409), or it went (a 404).
    async fn claim(&self, shim: &Shim, lease: ShimLease) -> Result<Option<ShimLease>, GateError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_fleet_that_listed_together_lists_again_spread_over_half_the_interval() {
        let relist = Duration::from_secs(200);
        let after: Vec<Duration> = (0..1000)
            .map(|i| relist_after(relist, &format!("uid-{i}"), "wasm", "4711"))
            .collect();
        let (lo, hi) = (after.iter().min().unwrap(), after.iter().max().unwrap());
        assert!(*lo >= Duration::from_secs(150) && *hi < Duration::from_secs(250));
        assert!(*hi - *lo > Duration::from_secs(90), "{lo:?}..{hi:?}");
        // no second among the 100 holds more than a few percent of the fleet
        let mut per_second = BTreeMap::new();
        for a in &after {
            *per_second.entry(a.as_secs()).or_insert(0) += 1;
        }
        assert!(per_second.values().all(|n| *n < 40), "{per_second:?}");
        // the same node draws anew at its next list
        assert_ne!(
            relist_after(relist, "uid-1", "wasm", "4711"),
            relist_after(relist, "uid-1", "wasm", "4712")
        );
    }
}
