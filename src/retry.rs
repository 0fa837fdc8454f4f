//! When to try a failing Shim again: capped exponential backoff per Shim and spec, so a
//! Shim that keeps failing (a drift repair containerd refuses, a broken artifact) is not
//! retried in a loop, while a new spec is tried at once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// First retry after a failure; doubled per failure up to [`BACKOFF_MAX_SECS`].
pub const BACKOFF_BASE_SECS: u64 = 10;
/// Longest pause between attempts of a failing Shim.
pub const BACKOFF_MAX_SECS: u64 = 600;

/// The pause after the `attempts`-th failure in a row.
pub fn backoff(attempts: u32) -> Duration {
    let secs = BACKOFF_BASE_SECS.saturating_mul(1 << attempts.saturating_sub(1).min(10));
    Duration::from_secs(secs.min(BACKOFF_MAX_SECS))
}

/// A failing Shim: the spec it failed at, how often in a row, and until when it waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failing {
    pub spec_key: String,
    pub attempts: u32,
    pub retry_at: Instant,
    pub reason: String,
}

/// Which Shims failed, and when each may run again.
#[derive(Debug, Clone, Default)]
pub struct Retries {
    failing: BTreeMap<String, Failing>,
}

impl Retries {
    /// The Shims that wait now: failed at the spec `key_of` gives them, their pause not over.
    /// A Shim whose spec changed (or that is gone) is forgotten.
    pub fn held(
        &mut self,
        now: Instant,
        key_of: impl Fn(&str) -> Option<String>,
    ) -> BTreeSet<String> {
        self.failing
            .retain(|name, f| key_of(name).as_deref() == Some(&f.spec_key));
        self.failing
            .iter()
            .filter(|(_, f)| f.retry_at > now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// `name` failed at `spec_key` for `reason`; returns its pause.
    pub fn failed(&mut self, name: &str, spec_key: &str, reason: &str, now: Instant) -> Duration {
        let attempts = self
            .failing
            .get(name)
            .filter(|f| f.spec_key == spec_key)
            .map_or(1, |f| f.attempts + 1);
        let pause = backoff(attempts);
        self.failing.insert(
            name.to_string(),
            Failing {
                spec_key: spec_key.to_string(),
                attempts,
                retry_at: now + pause,
                reason: reason.to_string(),
            },
        );
        pause
    }

    /// `name` succeeded (or needs nothing).
    pub fn succeeded(&mut self, name: &str) {
        self.failing.remove(name);
    }

    /// The failing Shims by name.
    pub fn failing(&self) -> &BTreeMap<String, Failing> {
        &self.failing
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(10));
        assert_eq!(backoff(2), Duration::from_secs(20));
        assert_eq!(backoff(40), Duration::from_secs(BACKOFF_MAX_SECS));
    }

    #[test]
    fn a_failing_shim_waits_its_pause_and_a_new_spec_runs_at_once() {
        let t0 = Instant::now();
        let mut r = Retries::default();
        assert_eq!(
            r.failed("a", "k1", "DriftUnrepairable", t0),
            Duration::from_secs(10)
        );
        assert_eq!(
            r.failed("a", "k1", "DriftUnrepairable", t0),
            Duration::from_secs(20)
        );
        let same = |_: &str| Some("k1".to_string());
        assert_eq!(r.held(t0, same), BTreeSet::from(["a".to_string()]));
        assert!(r.held(t0 + Duration::from_secs(21), same).is_empty());
        assert!(r.held(t0, |_| Some("k2".into())).is_empty(), "a new spec");
        assert!(r.failing().is_empty());
        r.failed("b", "k", "x", t0);
        r.succeeded("b");
        assert!(r.failing().is_empty());
    }
}
