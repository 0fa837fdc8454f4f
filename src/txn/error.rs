//! The typed outcome of a failed transaction, which every `Node::apply*` returns: a stable
//! [`TxnReason`] (a condition's reason, a metric label, an Event's reason), the phase it failed
//! in, its typed [`Cause`] (the rollout gate's [`GateError`], or a step's typed error by its
//! reason: a node edge's [`crate::node::NodeError`], an artifact's, a config's), the Shims it
//! blames, and the message a person reads. Callers match on the kind and the cause, never on
//! the text.

use thiserror::Error;

use crate::node::NodeError;
use crate::state::Phase;

/// Why a transaction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnReason {
    /// A step failed; the files went back and containerd runs the previous configuration.
    RolledBack,
    /// A drift repair (a Shim at its installed spec whose handler or binary was gone)
    /// failed and was rolled back: the node keeps the drifted configuration.
    DriftUnrepairable,
    /// Even the rollback left containerd unhealthy; the journal stays open at Broken.
    Broken,
    /// The handler is installed for another Shim.
    HandlerInUse,
    /// No rollout slot could be had; nothing on the host changed.
    NoSlot,
    /// One Shim's change could not be prepared (its artifact fetched and verified, its binary
    /// found and its preflight passed, its option paths resolved, its config change planned);
    /// nothing on the host changed. The error's [`reason`](TxnError::reason) is its step's own.
    Unprepared,
    /// containerd serves the new handlers, but a runtime could not be proven to work (its pod
    /// sandbox, its check container, their images): rolled back; the Shims it blames are
    /// those whose check failed. The error's [`reason`](TxnError::reason) is the check's own
    /// (`SandboxCheckFailed`, `ContainerCheckFailed`, `CheckImageUnavailable`,
    /// `NoSandboxImage`).
    CheckFailed,
    /// No pod can run on this node at all (it has no sandbox image and cannot pull one):
    /// found before the restart, so nothing on the host changed and no runtime is blamed.
    /// The error's [`reason`](TxnError::reason) is `NoSandboxImage`.
    NodeCannotRunPods,
    /// Anything else went wrong around the steps (the config could not be read, the state
    /// could not be written, ...). The error's [`reason`](TxnError::reason) is its typed
    /// error's, else `TransactionFailed`.
    Failed,
}

impl TxnReason {
    /// The stable, CamelCase name.
    pub fn as_str(self) -> &'static str {
        match self {
            TxnReason::RolledBack => "RolledBack",
            TxnReason::DriftUnrepairable => "DriftUnrepairable",
            TxnReason::Broken => "Broken",
            TxnReason::HandlerInUse => "HandlerInUse",
            TxnReason::NoSlot => "NoSlot",
            TxnReason::Unprepared => "Unprepared",
            TxnReason::CheckFailed => "CheckFailed",
            TxnReason::NodeCannotRunPods => "NodeCannotRunPods",
            TxnReason::Failed => "Failed",
        }
    }
}

/// A failed transaction.
#[derive(Debug, Clone, Error)]
#[error("{message}")]
pub struct TxnError {
    pub reason: TxnReason,
    /// The last phase the journal reached before the failure (`None`: before the journal).
    pub phase: Option<Phase>,
    /// What the step failed with, when it was typed: the gate's refusal, or a step's typed
    /// error (`RestartFailed`, `HandlerMissing`, `DigestMismatch`, ...).
    pub cause: Option<Cause>,
    /// The Shims the failure is known to come from; empty when it may come from any Shim
    /// of the batch.
    pub blamed: Vec<String>,
    pub message: String,
}

impl TxnError {
    pub fn new(reason: TxnReason, message: impl Into<String>) -> Self {
        TxnError {
            reason,
            phase: None,
            cause: None,
            blamed: Vec::new(),
            message: message.into(),
        }
    }

    /// Failed after the journal reached `phase`.
    pub fn at(mut self, phase: Option<Phase>) -> Self {
        self.phase = phase;
        self
    }

    /// Caused by a step's typed error with this reason.
    pub fn caused_by(mut self, reason: Option<&'static str>) -> Self {
        self.cause = reason.map(Cause::Step);
        self
    }

    /// Caused by the rollout gate's refusal.
    pub fn refused_by_gate(mut self, e: GateError) -> Self {
        self.cause = Some(Cause::Gate(e));
        self
    }

