//! Rollback: a step failed, so it is journalled, the files go back and, when containerd was
//! (or may have been) restarted with them, containerd is restarted and checked to serve what
//! it served before; the typed [`TxnError`] says what failed and whom it blames.

use super::error::{StepError, TxnError, TxnReason};
use super::files::restore_backups;
use super::host::{Node, failpoint};
use super::machine::Event;
use super::ports::{HealthCheck, Restarter};
use crate::state::{Journal, NodeState, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// A step failed: journal it, roll back, and return the error.
    pub(super) async fn fail(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: StepError,
    ) -> anyhow::Result<()> {
        self.fail_with(store, state, reason, true).await
    }

    /// A step before the restart failed (or the rollout slot was lost): containerd still runs
    /// the old config, so the files are put back and nothing is restarted.
    pub(super) async fn fail_unrestarted(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: StepError,
    ) -> anyhow::Result<()> {
        self.fail_with(store, state, reason, false).await
    }

    async fn fail_with(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        step: StepError,
        restart: bool,
    ) -> anyhow::Result<()> {
        let reason = step.message;
        let repair = state.journal.as_ref().is_some_and(|j| j.repair);
        let phase = state.journal.as_ref().map(|j| j.phase);
        if let Some(j) = &state.journal {
            super::notices::failed(j, state, &reason);
        }
        self.event(
            store,
            state,
            Event::Failed {
                reason: reason.clone(),
            },
        )?;
        self.roll_back(store, state, reason.clone(), restart)
            .await
            .map_err(|e| match e.downcast::<TxnError>() {
                Ok(t) => t.at(phase).caused_by(step.reason).into(),
                Err(e) => e,
            })?;
        let message = if restart {
            format!("{reason}; rolled back: containerd runs the previous configuration")
        } else {
            format!(
                "{reason}; rolled back without a restart: containerd runs the previous configuration"
            )
        };
        let why = match (repair, &step.check_failed) {
            (true, _) => TxnReason::DriftUnrepairable,
            (false, Some(_)) if step.cannot_run_pods => TxnReason::NodeCannotRunPods,
            (false, Some(_)) => TxnReason::CheckFailed,
            (false, None) => TxnReason::RolledBack,
        };
        let mut e = TxnError::new(why, message).at(phase).caused_by(step.reason);
        for shim in step.check_failed.iter().flatten() {
            e = e.blaming(shim);
        }
        Err(e.into())
    }

    /// Put the files back and, when containerd was (or may have been) restarted with them,
    /// restart it and check it serves what it served before.
    pub(super) async fn roll_back(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: String,
        restart: bool,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        // once containerd ran with the new versions, a task may have started through one:
        // their files stay, retired below with the rollback, until no task uses them
        restore_backups(self.root, &j, restart)?;
        failpoint("txn::restored");
        // containerd must come back with the handlers the restored files define: those it
        // had before, less any that drift had removed (a failed drift repair restores the
        // drifted bytes, and containerd cannot serve what they do not define).
        let (present, absent) = self.expected_after_rollback(state, &j);
        let outcome = if !restart {
            Ok(())
        } else {
            match self.restarter.restart(&self.profile.unit).await {
                Ok(()) => self.health.verify(&present, &absent).await,
                Err(e) => Err(e),
            }
            .map_err(|e| StepError::from(e).message)
        };
        match outcome {
            Ok(()) => {
                // The failed transaction's new versions are retired in the same write as the
                // rollback (a task may have started through one before containerd went
                // back), and go with their artifacts once no task uses them.
                let new_versions: Vec<(String, String)> = j
                    .pending
                    .iter()
                    .map(|p| (p.name.clone(), p.artifact_sha256.clone()))
                    .collect();
                super::retain::retire(state, &new_versions, super::record::now_secs());
                self.event(store, state, Event::RolledBack)?;
                super::notices::rolled_back(&j, state, &reason);
                self.close(store, state, &j)?;
                self.collect_after(store, state);
                Ok(())
            }
            Err(e) => {
                self.event(store, state, Event::RollbackFailed { reason: e.clone() })?;
                super::notices::rollback_failed(&j, state, &e);
                Err(TxnError::new(
                    TxnReason::Broken,
                    format!(
                        "{reason}; the rollback failed too ({e}): containerd is not healthy, the journal stays open at Broken"
                    ),
                )
                .into())
            }
        }
    }

    /// The handlers containerd must serve, and must not, once the backups of `j` are back:
    /// the installed Shims' handlers the restored config defines, and the rest (the failed
    /// transaction's new handlers, handlers drift had removed) absent. Without a readable
    /// config, every installed handler is expected.
    fn expected_after_rollback(
        &self,
        state: &NodeState,
        j: &Journal,
    ) -> (Vec<String>, Vec<String>) {
        let defined = self.host_facts(state).handlers;
        let readable = !defined.is_empty() || self.load_config_ok();
        let mut present = Vec::new();
        let mut absent: Vec<String> = j
            .pending
            .iter()
            .filter(|p| !state.shims.contains_key(&p.name))
            .map(|p| p.handler.clone())
            .collect();
        for s in state.shims.values() {
            if !readable || defined.contains(&s.handler) {
                present.push(s.handler.clone());
            } else {
                absent.push(s.handler.clone());
            }
        }
        (present, absent)
    }
}
