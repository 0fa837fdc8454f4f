//! The agent's memory between rounds, as one value with its rules, pure: which Shims failed and
//! when each may run again ([`Memory::held`]), how a failed round is judged (who is to blame,
//! or whether the batch runs one Shim at a time, or only waits for the API server: [`judge`]),
//! the solo retries, what was
//! already reported (blocked uninstalls, conflicts, set-aside Shims) and when the Node must be
//! written again.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::Shim;
use crate::cluster::nodestate::FailureNote;
use crate::cluster::target::NodePlan;
use crate::retry::backoff;
use crate::txn::Change;
use crate::txn::classify::change_name;

/// The spec key of a Shim being removed (no Shim object left to key it by).
pub const UNINSTALL_KEY: &str = "uninstall";

/// What a change is about: the Shim's UID and spec hash (a new spec retries at once).
pub fn spec_key(shim: &Shim) -> String {
    use kube::ResourceExt;
    format!("{}:{}", shim.uid().unwrap_or_default(), shim.spec_hash())
}

/// Retry of a Node write (label, annotation) that failed, e.g. while the API server is down.
pub const NODE_SYNC_RETRY_SECS: u64 = 5;

/// Longest pause of a change that waits for the API server (no slot could be had): it
/// doubles from one second up to this, drawn over its upper half per node.
pub const WAIT_MAX_SECS: u64 = 30;

/// A change that never began because the API server was away: no failure, a short pause.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Waiting {
    /// Waits in a row, for the pause's doubling.
    times: u32,
    /// When it may run again; `None` once that time came.
    retry_at: Option<Instant>,
}

/// A failing change and when to try it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub note: FailureNote,
    /// The spec it failed at (a new spec retries at once).
    pub spec_key: String,
    pub attempts: u32,
    /// When the change may run again; `None` once that time came (the note stays until the
    /// change succeeds or fails anew).
    pub retry_at: Option<Instant>,
}

/// What the agent remembers between rounds.
#[derive(Debug, Default)]
pub struct Memory {
    failures: BTreeMap<String, Failure>,
    /// Changes that wait for the API server (no failure: no Event, no note, no backoff).
    waiting: BTreeMap<String, Waiting>,
    /// Shims to run one at a time (a batch failed without naming its culprit, or crashed).
    solo: BTreeSet<String>,
    /// Blocked uninstalls and the pods that blocked them, as last reported.
    blocked_seen: BTreeMap<String, Vec<String>>,
    /// Static/cluster conflicts already reported.
    conflicts_seen: BTreeSet<String>,
    /// Shims set aside after crashes, already reported.
    aside_seen: BTreeSet<String>,
    /// When a Node write that failed is tried again.
    node_sync_due: Option<Instant>,
    node_sync_failures: u32,
    /// A change failed (or a batch was split): run the next round at once for the others.
    rerun_now: bool,
}

/// How a failed round is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// The agent stops: nothing was tried, nothing failed.
    Stopping,
    /// The Shims changed while the node waited for its first slot: nothing was tried,
    /// nothing failed; the node plans again at once.
    Replan,
    /// A batch failed without naming its culprit: run each change alone.
    RunAlone(Vec<String>),
    /// Nothing was tried: no rollout slot could be had while the API server was away or
    /// overloaded. These changes wait a little and try again; nobody failed.
    Wait(Vec<String>),
    /// These Shims failed.
    Blame(Vec<String>),
}

/// How a round's transaction ended without its changes, as far as blame goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The agent stops.
    Stopping,
    /// The wait for a first slot ended because the Shims changed.
    Superseded,
    /// No slot could be had while the API server was away or overloaded.
    OnlyWaits,
    /// Anything else: a change failed.
    Failed,
}

/// Who a failed round blames: nobody when the agent stops, when the Shims changed under its
/// wait for a slot, or when it only waits for the API server; else the one change, the Shims
/// the error names (`blamed`), or, for a batch that names none, each change alone next.
pub fn judge(work: &[String], blamed: &[String], ended: Ended) -> Judgement {
    match ended {
        Ended::Stopping => return Judgement::Stopping,
        Ended::Superseded => return Judgement::Replan,
        Ended::OnlyWaits => return Judgement::Wait(work.to_vec()),
        Ended::Failed => {}
    }
    let culprit: Vec<String> = match work {
        [one] => vec![one.clone()],
        many => many
            .iter()
            .filter(|n| blamed.contains(n))
            .cloned()
            .collect(),
    };
    if culprit.is_empty() && work.len() > 1 {
        return Judgement::RunAlone(work.to_vec());
    }
    Judgement::Blame(culprit)
}

