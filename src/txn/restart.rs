//! Restarted and Verified: containerd restarted under the renewed rollout slots when the
//! config changed (nothing restarts otherwise), then asked through CRI whether it serves every
//! new handler and none of the removed ones.

use super::error::StepError;
use super::host::{Node, Report, Steps};
use super::machine::Event;
use super::notices;
use super::ports::{Gate, HealthCheck, Restarter};
use crate::state::{NodeState, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// Restarted: containerd reads its config only at start, so with a config change the
    /// slots are renewed and containerd restarted; with none, nothing restarts (a binary put
    /// back in place is picked up at the next shim start).
    pub(super) async fn restart_containerd<G: Gate>(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
        gate: &G,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        if !steps.plan.is_empty() {
            if let Err(e) = gate.renew().await {
                let why = StepError {
                    reason: Some(e.reason()),
                    message: format!(
                        "the rollout slot could not be renewed before the restart: {e}"
                    ),
                    check_failed: None,
                    cannot_run_pods: false,
                };
                return self.fail_unrestarted(store, state, why).await;
            }
            report.restarts += 1;
            notices::doing("restarting containerd for", &j_names(state));
            if let Err(e) = self.restarter.restart(&self.profile.unit).await {
                return self.fail(store, state, e.into()).await;
            }
        }
        self.event(store, state, Event::Restarted)
    }

    /// Verified: containerd serves every new handler and none of the removed ones.
    pub(super) async fn verify_served(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        steps: &Steps<'_>,
    ) -> anyhow::Result<()> {
        let present: Vec<String> = steps
            .prepared
            .iter()
            .map(|p| p.record.handler.clone())
            .collect();
        let absent: Vec<String> = steps.removes.iter().map(|r| r.handler.clone()).collect();
        if let Err(e) = self.health.verify(&present, &absent).await {
            return self.fail(store, state, e.into()).await;
        }
        self.event(store, state, Event::Verified)
    }
}

/// The Shims of the open transaction.
fn j_names(state: &NodeState) -> Vec<String> {
    state
        .journal
        .as_ref()
        .map(|j| j.shims.clone())
        .unwrap_or_default()
}
