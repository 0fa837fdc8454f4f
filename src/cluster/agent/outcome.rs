//! What a round's outcome tells the world, as the reconciler core judged it: the journal, and
//! Events on the Shim and the Node (installed, failed, set aside after crashes, blocked
//! uninstalls, static-vs-cluster conflicts).

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::runtime::events::{EventType, Recorder, Reporter};
use kube::{Client, Resource};

use super::reported::Reported;
use super::round_events::RoundEvents;
use crate::api::Shim;
use crate::api::names::{FIELD_MANAGER, event};
use crate::cluster::target::NodePlan;
use crate::reconciler::crash::SetAside;
use crate::reconciler::judge::Verdict;
use crate::reconciler::memory::Wanted;
use crate::state::NodeState;
use crate::txn::{Report, TxnError, TxnReason};

/// The Event reason of a failed change: what was being done, from the failed transaction's
/// kind and reason, whether the Shim was installed before, and whether the cluster still
/// wants it. A runtime that failed its check, and a node that cannot run pods, keep the
/// check's own reason (`SandboxCheckFailed`, `NoSandboxImage`, ...).
pub fn event_reason(
    kind: TxnReason,
    reason: &'static str,
    was_installed: bool,
    wanted: bool,
) -> &'static str {
    match (kind, was_installed, wanted) {
        (TxnReason::DriftUnrepairable, ..) => event::DRIFT_UNREPAIRABLE,
        (_, _, false) => event::UNINSTALL_FAILED,
        (TxnReason::CheckFailed | TxnReason::NodeCannotRunPods, ..) => reason,
        (TxnReason::RolledBack, ..) => event::ROLLED_BACK,
        (_, true, true) => event::UPGRADE_FAILED,
        (_, false, true) => event::INSTALL_FAILED,
    }
}

/// How an installed Event names the version it replaced.
fn report_digest(before: &NodeState, name: &str) -> String {
    before
        .shims
        .get(name)
        .map(|r| format!(" (was sha256:{})", r.artifact_sha256))
        .unwrap_or_default()
}

/// What the rounds tell the world: the journal, and Events on the Shims and the Node.
pub(super) struct Outcomes {
    node_name: String,
    recorder: Recorder,
    /// Publishes the rounds' Events in the background.
    events: crate::events::Sender,
    /// The round's Events, published at its end.
    outbox: RoundEvents,
    /// What it has reported, to report again only what changed.
    reported: Reported,
}

