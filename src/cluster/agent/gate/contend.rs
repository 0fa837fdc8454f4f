//! Waiting for a slot and claiming it: the hand-off between the node that releases a slot and
//! the next one that takes it, which sets the pace of a rollout (a hand-off per restart per
//! slot).
//!
//! The coordinator keeps each open slot for the node that takes it next
//! (the coordinator's `reservations`) and says which on the node's Node. A waiting node
//! watches only the slot its Node names, by name ([`super::hinted`]), so a hand-off reaches
//! the one node it is for, and that node claims the slot as soon as an event shows it free
//! and open: a replace guarded by the version it saw. Nobody else may take it (the admission
//! policy). A node reserved nothing yet receives no slot events at all. A gate with no Node
//! at hand watches the slots reserved for it by label
//! (`slot-of=<shim>,slot-reserved-for=<node>`), which the API server filters for every
//! watcher at every slot event.
//!
//! While a Shim has few rivals per slot (the nodes it targets fit in its N slots, or are two
//! at most), a node also takes a free slot reserved for nobody at once, from its list or from
//! a watch of all the Shim's slots (a new Shim's first slot created, a slot released), so a
//! small cluster does not wait for the coordinator. The relist time, or a shutdown: back to
//! the list; a watch that ends early: back to the list after a pause that grows with each
//! early end in a row ([`pause_after_ended`]).

use std::pin::pin;
use std::time::Duration;

use futures_util::StreamExt;
use kube::ResourceExt;
use kube::api::{WatchEvent, WatchParams};

use super::claim::{RETRY_WATCH, Seen, Waited};
use super::decide::{self, Watched, on_watched};
use super::slot_gate::{SlotGate, api_failed, slots_listed_from_cache};
use crate::api::Shim;
use crate::api::lease::{SLOT_RESERVED_LABEL, ShimLease};
use crate::cluster::slots::{Claim, SLOT_SHIM_LABEL, claim_delay, slot_of};
use crate::txn::error::GateError;

/// The pause before a node lists again after its watch ended early: the first time, and the
/// most, doubled at each early end in a row (as client-go's reflectors back off), and below
/// the time a reservation waits for its node to claim it
/// ([`crate::cluster::slots::CLAIM_WITHIN`]).
const ENDED_FIRST: Duration = Duration::from_millis(500);
const ENDED_MOST: Duration = Duration::from_secs(8);

/// The pause before the list that follows the `times`-th early end of a watch in a row:
/// [`ENDED_FIRST`] doubled each time up to [`ENDED_MOST`], each drawn in its upper half from
/// the node's UID, the Shim and the list's resourceVersion, so a fleet whose watches the API
/// server closed together neither lists together nor as fast as they fail.
pub fn pause_after_ended(times: u32, node_uid: &str, shim: &str, listed: &str) -> Duration {
    let full = ENDED_FIRST
        .saturating_mul(1u32 << times.saturating_sub(1).min(16))
        .min(ENDED_MOST);
    full / 2 + claim_delay(node_uid, shim, listed, full / 2)
}

/// `relist` ±25 %, drawn from the node's UID, the Shim and the list's resourceVersion.
fn relist_after(relist: Duration, node_uid: &str, shim: &str, listed: &str) -> Duration {
    relist * 3 / 4 + claim_delay(node_uid, shim, listed, relist / 2)
}