impl Memory {
    /// The Shims that wait at `now` (their backoff not over).
    pub fn held(&self, now: Instant) -> BTreeSet<String> {
        let failing = self.failures.iter().map(|(n, f)| (n, f.retry_at));
        let waiting = self.waiting.iter().map(|(n, w)| (n, w.retry_at));
        failing
            .chain(waiting)
            .filter(|(_, at)| at.is_some_and(|t| t > now))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// Clear the backoffs that ran out by `now` (their notes stay), so no past retry time
    /// keeps the timer firing.
    pub fn expire(&mut self, now: Instant) {
        for f in self.failures.values_mut() {
            if f.retry_at.is_some_and(|t| t <= now) {
                f.retry_at = None;
            }
        }
        for w in self.waiting.values_mut() {
            if w.retry_at.is_some_and(|t| t <= now) {
                w.retry_at = None;
            }
        }
    }

    /// `names` wait for the API server from `now`; returns the pause: one second doubling per
    /// wait in a row up to [`WAIT_MAX_SECS`], drawn over its upper half by `node` (so a fleet
    /// turned away together does not come back together). No failure is recorded.
    pub fn wait(&mut self, names: &[String], node: &str, now: Instant) -> Duration {
        let times = names
            .iter()
            .filter_map(|n| self.waiting.get(n))
            .map(|w| w.times)
            .max()
            .unwrap_or(0)
            .saturating_add(1);
        let full = Duration::from_secs((1u64 << times.min(6).saturating_sub(1)).min(WAIT_MAX_SECS));
        let drawn = crate::cluster::slots::claim_delay(node, "wait", &times.to_string(), full / 2);
        let pause = full / 2 + drawn;
        for n in names {
            let retry_at = Some(now + pause);
            self.waiting.insert(n.clone(), Waiting { times, retry_at });
        }
        pause
    }

    /// Run each of `names` alone from the next round on, which comes at once.
    pub fn run_alone(&mut self, names: impl IntoIterator<Item = String>) {
        self.solo.extend(names);
        self.rerun_now = true;
    }

    /// Run the next round at once (a change failed: the others go on).
    pub fn rerun(&mut self) {
        self.rerun_now = true;
    }

    /// Whether the next round is due at once; asking clears it.
    pub fn take_rerun(&mut self) -> bool {
        std::mem::take(&mut self.rerun_now)
    }

    /// After a round: whether another must follow at once (a rerun asked for, or Shims still
    /// waiting to run alone); if so, it is asked for.
    pub fn wants_rerun(&mut self) -> bool {
        self.rerun_now = self.rerun_now || !self.solo.is_empty();
        self.rerun_now
    }

    /// `name` is set aside after crashes (`spec_key`, `attempts` crashes): a failure with
    /// `note` and no retry until its spec changes. True the first time (report it once).
    pub fn set_aside(
        &mut self,
        name: &str,
        note: FailureNote,
        spec_key: String,
        attempts: u32,
    ) -> bool {
        let failure = Failure {
            note,
            spec_key,
            attempts,
            retry_at: None,
        };
        self.failures.insert(name.to_string(), failure);
        self.aside_seen.insert(name.to_string())
    }

    /// Only `aside` are set aside now: the others are reported again if set aside anew.
    pub fn keep_aside_only(&mut self, aside: &BTreeSet<String>) {
        self.aside_seen.retain(|n| aside.contains(n));
    }

    /// The uninstalls blocked now, by their pods; returns those not reported before as they
    /// are now.
    pub fn blocked_now(
        &mut self,
        blocked: &BTreeMap<String, Vec<String>>,
    ) -> Vec<(String, Vec<String>)> {
        let new = blocked
            .iter()
            .filter(|(name, pods)| self.blocked_seen.get(*name) != Some(*pods))
            .map(|(n, p)| (n.clone(), p.clone()))
            .collect();
        self.blocked_seen = blocked.clone();
        new
    }

    /// A static/cluster conflict over `name` seen: true the first time (report it once).
    pub fn conflict_seen(&mut self, name: &str) -> bool {
        self.conflicts_seen.insert(name.to_string())
    }

    /// Only `conflicts` stand now: one that ends and comes back is reported again.
    pub fn keep_conflicts_only<'a>(&mut self, conflicts: impl IntoIterator<Item = &'a String>) {
        let now: BTreeSet<&String> = conflicts.into_iter().collect();
        self.conflicts_seen.retain(|n| now.contains(n));
    }

