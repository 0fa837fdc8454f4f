//! Waiting for a free slot and claiming it: the hand-off between the node that releases a
//! slot and the next one that takes it, which sets the pace of a rollout (a hand-off per
//! restart per slot).
//!
//! The node keeps watching its candidate slots (by name, from the list's resourceVersion) and
//! keeps their latest versions from the events, so a hand-off costs it no request at all
//! unless it claims:
//! - a candidate seen free and open starts a claim timer, the delay drawn from the node's UID
//!   and the slot's version ([`claim_delay`]) over a window sized by the nodes still waiting
//!   on it ([`claim_window`]);
//! - an event showing it taken first cancels the timer; the first node whose timer fires
//!   claims with a replace guarded by the version it saw, and a 409 means a rival was first
//!   (the watch brings that version next);
//! - a candidate deleted, retired or kept by a failed node, N stamped differently from the N the candidates came
//!   from, a watch that ends, the relist time or a shutdown: back to the list.

use std::collections::BTreeMap;
use std::pin::pin;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::select_all;
use kube::ResourceExt;
use kube::api::{PostParams, WatchEvent, WatchParams};
use tokio::time::Instant;

use super::{GateTimings, SlotGate, gone};
use crate::api::Shim;
use crate::api::lease::{SLOT_TARGETED, ShimLease};
use crate::cluster::slots::{Closed, SLOT_SHIM_LABEL, claim_delay, slot_index, slot_name, slot_of};
use crate::txn::error::GateError;

/// How soon a node lists again when none of its watches started.
const RETRY_WATCH: Duration = Duration::from_secs(5);

/// The nodes targeted when `lease` was created, as the coordinator stamped them.
pub(super) fn targeted(lease: &ShimLease) -> Option<u32> {
    lease.annotations().get(SLOT_TARGETED)?.parse().ok()
}

/// `relist` ±25 %, drawn from the node's UID, the Shim and the list's resourceVersion.
fn relist_after(relist: Duration, node_uid: &str, shim: &str, listed: &str) -> Duration {
    relist * 3 / 4 + claim_delay(node_uid, shim, listed, relist / 2)
}

/// What one list of a Shim's slots showed.
pub struct Seen<'s> {
    /// N: the slots not retired.
    pub n: u32,
    /// This node's candidate slots.
    pub candidates: &'s [u32],
    /// The slot Leases listed.
    pub leases: &'s [ShimLease],
    /// The list's resourceVersion, where the watches start.
    pub resource_version: &'s str,
}

/// A candidate slot as this node last saw it.
struct Watched {
    lease: ShimLease,
    /// When its current version arrived (claim timers run from there).
    since: Instant,
    /// A claim of this version got a 409: wait for the next one.
    lost: bool,
}

/// This node's candidate slots as the list showed them.
fn candidates_seen(shim: &Shim, seen: &Seen<'_>) -> BTreeMap<u32, Watched> {
    let now = Instant::now();
    seen.leases
        .iter()
        .filter_map(|l| {
            let i = slot_of(shim, l)?.index;
            seen.candidates.contains(&i).then(|| {
                let watched = Watched {
                    lease: l.clone(),
                    since: now,
                    lost: false,
                };
                (i, watched)
            })
        })
        .collect()
}

/// What the node does with an event of a candidate slot.
enum Next {
    Keep,
    Relist,
}

