//! The agent's bookkeeping around a round, pure: how a failure is named (a stable reason for conditions and metrics) and how long to back off.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::target::PodUse;
use crate::api::Shim;
use crate::state::NodeState;

pub use crate::retry::{BACKOFF_BASE_SECS, BACKOFF_MAX_SECS, backoff};

pub const UNINSTALL_KEY: &str = "uninstall";

pub fn spec_key(shim: &Shim) -> String {
    format!("{}:{}", shim.uid().unwrap_or_default(), shim.spec_hash())
}

pub use crate::txn::classify::change_name;

pub fn report_digest(before: &NodeState, name: &str) -> String {
    before
        .shims
        .get(name)
        .map(|r| format!(" (was sha256:{})", r.artifact_sha256))
        .unwrap_or_default()
}

pub fn pod_use(p: &Pod) -> PodUse {
    let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
    PodUse {
        name: format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()),
        runtime_class: p.spec.as_ref().and_then(|s| s.runtime_class_name.clone()),
        finished: matches!(phase, Some("Succeeded" | "Failed")),
    }
}

/// The machine-readable reason of a failed transaction (the first typed error in the chain).
pub fn error_reason(e: &anyhow::Error) -> &'static str {
    for cause in e.chain() {
        if let Some(t) = cause.downcast_ref::<crate::txn::TxnError>() {
            return t.reason();
        }
        if let Some(a) = cause.downcast_ref::<crate::artifact::ArtifactError>() {
            return a.reason();
        }
        if let Some(c) = cause.downcast_ref::<crate::containerd::ConfigError>() {
            return c.reason();
        }
    }
    let text = format!("{e:#}");
    if text.contains("the rollback failed too") {
        "Broken"
    } else if text.contains("rolled back") {
        "RolledBack"
    } else if text.contains("is already installed for Shim") {
        "HandlerInUse"
    } else {
        "TransactionFailed"
    }
}