impl Outcomes {
    pub(super) fn new(client: Client, node_name: String) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(node_name.clone()),
        };
        let recorder = Recorder::new(client, reporter);
        Outcomes {
            node_name,
            events: crate::events::Sender::new(recorder.clone()),
            recorder,
            outbox: RoundEvents::default(),
            reported: Reported::default(),
        }
    }

    /// The recorder of the agent's Events (the node hooks report through it too).
    pub(super) fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    pub(super) fn succeeded(
        &mut self,
        report: &Report,
        before: &NodeState,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        for name in &report.installed {
            let upgraded = before.shims.contains_key(name);
            let (reason, verb) = if upgraded {
                (event::UPGRADED, "upgraded")
            } else {
                (event::INSTALLED, "installed")
            };
            let digest = report_digest(before, name);
            let note = format!(
                "{name} {verb} on node {}: containerd serves its handler{digest}",
                self.node_name
            );
            tracing::info!(shim = %name, node = %self.node_name, "{note}");
            self.emit(cluster, name, node, EventType::Normal, reason, note);
        }
        for name in &report.removed {
            let note = format!("{name} uninstalled from node {}", self.node_name);
            tracing::info!(shim = %name, node = %self.node_name, "{note}");
            self.emit(
                cluster,
                name,
                node,
                EventType::Normal,
                event::UNINSTALLED,
                note,
            );
        }
    }

    /// Report a failed round as the reconciler core judged it ([`Verdict`]).
    pub(super) fn failed(
        &mut self,
        e: &TxnError,
        verdict: &Verdict,
        before: &NodeState,
        wanted: &Wanted<'_>,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        let message = &e.message;
        let failed = match verdict {
            Verdict::Failed(failed) => failed,
            // The wait for a rollout slot ended because the agent stops: nothing was tried,
            // nothing failed; the next start takes it up again.
            Verdict::Stopping => {
                tracing::info!("stopping before the transaction: {message}");
                return;
            }
            Verdict::Replan => {
                tracing::info!("planning again: {message}");
                return;
            }
            Verdict::Wait { names, pause } => {
                tracing::warn!(
                    retry_in_ms = pause.as_millis() as u64,
                    "waiting for the API server before {}: {message}",
                    names.join(", ")
                );
                return;
            }
            Verdict::RunAlone(_) => {
                tracing::warn!("a batch of changes failed; trying each alone: {message}");
                return;
            }
            Verdict::Succeeded => return,
        };
        let (kind, reason) = (e.reason, e.reason());
        for (name, pause) in failed {
            let secs = pause.as_secs();
            tracing::error!(shim = %name, %reason, retry_in_secs = secs, "{name}: change failed, retrying in {secs} s: {message}");
            let was = before.shims.contains_key(name);
            let ev_reason = event_reason(kind, reason, was, wanted.get(name).is_some());
            let note = format!("{reason}: {message}");
            self.emit(cluster, name, node, EventType::Warning, ev_reason, note);
        }
    }

    /// The Shims newly set aside after crashes: an error in the journal and an Event each.
    pub(super) fn report_aside(&mut self, aside: &[SetAside], cluster: &[Shim], node: &KubeNode) {
        let reason = crate::crashes::REASON;
        for SetAside { name, note } in aside {
            let message = &note.message;
            tracing::error!(shim = %name, %reason, "{name}: {message}");
            let note = format!("{reason}: {message}");
            self.emit(cluster, name, node, EventType::Warning, reason, note);
        }
    }

    pub(super) fn report_blocked_and_conflicts(
        &mut self,
        plan: &NodePlan,
        cluster: &[Shim],
        node: &KubeNode,
    ) {
        for (name, pods) in self.reported.blocked_now(&plan.blocked) {
            let note = format!(
                "uninstall of {name} from node {} waits for pods that use its RuntimeClass: {}",
                self.node_name,
                pods.join(", ")
            );
            tracing::info!(shim = %name, "{note}");
            self.emit(
                cluster,
                &name,
                node,
                EventType::Warning,
                event::UNINSTALL_BLOCKED,
                note,
            );
        }
        for name in &plan.conflicts {
            if self.reported.conflict_seen(name) {
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
                    event::STATIC_SHIM_WINS,
                    note,
                );
            }
        }
        self.reported.keep_conflicts_only(&plan.conflicts);
    }

    /// An Event on the Shim (when it still exists) and on the Node, kept for the end of the
    /// round ([`Outcomes::publish_events`]): the Node's labels and state go out first, so a
    /// batch's Events never hold up its labels; the Node gets one Event per kind for the
    /// round's Shims ([`super::round_events`]).
    pub(super) fn emit(
        &mut self,
        cluster: &[Shim],
        shim: &str,
        node: &KubeNode,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let on_shim = cluster
            .iter()
            .find(|s| s.name() == shim)
            .map(|s| s.object_ref(&()));
        self.outbox
            .tell(shim, (type_, reason, note), node.object_ref(&()), on_shim);
    }

    /// The round's Events, sent in the background a few at a time
    /// ([`crate::events::Sender`]); failures to publish are logged at debug level only
    /// (Events are best effort).
    pub(super) fn publish_events(&mut self) {
        self.events.send(self.outbox.take_writes());
    }
}

#[cfg(test)]
mod tests {
    use super::event_reason;
    use crate::txn::TxnReason::*;

    #[test]
    fn a_failed_change_is_named_by_what_it_was_doing() {
        assert_eq!(
            event_reason(Unprepared, "FetchFailed", false, true),
            "InstallFailed"
        );
        assert_eq!(
            event_reason(Unprepared, "FetchFailed", true, true),
            "UpgradeFailed"
        );
        assert_eq!(
            event_reason(RolledBack, "RolledBack", true, true),
            "RolledBack"
        );
        assert_eq!(
            event_reason(RolledBack, "RolledBack", false, true),
            "RolledBack"
        );
        assert_eq!(
            event_reason(RolledBack, "RolledBack", true, false),
            "UninstallFailed"
        );
        assert_eq!(
            event_reason(DriftUnrepairable, "DriftUnrepairable", true, false),
            "DriftUnrepairable"
        );
    }

    #[test]
    fn a_runtime_that_failed_its_check_keeps_the_checks_reason() {
        assert_eq!(
            event_reason(CheckFailed, "SandboxCheckFailed", false, true),
            "SandboxCheckFailed"
        );
        assert_eq!(
            event_reason(NodeCannotRunPods, "NoSandboxImage", true, true),
            "NoSandboxImage"
        );
        assert_eq!(
            event_reason(Unprepared, "MissingLibraries", false, true),
            "InstallFailed"
        );
    }
}