impl SlotGate<'_> {
    /// Until this node took one of its candidate slots (`Some`), or it must list the slots
    /// again (`None`).
    pub(super) async fn contend(
        &self,
        shim: &Shim,
        seen: Seen<'_>,
    ) -> Result<Option<ShimLease>, GateError> {
        let after = self.relist_after(shim, &seen);
        let streams = self.watch_candidates(shim, &seen, after).await;
        // no watch started (the API server refused or failed): list again soon
        let wait = if streams.is_empty() {
            after.min(RETRY_WATCH)
        } else {
            after
        };
        let mut relist = pin!(tokio::time::sleep(wait));
        if streams.is_empty() || seen.candidates.is_empty() {
            let mut events = select_all(streams);
            tokio::select! {
                ev = events.next() => {
                    // a new Shim's first slot, created by the coordinator: take it from the
                    // event (a list and a watch less on the way to the label)
                    if let Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) = ev {
                        return self.claim_at_once(shim, l).await;
                    }
                }
                _ = &mut relist => {}
                _ = self.shut() => {}
            }
            return Ok(None);
        }
        let mut view = candidates_seen(shim, &seen);
        let mut events = select_all(streams);
        loop {
            let target = self.next_claim(shim, &seen, &view);
            let timer = async {
                match target {
                    Some((_, at)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = events.next() => {
                    let next = match ev {
                        Some(Ok(WatchEvent::Added(l) | WatchEvent::Modified(l))) => {
                            self.observe(shim, seen.n, &mut view, l)
                        }
                        Some(Ok(WatchEvent::Bookmark(_))) => Next::Keep,
                        // deleted, an error, or the watch ended
                        _ => Next::Relist,
                    };
                    if let Next::Relist = next {
                        return Ok(None);
                    }
                }
                _ = timer => {
                    let Some((i, _)) = target else { continue };
                    let Some(w) = view.get_mut(&i) else { continue };
                    if let Some(l) = self.claim(shim, i, w).await? {
                        return Ok(Some(l));
                    }
                }
                _ = &mut relist => return Ok(None),
                _ = self.shut() => return Ok(None),
            }
        }
    }

    /// Watches of this node's candidate slots; with no candidate yet (the coordinator has not
    /// created the slots, or a failed node holds every one), of all the Shim's slots, until
    /// one appears.
    /// When this wait ends and the slots are listed again: [`GateTimings::relist`] spread
    /// over ±25 % by a hash of the node and of the list's version, so a fleet that began
    /// waiting together does not list together again (5000 agents relisting every 30 s in
    /// step held one API server's two cores).
    fn relist_after(&self, shim: &Shim, seen: &Seen<'_>) -> Duration {
        relist_after(
            self.timings.relist,
            &self.my_uid,
            &shim.name_any(),
            seen.resource_version,
        )
    }

    async fn watch_candidates(
        &self,
        shim: &Shim,
        seen: &Seen<'_>,
        after: Duration,
    ) -> Vec<futures_util::stream::BoxStream<'static, kube::Result<WatchEvent<ShimLease>>>> {
        let name = shim.name_any();
        // kube's client reads for 295 s at most
        let secs = after.as_secs().clamp(1, 290) as u32;
        let params: Vec<WatchParams> = if seen.candidates.is_empty() {
            vec![
                WatchParams::default()
                    .labels(&format!("{SLOT_SHIM_LABEL}={name}"))
                    .timeout(secs),
            ]
        } else {
            seen.candidates
                .iter()
                .map(|i| {
                    WatchParams::default()
                        .fields(&format!("metadata.name={}", slot_name(&name, *i)))
                        .timeout(secs)
                })
                .collect()
        };
        let mut streams = Vec::new();
        for wp in &params {
            match self.api.watch(wp, seen.resource_version).await {
                Ok(s) => streams.push(s.boxed()),
                Err(e) => tracing::debug!(shim = %name, "cannot watch the slots: {e}"),
            }
        }
        streams
    }

    /// Take `lease` at once if it is a free open slot of `shim` (`None`: it is not, or a rival
    /// was quicker; the caller lists again).
    async fn claim_at_once(
        &self,
        shim: &Shim,
        lease: ShimLease,
    ) -> Result<Option<ShimLease>, GateError> {
        let Some(s) = slot_of(shim, &lease) else {
            return Ok(None);
        };
        // many rivals (a big fleet, by the nodes stamped on the slot): contend as usual
        let at_once = self.claims_at_once(shim, s.count.unwrap_or(1), targeted(&lease));
        if !s.is_free() || !s.is_open() || !at_once {
            return Ok(None);
        }
        let mut w = Watched {
            lease,
            since: Instant::now(),
            lost: false,
        };
        self.claim(shim, s.index, &mut w).await
    }

    /// The claim this node would make: the first free open candidate, and when (at once while
    /// the window is at its floor: a rival or two at most, and one 409 costs less than a wait).
    fn next_claim(
        &self,
        shim: &Shim,
        seen: &Seen<'_>,
        view: &BTreeMap<u32, Watched>,
    ) -> Option<(u32, Instant)> {
        let name = shim.name_any();
        seen.candidates.iter().find_map(|i| {
            let w = view.get(i)?;
            let s = slot_of(shim, &w.lease)?;
            (s.is_free() && s.is_open() && !w.lost).then(|| {
                if self.claims_at_once(shim, seen.n, targeted(&w.lease)) {
                    return (*i, w.since);
                }
                let window =
                    claim_window(&self.latest(shim), seen.n, targeted(&w.lease), self.timings);
                let at = w.since + claim_delay(&self.my_uid, &name, &s.resource_version, window);
                (*i, at)
            })
        })
    }

    /// Take candidate slot `i`: `None` when another node was quicker (a 409: wait for the
    /// slot's next version).
    async fn claim(
        &self,
        shim: &Shim,
        i: u32,
        w: &mut Watched,
    ) -> Result<Option<ShimLease>, GateError> {
        let name = shim.name_any();
        let taken = self.taken(w.lease.clone());
        match self
            .api
            .replace(&taken.name_any(), &PostParams::default(), &taken)
            .await
        {
            Ok(l) => {
                tracing::info!(shim = %name, slot = i, "took a rollout slot");
                Ok(Some(l))
            }
            Err(e) if gone(&e) => {
                w.lost = true;
                Ok(None)
            }
            Err(e) => Err(super::api_failed(
                &e,
                format!("cannot take slot {i} of {name}: {e}"),
            )),
        }
    }

    /// Keep the newer version of a candidate slot, or say the candidates must be chosen anew.
    fn observe(
        &self,
        shim: &Shim,
        n: u32,
        view: &mut BTreeMap<u32, Watched>,
        l: ShimLease,
    ) -> Next {
        let Some(s) = slot_of(shim, &l) else {
            return Next::Relist;
        };
        let retired = s.closed == Some(Closed::Retired);
        let n_changed = s.count.is_some_and(|c| c != n);
        // held by a failed node: it stays taken until the rollout moves on
        let failed = !s.is_free() && s.failed.is_some();
        if retired || n_changed || failed || slot_index(&shim.name_any(), &l.name_any()).is_none() {
            return Next::Relist;
        }
        let w = view.entry(s.index).or_insert_with(|| Watched {
            lease: l.clone(),
            since: Instant::now(),
            lost: false,
        });
        w.lease = l;
        w.since = Instant::now();
        w.lost = false;
        Next::Keep
    }

    /// Resolves once the agent shuts down (never without a shutdown signal).
    async fn shut(&self) {
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

/// The window claim delays are spread over: wide enough that the nodes waiting on one slot
/// are one `per_rival` apart, so the first claim lands about `per_rival` after a release and
/// before the next node tries; at least `claim_delay_max`, at most 30 s. The nodes waiting:
/// the Shim's nodes still to do, from its status as this node's watch last saw it (the
/// coordinator keeps it within seconds), spread over N slots and watched by `candidates`
/// nodes each (or all N when fewer). Before the Shim has a status, the nodes it targeted
/// when its slots were created (`targeted`, stamped on them): a window at its floor then
/// sent 5000 nodes at 250 new slots at once.
pub fn claim_window(shim: &Shim, n: u32, targeted: Option<u32>, t: GateTimings) -> Duration {
    let n = u64::from(n.max(1));
    let waiting = shim
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .map_or(u64::from(targeted.unwrap_or(0)), |c| {
            (c.targeted - c.installed - c.failed).max(0) as u64
        });
    let watchers = (t.candidates as u64).clamp(1, n);
    let per_slot = waiting.saturating_mul(watchers) / n;
    let per_slot = u32::try_from(per_slot).unwrap_or(u32::MAX);
    (t.per_rival.checked_mul(per_slot).unwrap_or(Duration::MAX))
        .clamp(t.claim_delay_max, Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

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
