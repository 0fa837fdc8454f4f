//! The one transaction engine: install, upgrade and uninstall with a containerd restart, CRI
//! verification and rollback (docs/design.md §3, §4), on a live node or in an image root.
//!
//! The shell around [`machine`](super::machine): every phase is journalled in the state store
//! before the side effect that follows it; the world is reached through two narrow ports,
//! [`Restarter`] and [`HealthCheck`] ([`ports`](super::ports)), so the same code runs against
//! the real node, the node-env test container, scripted fakes, and an image root (whose ports
//! restart nothing and record `pending-verification`).
//!
//! # Guarantees
//! - Fetch and verify of every artifact happen before anything on the host changes.
//! - Several changes go into one transaction: one restart for all of them.
//! - A restart whose job does not finish `done`, or a containerd that does not serve every
//!   expected handler afterwards, rolls the transaction back on the spot: backups restored,
//!   containerd restarted and checked again. If even that fails the journal stays open at
//!   `Broken` and the error says so.
//! - A failed transaction that was rolled back leaves nothing new behind: artifacts it
//!   fetched, directories it created and its backups go too.
//! - [`Node::recover`] finishes or undoes an interrupted transaction from the journal alone
//!   ([`recovery`](super::recovery)).
//! - Nothing is restarted when no change is needed.
//!
//! What every step shares (the [`Node`], the journal's one way forward, the failpoints):
//! [`host`](super::host).

use std::time::Instant;

