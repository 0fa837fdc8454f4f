//! What the agent has told the cluster, pure: blocked uninstalls and static-vs-cluster
//! conflicts already reported (each reported again only once it changes; [`Reported`]), and
//! when a Node write that failed is tried again ([`NodeWrites`]). The decisions about
//! failures and retries are the reconciler core's ([`crate::reconciler`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

/// Retry of a Node write (label, annotation) that failed, e.g. while the API server is down.
pub const NODE_SYNC_RETRY_SECS: u64 = 5;

/// What the agent has reported in Events.
#[derive(Debug, Default)]
pub struct Reported {
    /// Blocked uninstalls and the pods that blocked them, as last reported.
    blocked_seen: BTreeMap<String, Vec<String>>,
    /// Static/cluster conflicts already reported.
    conflicts_seen: BTreeSet<String>,
}

/// The retry of the agent's Node writes (labels, annotation, condition).
#[derive(Debug, Default)]
pub struct NodeWrites {
    /// When a Node write that failed is tried again.
    node_sync_due: Option<Instant>,
    node_sync_failures: u32,
}

impl Reported {
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
}

impl NodeWrites {
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

    /// When a failed Node write is tried again.
    pub fn node_sync_due(&self) -> Option<Instant> {
        self.node_sync_due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_was_reported_is_reported_again_only_once_it_changes() {
        let mut m = Reported::default();
        let pods = |p: &[&str]| {
            BTreeMap::from([("a".to_string(), p.iter().map(|s| s.to_string()).collect())])
        };
        assert_eq!(m.blocked_now(&pods(&["p1"])).len(), 1);
        assert!(m.blocked_now(&pods(&["p1"])).is_empty());
        assert_eq!(m.blocked_now(&pods(&["p1", "p2"])).len(), 1);
        assert!(m.conflict_seen("s"));
        assert!(!m.conflict_seen("s"));
        m.keep_conflicts_only(&Vec::<String>::new());
        assert!(m.conflict_seen("s"), "a conflict that ended and came back");
    }

    #[test]
    fn node_writes_back_off_to_a_minute() {
        let mut m = NodeWrites::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            m.node_sync_failed(t0);
        }
        assert_eq!(m.node_sync_due, Some(t0 + Duration::from_secs(60)));
        m.node_synced();
        assert_eq!((m.node_sync_due, m.node_sync_failures), (None, 0));
    }
}
