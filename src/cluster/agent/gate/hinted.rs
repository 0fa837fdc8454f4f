//! Waiting for the slot the coordinator reserved for this node, as its Node says
//! ([`crate::cluster::reservation_hints`]): the node watches that one slot, by name, and
//! claims it once an event shows it free, open and reserved for it.
//!
//! The API server's watch cache hands an event only to the watchers of that object's name, so
//! a hand-off reaches the node it is for and nobody else; a node that is reserved nothing
//! receives no slot event at all, only its own Node's events. The hint only says where to
//! look: the claim is made from the slot as the watch shows it, and the admission policy
//! checks the slot's reservation label, never the hint.

use std::pin::pin;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use kube::ResourceExt;
use kube::api::{WatchEvent, WatchParams};

use super::claim::{RETRY_WATCH, Seen, Waited};
use super::decide::{Watched, on_watched};
use super::slot_gate::{NodeHints, SlotGate};
use crate::api::Shim;
use crate::api::lease::ShimLease;
use crate::cluster::slots::{slot_name, slot_of};
use crate::txn::error::GateError;

type Events = BoxStream<'static, kube::Result<WatchEvent<ShimLease>>>;

impl SlotGate<'_> {
    /// Until this node took the slot reserved for it, or it must list again (`after`, a
    /// watch that does not start or ends early, a shutdown). The slot watched is the one the
    /// Node names, else the one the list showed reserved for this node, else none until the
    /// Node names one.
    pub(super) async fn wait_hinted(
        &self,
        shim: &Shim,
        seen: &Seen<'_>,
        hints: &NodeHints,
        after: Duration,
    ) -> Result<Waited, GateError> {
        let name = shim.name_any();
        let mut changes = hints.changes.clone();
        changes.mark_unchanged();
        let mut relist = pin!(tokio::time::sleep(after));
        loop {
            let target = hints.slot_of(&name).or(seen.reserved);
            // from the list, the slot it showed reserved for this node; any other from now
            // (`0`: its state first): from the list's version, a slot named minutes later
            // replayed every hand-off it had seen meanwhile, 298 events a node at 5000 nodes
            let from = if target.is_some() && target == seen.reserved {
                seen.resource_version
            } else {
                "0"
            };
            let mut events = match target {
                Some(i) => match self.watch_slot(&slot_name(&name, i), from, after).await {
                    Some(e) => Some(e),
                    None => {
                        tokio::select! {
                            _ = tokio::time::sleep(after.min(RETRY_WATCH)) => {}
                            _ = self.interrupted() => {}
                        }
                        return Ok(Waited::Relist);
                    }
                },
                None => None,
            };
            // until the hint moves (then watch the slot it names) or the watch brings a claim
            loop {
                tokio::select! {
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return Ok(Waited::Ended);
                        }
                        match hints.slot_of(&name).or(seen.reserved) {
                            now if now == target => {}
                            // the reservation moved away, or the Shim's nodes now take free
                            // slots at once: the slots as they are now
                            None => return Ok(Waited::Relist),
                            Some(_) => break,
                        }
                    }
                    ev = next(&mut events) => match ev {
                        Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                            let slot = slot_of(shim, &l);
                            if on_watched(&self.me, slot.as_ref(), false) == Watched::Take
                                && let Some(l) = self.claim(shim, l).await?
                            {
                                return Ok(Waited::Took(Box::new(l)));
                            }
                        }
                        Some(Ok(WatchEvent::Deleted(_) | WatchEvent::Bookmark(_))) => {}
                        _ => return Ok(Waited::Ended),
                    },
                    _ = &mut relist => return Ok(Waited::Relist),
                    _ = self.interrupted() => return Ok(Waited::Relist),
                }
            }
        }
    }

    /// A watch of the slot Lease `lease` alone, from resourceVersion `from` (`0`: its state
    /// now, then its changes), or `None` when it did not start.
    async fn watch_slot(&self, lease: &str, from: &str, after: Duration) -> Option<Events> {
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={lease}"))
            .timeout(after.as_secs().clamp(1, 290) as u32);
        match self.api.watch(&wp, from).await {
            Ok(s) => Some(s.boxed()),
            Err(e) => {
                tracing::debug!(slot = %lease, "cannot watch the slot: {e}");
                None
            }
        }
    }
}

/// The next event of `events`; never, without a watch.
async fn next(events: &mut Option<Events>) -> Option<kube::Result<WatchEvent<ShimLease>>> {
    match events {
        Some(e) => e.next().await,
        None => std::future::pending().await,
    }
}
