//! What a node remembers between rounds, pure, in both run modes: which Shims failed and when
//! each may run again ([`Memory::held`]), which wait for the API server, which run one at a
//! time after a batch failed without naming its culprit, which were set aside after crashes
//! (reported once), and whether the next round comes at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::Shim;
use crate::retry::{backoff, spread};
use crate::txn::Change;
use crate::txn::classify::change_name;

/// The spec key of a Shim being removed (no Shim object left to key it by).
pub const UNINSTALL_KEY: &str = "uninstall";

/// What a change is about: the Shim's UID (empty for a static Shim) and spec hash (a new spec
/// retries at once).
pub fn spec_key(shim: &Shim) -> String {
    use kube::ResourceExt;
    format!("{}:{}", shim.uid().unwrap_or_default(), shim.spec_hash())
}

/// The Shims a run mode wants on the node now, by name: the static ones of `shims.d`, and in a
/// cluster the cluster's too (a static Shim wins over the cluster's of its name).
#[derive(Debug, Default)]
pub struct Wanted<'a> {
    shims: BTreeMap<&'a str, &'a Shim>,
}

impl<'a> Wanted<'a> {
    /// The cluster's Shims (first) and the static ones, which win.
    pub fn new(cluster: &'a [Shim], statics: &'a [Shim]) -> Self {
        Self::of(cluster.iter().chain(statics))
    }

    /// These Shims, by name; of two with one name the later wins. The cluster agent passes
    /// only the cluster's Shims that target its node, then the static ones: a Shim that no
    /// longer targets the node is not wanted, and its change is an uninstall, as when its
    /// file leaves `shims.d`.
    pub fn of(shims: impl IntoIterator<Item = &'a Shim>) -> Self {
        let shims = shims.into_iter().map(|s| (s.name(), s)).collect();
        Wanted { shims }
    }

    /// The Shim wanted under `name`.
    pub fn get(&self, name: &str) -> Option<&'a Shim> {
        self.shims.get(name).copied()
    }

    /// The spec key `name`'s change is at: its Shim's, or [`UNINSTALL_KEY`] when none is
    /// wanted (the change removes it).
    pub fn key(&self, name: &str) -> String {
        change_key(self.get(name))
    }
}

/// The one key of a change: its Shim's [`spec_key`], or [`UNINSTALL_KEY`] when there is no
/// Shim (the change removes it).
fn change_key(shim: Option<&Shim>) -> String {
    shim.map_or_else(|| UNINSTALL_KEY.to_string(), spec_key)
}

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

/// A failed attempt the node remembers (and backs off on), as its report shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailureNote {
    pub reason: String,
    pub message: String,
    /// The Shim generation that failed.
    pub generation: Option<i64>,
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

/// What a node remembers between rounds.
#[derive(Debug, Default)]
pub struct Memory {
    failures: BTreeMap<String, Failure>,
    /// Changes that wait for the API server (no failure: no Event, no note, no backoff).
    waiting: BTreeMap<String, Waiting>,
    /// Shims to run one at a time (a batch failed without naming its culprit, or crashed).
    solo: BTreeSet<String>,
    /// Shims set aside after crashes, already reported.
    aside_seen: BTreeSet<String>,
    /// A change failed (or a batch was split): run the next round at once for the others.
    rerun_now: bool,
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
        let pause = full / 2 + spread(&[node, "wait", &times.to_string()], full / 2);
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

    /// Forget the failures of changes no longer wanted as they failed: a Shim whose spec
    /// changed, or that is gone (its uninstall is tried at once), or that came back after its
    /// uninstall failed. A failed uninstall is kept (and retried) while the Shim stays gone.
    pub fn forget_stale(&mut self, wanted: &Wanted<'_>) {
        self.failures
            .retain(|name, f| f.spec_key == wanted.key(name));
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
        let key = change_key(shim);
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
    /// waits to, the others are forgotten and the changes stay whole.
    pub fn restrict_to_solo(&mut self, changes: &mut Vec<Change>, work: &[String]) {
        if self.solo.is_empty() {
            return;
        }
        let Some(first) = work.iter().find(|n| self.solo.contains(*n)).cloned() else {
            self.solo.clear();
            return;
        };
        self.solo.remove(&first);
        changes.retain(|c: &Change| {
            let n = change_name(c);
            n == first || !work.iter().any(|w| w == n)
        });
    }

    /// The next timer: a failure's or a wait's retry, or `other` (the next check of retained
    /// versions, while there are any; a Node write's retry).
    pub fn next_due(&self, other: Option<Instant>) -> Option<Instant> {
        self.failures
            .values()
            .filter_map(|f| f.retry_at)
            .chain(self.waiting.values().filter_map(|w| w.retry_at))
            .chain(other)
            .min()
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
