//! The typed outcome of a failed transaction: a stable [`TxnReason`] (a condition's reason, a
//! metric label, an Event's reason), the Shims it blames, and the message a person reads.
//! Callers branch on the reason, never on the text.

use thiserror::Error;

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
        }
    }
}

/// A failed transaction.
#[derive(Debug, Clone, Error)]
#[error("{message}")]
pub struct TxnError {
    pub reason: TxnReason,
    /// The Shims the failure is known to come from; empty when it may come from any Shim
    /// of the batch.
    pub blamed: Vec<String>,
    pub message: String,
}

impl TxnError {
    pub fn new(reason: TxnReason, message: impl Into<String>) -> Self {
        TxnError {
            reason,
            blamed: Vec::new(),
            message: message.into(),
        }
    }

    /// Blaming `shim`.
    pub fn blaming(mut self, shim: &str) -> Self {
        self.blamed.push(shim.to_string());
        self
    }

    /// The stable reason.
    pub fn reason(&self) -> &'static str {
        self.reason.as_str()
    }
}

/// The stable reason of a failed change: the first typed error in its chain (the
/// transaction's, an artifact's or a containerd config's), else `TransactionFailed`. Callers
/// branch on it and label metrics, conditions and Events with it; nobody parses the text.
pub fn reason_of(e: &anyhow::Error) -> &'static str {
    for cause in e.chain() {
        if let Some(t) = cause.downcast_ref::<TxnError>() {
            return t.reason();
        }
        if let Some(a) = cause.downcast_ref::<crate::artifact::ArtifactError>() {
            return a.reason();
        }
        if let Some(c) = cause.downcast_ref::<crate::containerd::ConfigError>() {
            return c.reason();
        }
    }
    "TransactionFailed"
}

/// The Shims a failed change blames (empty: any Shim of its batch).
pub fn blamed_by(e: &anyhow::Error) -> Vec<String> {
    e.chain()
        .filter_map(|c| c.downcast_ref::<TxnError>())
        .flat_map(|t| t.blamed.clone())
        .collect()
}
