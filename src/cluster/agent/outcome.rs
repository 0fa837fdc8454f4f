//! What a round's outcome tells the world: Events on the Shim and the Node, the failure
//! memory and its backoff, blocked uninstalls and static-vs-cluster conflicts.

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Resource;
use kube::runtime::events::EventType;
use tokio::time::Instant;

use super::{Agent, Failure};
use crate::api::Shim;
use crate::cluster::nodestate::FailureNote;
use crate::cluster::round::{UNINSTALL_KEY, backoff, error_reason, report_digest, spec_key};
use crate::cluster::target::NodePlan;
use crate::state::NodeState;
use crate::txn::{HealthCheck, Report, Restarter};

impl<R: Restarter, H: HealthCheck> Agent<'_, '_, R, H> {
    pub(super) async fn succeeded(
        &mut self,
        report: &Report,
        before: &NodeState,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        for name in report
            .installed
            .iter()
            .chain(&report.removed)
            .chain(&report.unchanged)
        {
            self.failures.remove(name);
        }
        for name in &report.installed {
            let upgraded = before.shims.contains_key(name);
            let (reason, verb) = if upgraded {
                ("Upgraded", "upgraded")
            } else {
                ("Installed", "installed")
            };
            let digest = report_digest(before, name);
            let note = format!(
                "{name} {verb} on node {}: containerd serves its handler{digest}",
                self.node_name
            );
            tracing::info!(shim = %name, node = %self.node_name, "{note}");
            self.emit(cluster, name, node, EventType::Normal, reason, note)
                .await;
        }
        for name in &report.removed {
            let note = format!("{name} uninstalled from node {}", self.node_name);
            tracing::info!(shim = %name, node = %self.node_name, "{note}");
            self.emit(cluster, name, node, EventType::Normal, "Uninstalled", note)
                .await;
        }
    }

    pub(super) async fn failed(
        &mut self,
        e: anyhow::Error,
        work: &[String],
        before: &NodeState,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        let message = format!("{e:#}");
        if self.shutdown.as_ref().is_some_and(|s| *s.borrow()) {
            // The wait for a rollout slot ended because the agent stops: nothing was tried,
            // nothing failed; the next start takes it up again.
            tracing::info!("stopping before the transaction: {message}");
            return;
        }
        let reason = error_reason(&e);
        let blamed: Vec<String> = e
            .chain()
            .filter_map(|c| c.downcast_ref::<crate::txn::TxnError>())
            .flat_map(|t| t.blamed.clone())
            .collect();
        let culprit: Vec<String> = match work {
            [one] => vec![one.clone()],
            _ if !blamed.is_empty() => blamed,
            many => many
                .iter()
                .filter(|n| message.contains(&format!("Shim {n:?}")))
                .cloned()
                .collect(),
        };
        if culprit.is_empty() && work.len() > 1 {
            tracing::warn!("a batch of changes failed; trying each alone: {message}");
            self.solo.extend(work.iter().cloned());
            self.rerun_now = true;
            return;
        }
        self.rerun_now = true;
        for name in culprit {
            let shim = cluster.iter().find(|s| s.name() == name);
            let key = shim.map(spec_key).unwrap_or_else(|| UNINSTALL_KEY.into());
            let attempts = self
                .failures
                .get(&name)
                .filter(|f| f.spec_key == key)
                .map(|f| f.attempts + 1)
                .unwrap_or(1);
            let pause = backoff(attempts);
            tracing::error!(shim = %name, %reason, retry_in_secs = pause.as_secs(), "{name}: change failed, retrying in {} s: {message}", pause.as_secs());
            let ev_reason = match (before.shims.contains_key(&name), shim.is_some()) {
                _ if reason == "DriftUnrepairable" => "DriftUnrepairable",
                (_, false) => "UninstallFailed",
                (true, true) if message.contains("rolled back") => "RolledBack",
                (true, true) => "UpgradeFailed",
                (false, _) if message.contains("rolled back") => "RolledBack",
                (false, _) => "InstallFailed",
            };
            let note = format!("{reason}: {message}");
            self.emit(cluster, &name, node, EventType::Warning, ev_reason, note)
                .await;
            self.failures.insert(
                name.clone(),
                Failure {
                    note: FailureNote {
                        reason: reason.to_string(),
                        message: crate::text::clip(&message, crate::text::MESSAGE_MAX_BYTES),
                        generation: shim.and_then(|s| s.metadata.generation),
                    },
                    spec_key: key,
                    attempts,
                    retry_at: Some(Instant::now() + pause),
                },
            );
        }
    }

    pub(super) async fn report_blocked_and_conflicts(
        &mut self,
        plan: &NodePlan,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        for (name, pods) in &plan.blocked {
            if self.blocked_seen.get(name) != Some(pods) {
                let note = format!(
                    "uninstall of {name} from node {} waits for pods that use its RuntimeClass: {}",
                    self.node_name,
                    pods.join(", ")
                );
                tracing::info!(shim = %name, "{note}");
                self.emit(
                    cluster,
                    name,
                    node,
                    EventType::Warning,
                    "UninstallBlocked",
                    note,
                )
                .await;
            }
        }
        self.blocked_seen = plan.blocked.clone();
        for name in &plan.conflicts {
            if self.conflicts_seen.insert(name.clone()) {
                let note = format!(
                    "node {} runs the static Shim {name:?} from shims.d instead of the cluster's",
                    self.node_name
                );
                tracing::warn!(shim = %name, "{note}");
                self.emit(
                    cluster,
                    name,
                    node,
                    EventType::Warning,
                    "StaticShimWins",
                    note,
                )
                .await;
            }
        }
        self.conflicts_seen.retain(|n| plan.conflicts.contains(n));
    }

    /// An Event on the Shim (when it still exists) and on the Node; failures to publish are
    /// logged at debug level only (Events are best effort).
    pub(super) async fn emit(
        &self,
        cluster: &[Shim],
        shim: &str,
        node: &KubeNode,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let ev = crate::events::event(type_, reason, reason, &note);
        let mut refs = vec![node.object_ref(&())];
        if let Some(s) = cluster.iter().find(|s| s.name() == shim) {
            refs.push(s.object_ref(&()));
        }
        crate::events::publish(&self.recorder, &ev, &refs).await;
    }
}
