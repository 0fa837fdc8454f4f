//! Crash isolation in the agent's rounds ([`crate::crashes`]): the Shims a round works on are
//! recorded before its risky steps; a Shim the agent crashed on twice is set aside, reported
//! Failed with reason `AgentCrashed` (an Event once), until its spec changes.

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::runtime::events::EventType;
use std::collections::{BTreeMap, BTreeSet};

use super::Agent;
use super::memory::{UNINSTALL_KEY, spec_key};
use crate::api::Shim;
use crate::cluster::nodestate::FailureNote;
use crate::crashes;
use crate::state::{NodeState, StateStore};
use crate::txn::{HealthCheck, Restarter};

/// The spec key of `name` now: its cluster Shim's, or the uninstall key.
fn key_of(cluster: &[Shim], name: &str) -> String {
    cluster
        .iter()
        .find(|s| s.name() == name)
        .map(spec_key)
        .unwrap_or_else(|| UNINSTALL_KEY.into())
}

fn failpoint(_name: &str) {
    fail::fail_point!(_name);
}

fn save(store: &StateStore, state: &NodeState) {
    if let Err(e) = store.save(state) {
        tracing::warn!("cannot record the round's Shims for crash isolation: {e:#}");
    }
}

impl<R: Restarter, H: HealthCheck> Agent<'_, '_, R, H> {
    /// At start: a round the last process died in counts as a crash of its Shims; several
    /// are then run one at a time.
    pub(super) fn count_crash(&mut self, store: &StateStore, state: &mut NodeState) {
        let crashed = crashes::count(state, crate::txn::record::now_secs());
        if crashed.is_empty() {
            return;
        }
        save(store, state);
        tracing::error!(shims = ?crashed, "the agent stopped during a round working on {}: counted as a crash of each", crashed.join(", "));
        if crashed.len() > 1 {
            self.memory.run_alone(crashed);
        }
    }

    /// The Shims set aside now; each gets an `AgentCrashed` failure (and an Event, once).
    pub(super) fn set_aside(
        &mut self,
        store: &StateStore,
        state: &mut NodeState,
        cluster: &[Shim],
        node: &KubeNode,
    ) -> BTreeSet<String> {
        let current = |n: &str| Some(key_of(cluster, n));
        if crashes::forget_stale(state, current) {
            save(store, state);
        }
        let aside = crashes::set_aside(state, current);
        for name in &aside {
            let Some(rec) = state.crashes.get(name).cloned() else {
                continue;
            };
            let message = crashes::message(&rec);
            let note = FailureNote {
                reason: crashes::REASON.into(),
                message: message.clone(),
                generation: cluster
                    .iter()
                    .find(|s| s.name() == name)
                    .and_then(|s| s.metadata.generation),
            };
            if self
                .memory
                .set_aside(name, note, rec.spec_key.clone(), rec.crashes)
            {
                tracing::error!(shim = %name, reason = crashes::REASON, "{name}: {message}");
                self.emit(
                    cluster,
                    name,
                    node,
                    EventType::Warning,
                    crashes::REASON,
                    format!("{}: {message}", crashes::REASON),
                );
            }
        }
        self.memory.keep_aside_only(&aside);
        aside
    }

    /// Before the round's risky steps: record the Shims it works on.
    pub(super) fn begin_work(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        work: &[String],
        cluster: &[Shim],
    ) {
        let shims: BTreeMap<String, String> = work
            .iter()
            .map(|n| (n.clone(), key_of(cluster, n)))
            .collect();
        if crashes::begin(state, shims, crate::txn::record::now_secs()) {
            save(store, state);
        }
        // With the `failpoints` feature: `round::<shim>` fires inside that Shim's round.
        for name in work {
            failpoint(&format!("round::{name}"));
        }
    }

    /// The round ended: nothing crashed while it worked on `work`.
    pub(super) fn end_work(&self, store: &StateStore, state: &mut NodeState, work: &[String]) {
        let mut changed = crashes::end(state);
        for name in work {
            changed |= crashes::forget(state, name);
        }
        if changed {
            save(store, state);
        }
    }
}