use super::classify::{Change, Sorted, sort};
use super::error::{StepError, TxnError, TxnReason};
use super::files::{Undo, stage_backups};
use super::host::{Node, Report, Steps, failpoint};
use super::machine::Event;
use super::notices;
use super::ports::{Gate, HealthCheck, Restarter, Ungated};
use super::record::now_secs;
use crate::state::{Journal, NodeState, Phase, StateStore, TxnKind};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// Open the store and finish any interrupted transaction first; then collect the
    /// retained versions no task uses any more.
    pub async fn open(&self) -> anyhow::Result<(StateStore, NodeState)> {
        let (store, mut state) = self.open_unrecovered()?;
        self.recover(&store, &mut state).await?;
        self.collect_after(&store, &mut state);
        Ok((store, state))
    }

    /// Apply `changes` in one transaction (one restart).
    pub async fn apply(&self, changes: Vec<Change>) -> Result<Report, TxnError> {
        let (store, mut state) = self.open().await.map_err(TxnError::from_error)?;
        self.apply_with(&store, &mut state, changes).await
    }

    /// Like [`apply`](Self::apply) with an already open store.
    pub async fn apply_with(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        changes: Vec<Change>,
    ) -> Result<Report, TxnError> {
        self.apply_gated(store, state, changes, false, &Ungated)
            .await
    }

    /// Like [`apply_with`](Self::apply_with), with a progress bar on stderr for downloads
    /// when `progress`.
    pub async fn apply_showing(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        changes: Vec<Change>,
        progress: bool,
    ) -> Result<Report, TxnError> {
        self.apply_gated(store, state, changes, progress, &Ungated)
            .await
    }

    /// Like [`apply_with`](Self::apply_with), restarting containerd only while `gate` holds
    /// a rollout slot of every Shim the batch touches. A failure is the transaction's typed
    /// outcome ([`TxnError`]).
    pub async fn apply_gated<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        changes: Vec<Change>,
        progress: bool,
        gate: &G,
    ) -> Result<Report, TxnError> {
        let typed = TxnError::from_error;
        let mut report = Report::default();
        let t0 = Instant::now();
        let current = self.load_config().map_err(typed)?;
        let facts = self.host_facts_of(&current, state);
        let sorted = sort(changes, state, &facts, self.origin, &mut report.unchanged)?;
        let Sorted {
            installs,
            removes,
            repair,
        } = sorted;
        if installs.is_empty() && removes.is_empty() {
            return Ok(report);
        }
        if !installs.is_empty() {
            self.sandbox_ready(&installs).await?;
        }

        // Fetch and verify everything before the host changes.
        let names: Vec<String> = installs
            .iter()
            .map(|(s, _)| s.name().to_string())
            .chain(removes.iter().map(|r| r.name.clone()))
            .collect();
        notices::doing("fetching", &names);
        let mut undo = Undo::default();
        // Plan every config change on one evolving view of the files.
        let planned = match self.fetch_all(state, &installs, progress, &mut undo).await {
            Ok(p) => self.plan_all(current, &p, &removes).map(|plan| (p, plan)),
            Err(e) => Err(e),
        };
        let (prepared, plan) = match planned {
            Ok(p) => p,
            Err(e) => {
                undo.run();
                crate::telemetry::doing(None);
                return Err(typed(e));
            }
        };
        report.reached(Phase::Fetched, t0.elapsed());

        let steps = Steps {
            prepared: &prepared,
            removes: &removes,
            plan: &plan,
            repair: repair && removes.is_empty(),
        };
        let result = self
            .run(store, state, &steps, gate, &mut undo, &mut report)
            .await
            .map_err(typed);
        end_gate(gate, &result).await;
        // Rolled back (the journal is closed): what this run fetched and created goes too.
        // An open journal (Broken) keeps everything for the next recovery.
        if result.is_err() && state.journal.is_none() {
            undo.run();
        }
        if result.is_ok() {
            for (phase, took) in &report.phases {
                crate::telemetry::phase_took(&notices::phase_name(*phase), *took);
            }
        }
        result.map(|()| report)
    }

    /// The journalled steps of one transaction, from Planned to Committed.
    async fn run<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
        gate: &G,
        undo: &mut Undo,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let kind = self.plan_journal(store, state, steps)?;
        self.take_slots(store, state, steps, kind, gate).await?;
        let t = Instant::now();
        self.stage(store, state, steps, kind, undo)?;
        report.reached(Phase::Staged, t.elapsed());
        let t = Instant::now();
        if let Err(e) = self.apply_files(steps.prepared, steps.plan, undo) {
            return self
                .fail(store, state, StepError::text(format!("{e:#}")))
                .await;
        }
        self.event(store, state, Event::Applied)?;
        report.reached(Phase::Applied, t.elapsed());
        let t = Instant::now();
        self.restart_containerd(store, state, steps, gate, report)
            .await?;
        report.reached(Phase::Restarted, t.elapsed());
        let t = Instant::now();
        self.verify_served(store, state, steps).await?;
        report.reached(Phase::Verified, t.elapsed());
        let t = Instant::now();
        self.prove_journal(store, state).await?;
        report.reached(Phase::Proven, t.elapsed());
        let t = Instant::now();
        self.commit(store, state, report)?;
        report.reached(Phase::Committed, t.elapsed());
        Ok(())
    }

    /// Planned, then Fetched: the journal names the transaction's Shims before anything on the
    /// host changes.
    fn plan_journal(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
    ) -> anyhow::Result<TxnKind> {
        let Steps {
            prepared,
            removes,
            repair,
            ..
        } = *steps;
        let id = format!("{}-{}", now_secs(), std::process::id());
        let kind = match (prepared, removes) {
            ([], _) => TxnKind::Uninstall,
            (p, _) if p.iter().any(|x| x.previous.is_some()) => TxnKind::Upgrade,
            _ => TxnKind::Install,
        };
        let mut journal = Journal::planned(id, kind, steps.names());
        journal.pending = prepared.iter().map(|p| p.record.clone()).collect();
        journal.removing = removes.iter().map(|r| r.handler.clone()).collect();
        journal.repair = repair;
        state.journal = Some(journal);
        store.save(state)?;
        failpoint("txn::planned");
        self.event(store, state, Event::Fetched)?;
        Ok(kind)
    }

    /// SlotAcquired: a slot of every Shim in the batch before the host changes, when
    /// containerd will restart (the names in order, so two nodes never wait on each other's
    /// slots). Without one the transaction ends here, nothing changed.
    async fn take_slots<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
        kind: TxnKind,
        gate: &G,
    ) -> anyhow::Result<()> {
        if !steps.plan.is_empty() {
            let mut names = steps.names();
            names.sort();
            names.dedup();
            let waited = Instant::now();
            let acquired = gate.acquire(&names).await;
            let waited = waited.elapsed();
            tracing::debug!(waited_us = waited.as_micros() as u64, "the gate answered");
            crate::telemetry::slot_waited(waited);
            if let Err(e) = acquired {
                let message = format!("no rollout slot: {e}");
                self.abort(store, state, &message)?;
                notices::aborted(kind);
                let e = TxnError::new(TxnReason::NoSlot, message)
                    .at(Some(Phase::Fetched))
                    .refused_by_gate(e);
                return Err(e.into());
            }
            notices::doing("applying", &names);
        }
        self.event(store, state, Event::SlotAcquired)
    }

    /// Staged: a backup of every file the transaction touches; if that fails, the
    /// transaction ends with nothing changed.
    fn stage(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
        kind: TxnKind,
        undo: &mut Undo,
    ) -> anyhow::Result<()> {
        let mut touched: Vec<String> = steps
            .plan
            .changes
            .iter()
            .map(|c| c.host_path.display().to_string())
            .collect();
        touched.extend(steps.prepared.iter().map(|p| p.record.binary.clone()));
        let id = state
            .journal
            .as_ref()
            .map(|j| j.id.clone())
            .unwrap_or_default();
        let backups = match stage_backups(self.root, store.dir(), &id, &touched, undo) {
            Ok(b) => b,
            Err(e) => {
                self.abort(store, state, &format!("{e:#}"))?;
                notices::aborted(kind);
                return Err(e);
            }
        };
        if let Some(j) = state.journal.as_mut() {
            j.backups = backups;
        }
        self.event(store, state, Event::Staged)
    }
}

/// The transaction's slots when it ends: given back when it committed, and when the node cannot
/// run pods at all (not the Shim's failure: its rollout goes on); kept and marked failed
/// otherwise.
async fn end_gate<G: Gate>(gate: &G, result: &Result<(), TxnError>) {
    match result {
        Ok(()) => gate.release().await,
        Err(e) if e.reason == TxnReason::NodeCannotRunPods => gate.release().await,
        Err(e) => gate.failed(&e.message).await,
    }
}