    /// Any error of a transaction as its typed outcome: a [`TxnError`] in its chain (the
    /// message the whole chain), else [`TxnReason::Failed`] typed by the first typed error
    /// in the chain.
    pub fn from_error(e: anyhow::Error) -> Self {
        let message = format!("{e:#}");
        match e.chain().find_map(|c| c.downcast_ref::<TxnError>()) {
            Some(t) => TxnError {
                message,
                ..t.clone()
            },
            None => TxnError::new(TxnReason::Failed, message).caused_by(typed_reason(&e)),
        }
    }

    /// Whether the change only waits: it never began because no rollout slot could be had
    /// while the API server was away or overloaded. The node tries again soon, without
    /// calling it a failure of the Shim's: at 5000 nodes an overloaded server made thousands
    /// of nodes report `Failed` and back off for minutes, which slowed the rollout further.
    pub fn only_waits(&self) -> bool {
        self.reason == TxnReason::NoSlot
            && matches!(self.cause, Some(Cause::Gate(GateError::SlotUnavailable(_))))
    }

    /// Whether the wait for a rollout slot ended because the cluster's Shims changed
    /// ([`GateError::Superseded`]): nothing was tried, and the node plans again at once.
    pub fn superseded(&self) -> bool {
        self.reason == TxnReason::NoSlot
            && matches!(self.cause, Some(Cause::Gate(GateError::Superseded)))
    }

    /// Blaming `shim`.
    pub fn blaming(mut self, shim: &str) -> Self {
        self.blamed.push(shim.to_string());
        self
    }

    /// `shim`'s own change failed before the host changed ([`TxnReason::Unprepared`]): it
    /// alone is blamed, and the reason and the message stay those of `e` (`DigestMismatch`,
    /// `NoShimBinary`, ... and its whole chain as text), as they were before it was typed.
    pub fn unprepared(shim: &str, e: anyhow::Error) -> Self {
        TxnError::new(TxnReason::Unprepared, format!("{e:#}"))
            .caused_by(typed_reason(&e))
            .blaming(shim)
    }

    /// The stable reason: the kind's, or for an [`Unprepared`](TxnReason::Unprepared) change,
    /// a [`CheckFailed`](TxnReason::CheckFailed) runtime and a node that
    /// [cannot run pods](TxnReason::NodeCannotRunPods) its step's own (what the Shim's
    /// condition says).
    pub fn reason(&self) -> &'static str {
        match self.reason {
            TxnReason::Unprepared
            | TxnReason::CheckFailed
            | TxnReason::NodeCannotRunPods
            | TxnReason::Failed => self.cause.as_ref().map_or(UNTYPED, Cause::reason),
            kind => kind.as_str(),
        }
    }
}

/// What a failed transaction's step failed with, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The rollout gate said no.
    Gate(GateError),
    /// A step's typed error, by its stable reason.
    Step(&'static str),
}

impl Cause {
    /// The stable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Cause::Gate(e) => e.reason(),
            Cause::Step(r) => r,
        }
    }
}

/// Why a step of a transaction failed: its typed error's stable reason (when it had one), the
/// message, and, for a failed runtime check, the Shims whose check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepError {
    pub reason: Option<&'static str>,
    pub message: String,
    /// A runtime check failed ([`TxnReason::CheckFailed`]), for these Shims.
    pub check_failed: Option<Vec<String>>,
    /// Every check failed for want of the node's sandbox image: no pod can run on the node,
    /// with any runtime ([`TxnReason::NodeCannotRunPods`]).
    pub cannot_run_pods: bool,
}

impl StepError {
    /// A step error with no typed cause (a file could not be written, ...).
    pub fn text(message: impl Into<String>) -> Self {
        StepError {
            reason: None,
            message: message.into(),
            check_failed: None,
            cannot_run_pods: false,
        }
    }

    /// Failed runtime checks: each Shim with its handler's error. The reason is the first
    /// one's; the message names each.
    pub fn checks(failed: &[(String, NodeError)]) -> Self {
        let message = failed
            .iter()
            .map(|(shim, e)| format!("{shim}: {e} [{}]", e.reason()))
            .collect::<Vec<_>>()
            .join("; ");
        StepError {
            reason: failed.first().map(|(_, e)| e.reason()),
            message,
            check_failed: Some(failed.iter().map(|(shim, _)| shim.clone()).collect()),
            cannot_run_pods: failed
                .iter()
                .all(|(_, e)| matches!(e, NodeError::NoSandboxImage { .. })),
        }
    }
}

impl From<&NodeError> for StepError {
    fn from(e: &NodeError) -> Self {
        StepError {
            reason: Some(e.reason()),
            message: format!("{e} [{}]", e.reason()),
            check_failed: None,
            cannot_run_pods: false,
        }
    }
}

