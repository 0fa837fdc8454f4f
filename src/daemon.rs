//! `shim-agent run` without a cluster: keep the node matching the static Shims in
//! `/etc/shim-agent/shims.d/*.yaml`, and repair drift.
//!
//! Each round is a pure diff ([`static_changes`]) of the desired Shims against the state,
//! handed to one live transaction ([`Node::apply_with`]), so every pending change shares
//! one containerd restart. A round runs at start, whenever a watched path changes
//! (`shims.d`, containerd's config directory and drop-in directory, the installed shims),
//! and every [`RESYNC_INTERVAL_SECS`] as a safety net.
//!
//! # Guarantees
//! - Drift is repaired: a removed handler or a deleted binary makes the Shim "changed"
//!   again (the live transaction only skips a Shim whose record, binary and handler are all
//!   there). A missing binary alone is put back without a restart (containerd's config did
//!   not change).
//! - Nothing is restarted when nothing the agent owns changed: unrelated file events lead
//!   to an empty diff.
//! - Static Shims, adoption and file watching: [`crate::statics`] (shared with the cluster
//!   agent).

use std::time::Duration;

use tokio::sync::mpsc;

use crate::api::Shim;
use crate::retry::Retries;
use crate::state::{NodeState, StateStore};
use crate::statics::{
    Adoption, FILE_SETTLE_MILLIS, read_static_shims, static_changes, watch, watched_paths,
};
use crate::txn::{HealthCheck, Node, Restarter};

/// The spec key of a static Shim being removed.
const UNINSTALL_KEY: &str = "uninstall";

/// Full re-check even without file events.
pub const RESYNC_INTERVAL_SECS: u64 = 300;

/// One round: read the static Shims, apply the difference. Returns the restarts it made.
pub async fn reconcile_once<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    store: &StateStore,
    state: &mut NodeState,
) -> anyhow::Result<u32> {
    reconcile(node, store, state, &mut Retries::default()).await
}

/// [`reconcile_once`] that remembers failures across rounds: a Shim that failed waits its
/// backoff (its change is left out of the round), and one the agent crashed on twice is set
/// aside until its spec changes ([`crate::crashes`]).
pub async fn reconcile<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    store: &StateStore,
    state: &mut NodeState,
    retries: &mut Retries,
) -> anyhow::Result<u32> {
    let dir = node.root.resolve(&node.settings.paths.static_shims_dir)?;
    let (desired, errors) = read_static_shims(&dir);
    for e in &errors {
        tracing::error!("ignoring a static Shim file until it is fixed: {e}");
    }
    let key_of = |name: &str| {
        Some(
            desired
                .iter()
                .find(|s| s.name() == name)
                .map_or_else(|| UNINSTALL_KEY.to_string(), Shim::spec_hash),
        )
    };
    let mut held = retries.held(tokio::time::Instant::now(), key_of);
    if crate::crashes::forget_stale(state, key_of) {
        store.save(state)?;
    }
    for name in crate::crashes::set_aside(state, key_of) {
        if let Some(rec) = state.crashes.get(&name) {
            tracing::error!(shim = %name, reason = crate::crashes::REASON, "{name}: {}", crate::crashes::message(rec));
        }
        held.insert(name);
    }
    let mut changes = static_changes(&desired, state, !errors.is_empty());
    changes.retain(|c| !held.contains(crate::txn::classify::change_name(c)));
    let work = crate::txn::real_work(&changes, state, &node.host_facts(state));
    let keys = work
        .iter()
        .filter_map(|n| Some((n.clone(), key_of(n)?)))
        .collect();
    if crate::crashes::begin(state, keys, crate::txn::record::now_secs()) {
        store.save(state)?;
    }
    for name in &work {
        failpoint(&format!("round::{name}"));
    }
    let result = node.apply_with(store, state, changes).await;
    let mut ended = crate::crashes::end(state);
    for name in &work {
        ended |= crate::crashes::forget(state, name);
    }
    if ended {
        store.save(state)?;
    }
    match result {
        Ok(report) => {
            for n in report.installed.iter().chain(&report.removed) {
                retries.succeeded(n);
            }
            if !report.installed.is_empty() || !report.removed.is_empty() {
                tracing::info!(installed = ?report.installed, removed = ?report.removed, restarts = report.restarts, "node reconciled");
            }
            Ok(report.restarts)
        }
        Err(e) => {
            let reason = e.reason();
            for name in &work {
                let key = key_of(name).unwrap_or_default();
                let pause = retries.failed(name, &key, reason, tokio::time::Instant::now());
                tracing::error!(shim = %name, %reason, retry_in_secs = pause.as_secs(), "{name}: change failed ({reason}), retrying in {} s: {e}", pause.as_secs());
            }
            Err(e.into())
        }
    }
}

fn failpoint(_name: &str) {
    fail::fail_point!(_name);
}

/// Run rounds until `shutdown` fires.
pub async fn run<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (store, mut state) = node.open_serving().await?;
    let crashed = crate::crashes::count(&mut state, crate::txn::record::now_secs());
    if !crashed.is_empty() {
        store.save(&state)?;
        tracing::error!(shims = ?crashed, "the agent stopped during a round working on {}: counted as a crash of each", crashed.join(", "));
    }
    let mut adoption = Adoption::default();
    adoption
        .run_if_due(&node.health, &store, &mut state)
        .await?;
    let (tx, mut events) = mpsc::channel::<()>(16);
    let _watcher = watch(&watched_paths(node), tx)?;
    crate::telemetry::ready();
    let mut retries = Retries::default();
    loop {
        adoption
            .run_if_due(&node.health, &store, &mut state)
            .await?;
        let failing = match reconcile(node, &store, &mut state, &mut retries).await {
            Ok(_) => Vec::new(),
            Err(e) => {
                tracing::error!("reconcile failed; retrying on the next change: {e:#}");
                vec!["static Shims (see the log)".to_string()]
            }
        };
        crate::telemetry::settled(state.shims.len(), failing);
        if let Err(e) = node.collect_retained(&store, &mut state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
        // while versions are retained, or a Shim waits its backoff, look again sooner than
        // the full re-check
        let next_retry = retries
            .failing()
            .values()
            .map(|f| {
                f.retry_at
                    .saturating_duration_since(tokio::time::Instant::now())
            })
            .min();
        let mut next = Duration::from_secs(if state.retained.is_empty() {
            RESYNC_INTERVAL_SECS
        } else {
            crate::txn::retain::RETAIN_CHECK_SECS
        });
        if let Some(r) = next_retry {
            next = next.min(r.max(Duration::from_millis(FILE_SETTLE_MILLIS)));
        }
        if let Some(a) = adoption.next_due() {
            let left = a.saturating_duration_since(tokio::time::Instant::now());
            next = next.min(left.max(Duration::from_millis(FILE_SETTLE_MILLIS)));
        }
        tokio::select! {
            _ = shutdown.changed() => return Ok(()),
            _ = events.recv() => {
                // let a burst of events settle, then drain it
                tokio::time::sleep(Duration::from_millis(FILE_SETTLE_MILLIS)).await;
                while events.try_recv().is_ok() {}
            }
            _ = tokio::time::sleep(next) => {}
        }
    }
}