impl SlotGate<'_> {
    /// A slot of `shim`: one list, a take at once where the rules allow one, else a wait
    /// ([`SlotGate::contend`]), and again until a slot is taken (or the wait is interrupted).
    pub(super) async fn acquire_one(&self, shim: &Shim) -> Result<ShimLease, GateError> {
        let name = shim.name_any();
        let lp = slots_listed_from_cache().labels(&format!("{SLOT_SHIM_LABEL}={name}"));
        // the watches in a row that ended early
        let mut ended = 0;
        loop {
            if self.shutting_down() {
                return Err(GateError::ShuttingDown);
            }
            if self.is_superseded() {
                return Err(GateError::Superseded);
            }
            let list = self
                .api
                .list(&lp)
                .await
                .map_err(|e| api_failed(&e, format!("cannot list the slots of {name}: {e}")))?;
            let rv = list.metadata.resource_version.clone().unwrap_or_default();
            let leases: Vec<ShimLease> = list.items;
            let slots: Vec<_> = leases.iter().filter_map(|l| slot_of(shim, l)).collect();
            let listed = decide::after_list(&self.me, &self.my_uid, &name, &slots);
            let at_once = match listed.claim {
                Claim::Adopt(i) => {
                    tracing::info!(shim = %name, slot = i, "adopting the slot this node holds");
                    vec![i]
                }
                // reserved for this node, or few rivals: take one now, the next when a
                // rival was first to one (the watch below brings no slot left as listed)
                Claim::Take(tries) => tries,
                Claim::Wait => Vec::new(),
            };
            // a rival was first to each, or the list was behind: the watch from the list's
            // version brings what changed, where a list again could show the same
            for i in at_once {
                if let Some(l) = self.take_now(shim, i, &leases).await? {
                    return Ok(l);
                }
            }
            crate::telemetry::doing(Some(format!("waiting for a slot for {name}")));
            let seen = Seen {
                resource_version: &rv,
                few_rivals: listed.few_rivals,
                reserved: listed.reserved,
            };
            match self.contend(shim, seen).await? {
                Waited::Took(l) => return Ok(*l),
                Waited::Relist => ended = 0,
                Waited::Ended => {
                    ended += 1;
                    let pause = pause_after_ended(ended, &self.my_uid, &name, &rv);
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = self.interrupted() => {}
                    }
                }
            }
        }
    }

    /// Until this node took a slot reserved for it, or it must list the slots again.
    pub(super) async fn contend(&self, shim: &Shim, seen: Seen<'_>) -> Result<Waited, GateError> {
        let name = shim.name_any();
        let after = relist_after(
            self.timings.relist,
            &self.my_uid,
            &name,
            seen.resource_version,
        );
        // many rivals, and this node's Node at hand: the slot it names alone
        if !seen.few_rivals
            && let Some(hints) = &self.hints
        {
            return self.wait_hinted(shim, &seen, hints, after).await;
        }
        // few rivals (a small cluster, a new Shim's first slots): watch all of the Shim's
        // slots and take the first free one, reserved for this node or for nobody, without
        // waiting for the coordinator; else (no Node at hand: a recovery at start) the slots
        // reserved for this node, by label
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
                    _ = self.interrupted() => {}
                }
                return Ok(Waited::Relist);
            }
        };
        let mut relist = pin!(tokio::time::sleep(after));
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                        match on_watched(&self.me, slot_of(shim, &l).as_ref(), all) {
                            Watched::Take => {}
                            Watched::Relist => return Ok(Waited::Relist),
                            Watched::Pass => continue,
                        }
                        // a rival was first: the watch brings what came next
                        if let Some(l) = self.claim(shim, l).await? {
                            return Ok(Waited::Took(Box::new(l)));
                        }
                    }
                    // the reservation moved to another node, or the slot went
                    Some(Ok(WatchEvent::Deleted(_) | WatchEvent::Bookmark(_))) => {}
                    // an error (a 410), or the API server ended the watch early (it closes
                    // the watches it cannot feed fast enough)
                    _ => return Ok(Waited::Ended),
                },
                _ = &mut relist => return Ok(Waited::Relist),
                _ = self.interrupted() => return Ok(Waited::Relist),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_watch_that_keeps_ending_early_backs_off_to_a_bound_and_spreads_the_fleet() {
        let p = |times| pause_after_ended(times, "uid-1", "wasm", "4711");
        assert!(p(1) >= ENDED_FIRST / 2 && p(1) < ENDED_FIRST, "{:?}", p(1));
        assert!(p(2) >= ENDED_FIRST && p(2) < ENDED_FIRST * 2, "{:?}", p(2));
        for times in [5, 6, 40, u32::MAX] {
            assert!(
                p(times) >= ENDED_MOST / 2 && p(times) < ENDED_MOST,
                "{:?}",
                p(times)
            );
        }
        // below the time a reservation waits for its node
        assert!(ENDED_MOST < crate::cluster::slots::CLAIM_WITHIN);
        // a thousand nodes closed together: spread over the upper half of the pause
        let after: Vec<Duration> = (0..1000)
            .map(|i| pause_after_ended(3, &format!("uid-{i}"), "wasm", "4711"))
            .collect();
        let (lo, hi) = (after.iter().min().unwrap(), after.iter().max().unwrap());
        assert!(*hi - *lo > Duration::from_millis(900), "{lo:?}..{hi:?}");
    }

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