impl From<NodeError> for StepError {
    fn from(e: NodeError) -> Self {
        StepError::from(&e)
    }
}

/// Why the rollout gate said no: the restart may not happen (nothing on the host changed yet,
/// or the files go back without a restart).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GateError {
    /// The agent stops while it waits.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// The cluster's Shims changed while this node waited for its first slot: nothing was
    /// tried, and the node plans again (what arrived joins the same transaction).
    #[error("the cluster's Shims changed while this node waited for a rollout slot")]
    Superseded,
    /// A read or write of the slots did not get through: the API server was away or
    /// overloaded, or the slot kept changing. Nothing was tried; it may pass soon.
    #[error("{0}")]
    SlotUnavailable(String),
    /// The API server refused a read or write of the slots (forbidden, invalid, ...): trying
    /// again will not change that.
    #[error("{0}")]
    SlotRefused(String),
    /// The slot is held by another node now.
    #[error("slot {slot} is no longer held by {me}")]
    SlotLost { slot: String, me: String },
    /// A `BeforeNodeRestart` extension refused the restart, or failed under policy `Fail`.
    #[error("{0}")]
    Refused(String),
    /// The extensions could not be read, so whether one objects is not known.
    #[error("{0}")]
    ExtensionsUnknown(String),
}

impl GateError {
    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            GateError::ShuttingDown => "ShuttingDown",
            GateError::Superseded => "Superseded",
            GateError::SlotUnavailable(_) => "SlotUnavailable",
            GateError::SlotRefused(_) => "SlotRefused",
            GateError::SlotLost { .. } => "SlotLost",
            GateError::Refused(_) => "RefusedByExtension",
            GateError::ExtensionsUnknown(_) => "ExtensionsUnknown",
        }
    }
}

/// The reason of the first typed error in `e`'s chain, if it has one.
fn typed_reason(e: &anyhow::Error) -> Option<&'static str> {
    e.chain().find_map(|cause| {
        if let Some(t) = cause.downcast_ref::<TxnError>() {
            return Some(t.reason());
        }
        if let Some(a) = cause.downcast_ref::<crate::artifact::ArtifactError>() {
            return Some(a.reason());
        }
        if let Some(n) = cause.downcast_ref::<NodeError>() {
            return Some(n.reason());
        }
        if let Some(s) = cause.downcast_ref::<crate::state::StateError>() {
            return Some(s.reason());
        }
        cause
            .downcast_ref::<crate::containerd::ConfigError>()
            .map(|c| c.reason())
    })
}

/// The reason of a failed change with no typed error in its chain.
const UNTYPED: &str = "TransactionFailed";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::artifact::ArtifactError;

    #[test]
    fn an_unprepared_change_blames_its_shim_and_keeps_its_steps_reason_and_message() {
        let typed = anyhow::Error::new(ArtifactError::MissingDigest {
            location: "file:///a.tgz".into(),
        })
        .context("Shim \"a\"");
        let message = format!("{typed:#}");
        let e = TxnError::unprepared("a", typed);
        assert_eq!(
            (e.reason(), e.cause.clone()),
            ("MissingDigest", Some(Cause::Step("MissingDigest")))
        );
        assert_eq!(
            (e.blamed, e.phase, e.message),
            (vec!["a".into()], None, message)
        );

        let untyped = TxnError::unprepared("b", anyhow::anyhow!("disk full"));
        assert_eq!(untyped.reason(), "TransactionFailed");
        let again = TxnError::from_error(untyped.into());
        assert_eq!(again.reason(), "TransactionFailed");
    }

    #[test]
    fn any_error_becomes_a_typed_outcome_with_its_whole_chain_as_the_message() {
        let inner = TxnError::new(TxnReason::NoSlot, "no rollout slot: gone")
            .refused_by_gate(GateError::SlotUnavailable("gone".into()));
        let e = TxnError::from_error(anyhow::Error::new(inner).context("round"));
        assert!(e.only_waits() && !e.superseded());
        assert_eq!(e.message, "round: no rollout slot: gone");
        let cfg = anyhow::Error::new(ArtifactError::MissingDigest {
            location: "x".into(),
        });
        let e = TxnError::from_error(cfg.context("loading"));
        assert_eq!((e.reason, e.reason()), (TxnReason::Failed, "MissingDigest"));
        let plain = TxnError::from_error(anyhow::anyhow!("disk full"));
        assert_eq!(plain.reason(), "TransactionFailed");
    }
}
