//! Recovery: an interrupted transaction finished or undone from its journal alone (the
//! recovery table of [`machine`](super::machine)); a failed one is rolled back on the spot by
//! [`rollback`](super::rollback).

use anyhow::bail;

use super::error::{StepError, TxnError};
use super::files::restore_backups;
use super::host::{Node, Report};
use super::machine::{self, Event, Recovery};
use super::ports::{Gate, HealthCheck, Restarter, Ungated};
use crate::state::{Journal, NodeState, Phase, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// Roll an open journal forward or back (see the recovery table in `machine`).
    pub async fn recover(&self, store: &StateStore, state: &mut NodeState) -> Result<(), TxnError> {
        self.recover_gated(store, state, &Ungated).await
    }

    /// [`open`](Self::open) for a service: a transaction its recovery rolled back is logged
    /// and the service goes on ([`going_on_after`]).
    pub async fn open_serving(&self) -> anyhow::Result<(StateStore, NodeState)> {
        let (store, mut state) = self.open_unrecovered()?;
        let recovered = self.recover(&store, &mut state).await;
        going_on_after(recovered.map_err(anyhow::Error::from), &state)?;
        self.collect_after(&store, &mut state);
        Ok((store, state))
    }

    /// [`Node::recover`], where a restart of containerd needs the rollout slots of the
    /// journal's Shims, renewed right before it (the slot the node still holds from before
    /// it stopped is adopted). Without them nothing is restarted and the journal stays open
    /// for the next start. A journal recorded as restarted is checked first, without a slot,
    /// and its slots are taken only when the check fails, before the rollback restarts
    /// containerd. A journal rolled back counts as a failure (its slot stays, marked); one
    /// rolled forward releases its slot.
    pub async fn recover_gated<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        gate: &G,
    ) -> Result<(), TxnError> {
        // a check a crash interrupted left its sandbox: gone before anything is proven again
        self.sweep_leftover_checks().await;
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        let result = self.recover_journal(store, state, &j, gate).await;
        // Once the journal is closed, whatever the outcome, versions the state does not name
        // are retired (a journal still open needs its new files), and go once no task uses
        // them.
        if state.journal.is_none() {
            self.retire_strays(state);
            store
                .save(state)
                .map_err(|e| TxnError::from_error(e.into()))?;
            self.collect_after(store, state);
        }
        result.map_err(TxnError::from_error)
    }

    async fn recover_journal<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        j: &Journal,
        gate: &G,
    ) -> anyhow::Result<()> {
        let action = machine::recovery_for(j.phase, self.health.proves());
        tracing::warn!(txn = %j.id, phase = ?j.phase, ?action, "recovering an unfinished transaction");
        let restarts = matches!(
            action,
            Recovery::RollBackAndRestart | Recovery::RollForward(Phase::Applied)
        );
        if restarts {
            slot_for_restart(gate, j).await?;
        }
        // a check that fails after a restart rolls back with another: it takes the slot then
        let mut gated = restarts;
        let result = self
            .recover_action(store, state, j, action, gate, &mut gated)
            .await;
        if gated {
            match (&result, action) {
                (Ok(()), Recovery::RollForward(_)) => gate.release().await,
                (Ok(()), _) => {
                    let why = j.reason.clone().unwrap_or_else(|| "interrupted".into());
                    gate.failed(&format!(
                        "rolled back after the agent stopped mid-way: {why}"
                    ))
                    .await
                }
                (Err(e), _) => gate.failed(&format!("{e:#}")).await,
            }
        }
        result
    }

    async fn recover_action<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        j: &Journal,
        action: Recovery,
        gate: &G,
        gated: &mut bool,
    ) -> anyhow::Result<()> {
        match action {
            Recovery::Discard | Recovery::Close => self.close(store, state, j)?,
            Recovery::RollBackFiles => {
                // containerd was not restarted with the new files: they all go
                restore_backups(self.root, j, false)?;
                self.close(store, state, j)?;
            }
            Recovery::RollBackAndRestart => {
                let reason = j.reason.clone().unwrap_or_else(|| "interrupted".into());
                self.roll_back(store, state, reason, true).await?;
            }
            Recovery::RollForward(phase) => {
                self.roll_forward(store, state, j, phase, gate, gated)
                    .await?
            }
        }
        Ok(())
    }

    /// Finish a journal from `phase` on: restart, verify, prove, commit. A check that fails
    /// rolls back with a restart, under the journal's slots (taken then, when the recovery
    /// did not need them before).
    async fn roll_forward<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        j: &Journal,
        phase: Phase,
        gate: &G,
        gated: &mut bool,
    ) -> anyhow::Result<()> {
        if phase == Phase::Applied {
            if let Err(e) = self.restarter.restart(&self.profile.unit).await {
                return self.fail(store, state, e.into()).await;
            }
            self.event(store, state, Event::Restarted)?;
        }
        if matches!(phase, Phase::Applied | Phase::Restarted | Phase::Verified) {
            let mut checked = Ok(());
            if phase != Phase::Verified {
                checked = self.verify_journal(j).await.map_err(StepError::from);
                if checked.is_ok() {
                    self.event(store, state, Event::Verified)?;
                }
            }
            if checked.is_ok() {
                checked = self.prove_records(&j.pending).await;
            }
            if let Err(step) = checked {
                if !*gated {
                    // the rollback restarts containerd: not without the slot
                    slot_for_restart(gate, j).await?;
                    *gated = true;
                }
                return self.fail(store, state, step).await;
            }
            self.event(store, state, Event::Proven)?;
        }
        let mut report = Report::default();
        self.commit(store, state, &mut report)
    }
}

/// The rollout slots of `j`'s Shims, taken (the node's own still-held slot adopted) and
/// renewed right before a recovery restarts containerd; without them the recovery stops
/// there, nothing restarted, and the journal stays open for the next start.
async fn slot_for_restart<G: Gate>(gate: &G, j: &Journal) -> anyhow::Result<()> {
    let mut names = j.shims.clone();
    names.sort();
    names.dedup();
    let slot = match gate.acquire(&names).await {
        Ok(()) => gate.renew().await,
        Err(e) => Err(e),
    };
    if let Err(e) = slot {
        bail!(
            "recovering transaction {} needs a restart of containerd, and the rollout slot could not be renewed first: {e}; nothing was restarted, the journal stays open for the next start",
            j.id
        );
    }
    Ok(())
}

/// What a service makes of its recovery at start: a journal the recovery closed was rolled
/// back (the host is as it was before the change, the failure marked on its slots), so the
/// service goes on and logs why, and its rounds try the change again; a journal still open
/// (the rollback failed, or no slot for its restart) ends the start with the error.
pub fn going_on_after(recovered: anyhow::Result<()>, state: &NodeState) -> anyhow::Result<()> {
    match recovered {
        Err(e) if state.journal.is_none() => {
            tracing::error!(
                "recovering the transaction the last stop interrupted ended in an error; its journal is closed, so the agent goes on: {e:#}"
            );
            Ok(())
        }
        other => other,
    }
}
