//! Proven: after containerd lists the new handlers, each one runs a pod sandbox (and its
//! Shim's check container) before the transaction commits (docs/design.md §3). A failure rolls
//! the transaction back and blames the Shims whose check failed; what the checks made is gone
//! whatever the outcome, and a start sweeps what a crash left.

use std::time::Duration;

use super::error::{StepError, TxnError, TxnReason};
use super::host::Node;
use super::machine::Event;
use super::ports::{HealthCheck, Restarter};
use crate::node::check::{CheckReport, ContainerCheck, HandlerCheck, checks_dir, remove_log_dirs};
use crate::state::{CheckRecord, InstalledShim, NodeState, Origin, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// Prove every handler the open journal installs; `Proven` on success, else the
    /// transaction rolls back.
    pub(super) async fn prove_journal(
        &self,
        store: &StateStore,
        state: &mut NodeState,
    ) -> anyhow::Result<()> {
        let pending = state
            .journal
            .as_ref()
            .map(|j| j.pending.clone())
            .unwrap_or_default();
        match self.prove_records(&pending).await {
            Ok(()) => self.event(store, state, Event::Proven),
            Err(step) => self.fail(store, state, step).await,
        }
    }

    /// Prove the handlers of `records`, each passed check logged; `Err`: the checks that
    /// failed, by Shim.
    pub(super) async fn prove_records(&self, records: &[InstalledShim]) -> Result<(), StepError> {
        match self.health.prove(&handler_checks(records)).await {
            Ok(reports) => {
                for r in &reports {
                    log_passed(records, r);
                }
                Ok(())
            }
            Err(failed) => {
                let by_shim: Vec<_> = failed
                    .into_iter()
                    .map(|(handler, e)| (shim_of(records, &handler), e))
                    .collect();
                Err(StepError::checks(&by_shim))
            }
        }
    }

    /// Whether a pod can run here at all before anything is fetched or restarted (the node's
    /// sandbox image): without one the Shims of `installs` fail with `NoSandboxImage`, and no
    /// runtime is blamed.
    pub(super) async fn sandbox_ready(
        &self,
        installs: &[(Box<crate::api::Shim>, Origin)],
    ) -> Result<(), TxnError> {
        if !self.health.proves() {
            return Ok(());
        }
        let Err(e) = self.health.sandbox_ready().await else {
            return Ok(());
        };
        crate::telemetry::runtime_checked(e.reason());
        let mut te = TxnError::new(
            TxnReason::NodeCannotRunPods,
            format!("{e} [{}]", e.reason()),
        )
        .caused_by(Some(e.reason()));
        for (shim, _) in installs {
            te = te.blaming(shim.name());
        }
        Err(te)
    }

    /// Remove the check sandboxes an interrupted run left behind (at start, before any
    /// recovery proves a handler again), then every check's log directory under
    /// `<state-dir>/checks`; a CRI that does not answer is logged, not fatal.
    pub(super) async fn sweep_leftover_checks(&self) {
        if self.health.proves() {
            match self.health.sweep_checks().await {
                Ok(0) => {}
                Ok(n) => tracing::warn!(
                    sandboxes = n,
                    "removed runtime-check sandboxes an interrupted run left behind"
                ),
                Err(e) => tracing::warn!(
                    "cannot look for runtime-check sandboxes an interrupted run left behind yet: {e}"
                ),
            }
        }
        self.remove_leftover_check_logs();
    }

    /// Remove the log directories of checks an interrupted run left (a check removes its
    /// own when it ends): at start, when no check runs.
    fn remove_leftover_check_logs(&self) {
        let dir = checks_dir(&self.settings.paths.state_dir);
        let removed = self
            .root
            .resolve(&dir)
            .and_then(|local| remove_log_dirs(&local));
        match removed {
            Ok(names) if names.is_empty() => {}
            Ok(names) => tracing::warn!(
                dir = %dir,
                removed = %names.join(", "),
                "removed the log directories of runtime checks an interrupted run left behind"
            ),
            Err(e) => tracing::warn!(
                dir = %dir,
                "cannot look for runtime-check log directories an interrupted run left behind: {e}"
            ),
        }
    }
}

/// What to prove for each record a transaction installs (pure).
pub fn handler_checks(pending: &[InstalledShim]) -> Vec<HandlerCheck> {
    pending
        .iter()
        .map(|p| HandlerCheck {
            handler: p.handler.clone(),
            container: p.check.as_ref().map(container_check),
        })
        .collect()
}

/// A recorded check container as the node's check runs it.
fn container_check(c: &CheckRecord) -> ContainerCheck {
    ContainerCheck {
        image: c.image.clone(),
        command: c.command.clone(),
        args: c.args.clone(),
        exit_code: c.exit_code,
        output_contains: c.output_contains.clone(),
        timeout: Duration::from_secs(c.timeout_secs),
    }
}

/// The Shim whose record has `handler` (the handler itself if none has: never in practice).
fn shim_of(pending: &[InstalledShim], handler: &str) -> String {
    pending
        .iter()
        .find(|p| p.handler == handler)
        .map_or_else(|| handler.to_string(), |p| p.name.clone())
}

/// The journal line of a passed check: the proof an operator looks for.
fn log_passed(pending: &[InstalledShim], r: &CheckReport) {
    let shim = shim_of(pending, &r.handler);
    let ms = |d: Duration| d.as_millis() as u64;
    let container = match r.container {
        Some(c) => format!(" and its check container in {} ms", ms(c)),
        None => String::new(),
    };
    tracing::info!(
        shim = %shim,
        phase = "proven",
        sandbox_ms = ms(r.sandbox),
        total_ms = ms(r.total),
        "runtime check passed: handler {} ran a pod sandbox (ready in {} ms){container}",
        r.handler,
        ms(r.sandbox),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Origin, ShimState};

    fn record(name: &str, handler: &str, check: Option<CheckRecord>) -> InstalledShim {
        InstalledShim {
            name: name.into(),
            handler: handler.into(),
            runtime_type: "/opt/x".into(),
            artifact_sha256: "a".repeat(64),
            source: "file:///x".into(),
            binary: "/opt/x".into(),
            spec_hash: "h".into(),
            config_files: vec![],
            state: ShimState::Installed,
            origin: Origin::Cluster,
            runtime_class: None,
            installed_at: 1,
            shim_version: None,
            insecure_source: None,
            signature: None,
            check: check.clone(),
        }
    }

    #[test]
    fn every_installed_handler_is_proven_with_its_recorded_container() {
        let c = CheckRecord {
            image: "docker.io/library/hello:v1".into(),
            command: vec!["/hello.wasm".into()],
            args: vec![],
            exit_code: 0,
            output_contains: Some("hello".into()),
            timeout_secs: 30,
        };
        let checks = handler_checks(&[record("a", "ha", Some(c)), record("b", "hb", None)]);
        assert_eq!(checks.len(), 2);
        assert_eq!(checks[0].handler, "ha");
        let container = checks[0].container.as_ref().unwrap();
        assert_eq!(container.timeout, Duration::from_secs(30));
        assert_eq!(container.output_contains.as_deref(), Some("hello"));
        assert_eq!(checks[1].container, None);
        assert_eq!(shim_of(&[record("a", "ha", None)], "ha"), "a");
    }
}
