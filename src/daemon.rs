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
use tokio::time::Instant;

use crate::reconciler::judge::{Context, Verdict};
use crate::reconciler::memory::{Memory, Wanted};
use crate::reconciler::round::open_round;
use crate::state::{NodeState, StateStore};
use crate::statics::{
    Adoption, FILE_SETTLE_MILLIS, read_static_shims, static_changes, watch, watched_paths,
};
use crate::txn::classify::change_name;
use crate::txn::{HealthCheck, Node, Report, Restarter, TxnError};

/// Full re-check even without file events.
pub const RESYNC_INTERVAL_SECS: u64 = 300;

/// One round: read the static Shims, apply the difference. Returns the restarts it made.
pub async fn reconcile_once<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    store: &StateStore,
    state: &mut NodeState,
) -> anyhow::Result<u32> {
    reconcile(node, store, state, &mut Memory::default()).await
}

/// [`reconcile_once`] with the node's memory between rounds ([`crate::reconciler`], the same
/// as the cluster agent's): a Shim that failed waits its backoff (its change is left out of
/// the round), a batch that failed without naming its culprit runs one Shim at a time, and
/// one the agent crashed on twice is set aside until its spec changes.
pub async fn reconcile<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    store: &StateStore,
    state: &mut NodeState,
    memory: &mut Memory,
) -> anyhow::Result<u32> {
    let dir = node.root.resolve(&node.settings.paths.static_shims_dir)?;
    let (desired, errors) = read_static_shims(&dir);
    for e in &errors {
        tracing::error!("ignoring a static Shim file until it is fixed: {e}");
    }
    let wanted = Wanted::new(&[], &desired);
    let opened = open_round(memory, store, state, wanted, Instant::now());
    crate::telemetry::set_aside(opened.aside.names.len());
    for s in &opened.aside.new {
        let (name, reason) = (&s.name, crate::crashes::REASON);
        tracing::error!(shim = %name, %reason, "{name}: {}", s.note.message);
    }
    let mut changes = static_changes(&desired, state, !errors.is_empty());
    changes.retain(|c| !opened.held.contains(change_name(c)));
    let facts = node.host_facts(state);
    let planning = opened.planning;
    planning.cut_to_solo(memory, &mut changes, state, &facts);
    let mut begun = planning.begin(store, state, &changes, &facts);
    let outcome = begun.transact(node.apply_with(store, state, changes)).await;
    let cx = Context {
        stopping: false,
        node: "",
        now: Instant::now(),
    };
    let concluded = begun.conclude(memory, &outcome, cx);
    report(&concluded.verdict, &outcome);
    concluded.end(store, state);
    Ok(outcome?.restarts)
}

/// The journal's account of a round's verdict.
fn report(verdict: &Verdict, outcome: &Result<Report, TxnError>) {
    let (report, e) = match outcome {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e)),
    };
    let message = e.map(|e| e.message.as_str()).unwrap_or_default();
    match verdict {
        Verdict::Succeeded => {
            if let Some(r) = report.filter(|r| !r.installed.is_empty() || !r.removed.is_empty()) {
                tracing::info!(installed = ?r.installed, removed = ?r.removed, restarts = r.restarts, "node reconciled");
            }
        }
        Verdict::Failed(failed) => {
            let reason = e.map(|e| e.reason()).unwrap_or_default();
            for (name, pause) in failed {
                let secs = pause.as_secs();
                tracing::error!(shim = %name, %reason, retry_in_secs = secs, "{name}: change failed ({reason}), retrying in {secs} s: {message}");
            }
        }
        Verdict::RunAlone(_) => {
            tracing::warn!("a batch of changes failed; trying each alone: {message}")
        }
        Verdict::Wait { .. } | Verdict::Replan | Verdict::Stopping => {
            tracing::info!("no change was tried: {message}")
        }
    }
}

/// Run rounds until `shutdown` fires.
pub async fn run<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (store, mut state) = node.open_serving().await?;
    let mut memory = Memory::default();
    let crashed = memory.count_crashes(&store, &mut state);
    if !crashed.is_empty() {
        tracing::error!(shims = ?crashed, "the agent stopped during a round working on {}: counted as a crash of each", crashed.join(", "));
    }
    let mut adoption = Adoption::default();
    adoption
        .run_if_due(&node.health, &store, &mut state)
        .await?;
    let (tx, mut events) = mpsc::channel::<()>(16);
    let _watcher = watch(&watched_paths(node), tx)?;
    crate::telemetry::ready();
    loop {
        adoption
            .run_if_due(&node.health, &store, &mut state)
            .await?;
        if let Err(e) = reconcile(node, &store, &mut state, &mut memory).await {
            tracing::debug!("the round failed (reported above): {e:#}");
        }
        crate::telemetry::settled(state.shims.len(), memory.failing());
        if let Err(e) = node.collect_retained(&store, &mut state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
        if memory.wants_rerun() && memory.take_rerun() {
            continue; // a change failed or a batch was split: the others go on at once
        }
        // while versions are retained, or a Shim waits its backoff, look again sooner than
        // the full re-check
        let mut next = Duration::from_secs(if state.retained.is_empty() {
            RESYNC_INTERVAL_SECS
        } else {
            crate::txn::retain::RETAIN_CHECK_SECS
        });
        for due in memory.next_due(None).into_iter().chain(adoption.next_due()) {
            let left = due.saturating_duration_since(Instant::now());
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