    /// Forget the failures of Shims whose spec changed (tried at once) or that are gone
    /// (except uninstalls, which are tried until they succeed).
    pub fn forget_stale(&mut self, cluster: &[Shim]) {
        self.failures
            .retain(|name, f| match cluster.iter().find(|s| s.name() == name) {
                Some(s) => f.spec_key == spec_key(s) || f.spec_key == UNINSTALL_KEY,
                None => f.spec_key == UNINSTALL_KEY,
            });
    }

    /// Record that `name` failed for `reason` now; returns the pause before its next try.
    pub fn failed(
        &mut self,
        name: &str,
        shim: Option<&Shim>,
        reason: &str,
        message: String,
        now: Instant,
    ) -> Duration {
        let key = shim.map(spec_key).unwrap_or_else(|| UNINSTALL_KEY.into());
        let attempts = self
            .failures
            .get(name)
            .filter(|f| f.spec_key == key)
            .map(|f| f.attempts + 1)
            .unwrap_or(1);
        let pause = backoff(attempts);
        self.failures.insert(
            name.to_string(),
            Failure {
                note: FailureNote {
                    reason: reason.to_string(),
                    message: crate::text::clip(&message, crate::text::MESSAGE_MAX_BYTES),
                    generation: shim.and_then(|s| s.metadata.generation),
                },
                spec_key: key,
                attempts,
                retry_at: Some(now + pause),
            },
        );
        pause
    }

    /// These Shims' changes ended well (or needed nothing): forget their failures.
    pub fn succeeded<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        for n in names {
            self.failures.remove(n);
            self.waiting.remove(n);
        }
    }

    /// After a batch failed without naming its culprit, keep only the first Shim of `work`
    /// that waits to run alone (and the changes that do no real work). When none of `work`
    /// waits to, the others are forgotten and the plan stays whole.
    pub fn restrict_to_solo(&mut self, plan: &mut NodePlan, work: &[String]) {
        if self.solo.is_empty() {
            return;
        }
        let Some(first) = work.iter().find(|n| self.solo.contains(*n)).cloned() else {
            self.solo.clear();
            return;
        };
        self.solo.remove(&first);
        plan.changes.retain(|c: &Change| {
            let n = change_name(c);
            n == first || !work.iter().any(|w| w == n)
        });
    }

    /// The next timer: a failure's retry, a Node write's retry, or `other` (the next check of
    /// retained versions, while there are any).
    pub fn next_due(&self, other: Option<Instant>) -> Option<Instant> {
        self.failures
            .values()
            .filter_map(|f| f.retry_at)
            .chain(self.waiting.values().filter_map(|w| w.retry_at))
            .chain(self.node_sync_due)
            .chain(other)
            .min()
    }

    /// A Node write failed: try again later, backing off.
    pub fn node_sync_failed(&mut self, now: Instant) {
        self.node_sync_failures += 1;
        let secs = (NODE_SYNC_RETRY_SECS << self.node_sync_failures.min(6)).min(60);
        self.node_sync_due = Some(now + Duration::from_secs(secs));
    }

    /// The Node is as the state says.
    pub fn node_synced(&mut self) {
        self.node_sync_due = None;
        self.node_sync_failures = 0;
    }

    /// The Shims whose last change failed (for the status line).
    pub fn failing(&self) -> Vec<String> {
        self.failures.keys().cloned().collect()
    }

    /// The failure notes, for the node's report.
    pub fn notes(&self) -> BTreeMap<String, FailureNote> {
        self.failures
            .iter()
            .map(|(n, f)| (n.clone(), f.note.clone()))
            .collect()
    }
}

#[cfg(test)]
#[path = "memory_tests.rs"]
mod tests;
