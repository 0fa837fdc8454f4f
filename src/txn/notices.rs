//! What a transaction tells the outside as it ends: one journal entry per Shim with a stable
//! `MESSAGE_ID` and the fields `SHIM`, `PHASE`, `DIGEST` (journald upcases the field names;
//! `NODE` is added to every entry by the logger), the transaction metrics, and the status line.

use crate::state::{InstalledShim, Journal, NodeState, Phase, TxnKind};
use crate::telemetry::{self, message_id};

fn kind(k: TxnKind) -> &'static str {
    match k {
        TxnKind::Install => "install",
        TxnKind::Upgrade => "upgrade",
        TxnKind::Uninstall => "uninstall",
    }
}

pub(super) fn phase_name(p: Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The digest a Shim of this transaction has: the new one for an install, else the one
/// installed.
fn digest_of<'a>(j: &'a Journal, state: &'a NodeState, shim: &str) -> &'a str {
    j.pending
        .iter()
        .find(|p| p.name == shim)
        .or_else(|| state.shims.get(shim))
        .map(|r| r.artifact_sha256.as_str())
        .unwrap_or("")
}

/// Work under way on `shims`, for the status line.
pub(super) fn doing(verb: &str, shims: &[String]) {
    telemetry::doing(Some(format!("{verb} {}", telemetry::names(shims))));
}

/// The transaction committed: `installed` are in the state now, `removed` left it.
pub(super) fn committed(j: &Journal, installed: &[InstalledShim], removed: &[InstalledShim]) {
    for r in installed {
        tracing::info!(
            message_id = message_id::INSTALLED,
            shim = %r.name,
            phase = "committed",
            digest = %r.artifact_sha256,
            handler = %r.handler,
            "installed {}: containerd serves handler {}",
            r.name,
            r.handler
        );
    }
    for r in removed {
        tracing::info!(
            message_id = message_id::REMOVED,
            shim = %r.name,
            phase = "committed",
            digest = %r.artifact_sha256,
            handler = %r.handler,
            "uninstalled {}: handler {} removed",
            r.name,
            r.handler
        );
    }
    telemetry::transaction_ended(kind(j.kind), "committed");
    telemetry::doing(None);
}

/// The transaction failed at `j.phase` (before its rollback starts).
pub(super) fn failed(j: &Journal, state: &NodeState, reason: &str) {
    for shim in &j.shims {
        tracing::error!(
            message_id = message_id::FAILED,
            shim = %shim,
            phase = %phase_name(j.phase),
            digest = %digest_of(j, state, shim),
            %reason,
            "{shim}: the transaction failed at {}; rolling back: {reason}",
            phase_name(j.phase)
        );
    }
    doing("rolling back", &j.shims);
}

/// The transaction ended before anything on the host changed (no slot, no backups).
pub(super) fn aborted(k: TxnKind) {
    telemetry::transaction_ended(kind(k), "aborted");
    telemetry::doing(None);
}

/// The rollback finished: containerd runs the previous configuration.
pub(super) fn rolled_back(j: &Journal, state: &NodeState, reason: &str) {
    for shim in &j.shims {
        tracing::warn!(
            message_id = message_id::ROLLED_BACK,
            shim = %shim,
            phase = "rolled-back",
            digest = %digest_of(j, state, shim),
            %reason,
            "{shim}: rolled back; containerd runs the previous configuration"
        );
    }
    telemetry::transaction_ended(kind(j.kind), "rolled_back");
    telemetry::doing(None);
}

/// Even the rollback failed: the journal stays open at Broken.
pub(super) fn rollback_failed(j: &Journal, state: &NodeState, reason: &str) {
    for shim in &j.shims {
        tracing::error!(
            message_id = message_id::ROLLBACK_FAILED,
            shim = %shim,
            phase = "broken",
            digest = %digest_of(j, state, shim),
            %reason,
            "{shim}: the rollback failed, containerd is not healthy: {reason}"
        );
    }
    telemetry::transaction_ended(kind(j.kind), "broken");
    telemetry::doing(None);
}
