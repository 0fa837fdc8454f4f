//! The node's two ports (see the folder's header): [`ServiceManager`] over systemd and
//! [`RuntimeHealth`] over containerd's CRI, with what the CRI says of itself ([`CriStatus`])
//! and the check that it serves a handler.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use super::error::NodeError;
use super::unit::{RestartOutcome, UnitState};

/// How often [`RuntimeHealth::wait_for_handler`] asks the CRI again.
pub const HANDLER_POLL_INTERVAL_MS: u64 = 100;
/// Longest single `Status` call inside [`RuntimeHealth::wait_for_handler`].
pub const STATUS_CALL_TIMEOUT_MS: u64 = 2_000;
/// Shortest single `Status` call inside [`RuntimeHealth::wait_for_handler`]: the wait may end
/// this much after its timeout.
pub const MIN_STATUS_CALL_MS: u64 = 250;

/// The port to the service manager that runs containerd.
pub trait ServiceManager {
    /// Restart `unit` (mode `replace`) and wait up to `timeout` for the job's result.
    ///
    /// Returns the outcome when the job is `done`. A start refused because of the start limit
    /// (`Result=start-limit-hit`) is retried once after resetting the unit's failed state.
    /// Errors: [`NodeError::RestartFailed`], [`NodeError::RestartTimeout`],
    /// [`NodeError::StartLimitHit`], [`NodeError::Dbus`].
    fn restart_unit(
        &self,
        unit: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<RestartOutcome, NodeError>> + Send;

    /// The unit's current state (loads the unit if needed).
    fn unit_state(&self, unit: &str) -> impl Future<Output = Result<UnitState, NodeError>> + Send;

    /// Clear the unit's failed state and its start-rate counter (`ResetFailedUnit`).
    fn reset_failed(&self, unit: &str) -> impl Future<Output = Result<(), NodeError>> + Send;
}

/// Where [`CriStatus::handlers`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandlerSource {
    /// `StatusResponse.runtime_handlers` (containerd ≥ 2.0).
    #[default]
    RuntimeHandlers,
    /// The verbose info's `config.containerd.runtimes` (containerd 1.x).
    VerboseConfig,
}

/// What containerd's CRI says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CriStatus {
    /// The `RuntimeReady` condition.
    pub runtime_ready: bool,
    /// Reason and message of `RuntimeReady` when it is false.
    pub runtime_detail: String,
    /// The `NetworkReady` condition (false without a CNI config; not needed for handlers).
    pub network_ready: bool,
    /// Runtime handler names, sorted (the default handler's empty name is left out).
    pub handlers: Vec<String>,
    /// Where `handlers` came from.
    pub handler_source: HandlerSource,
}

/// The port to the container runtime's own view of its health.
pub trait RuntimeHealth {
    /// One CRI `Status` call (verbose), bounded by `timeout`.
    fn status(
        &self,
        timeout: Duration,
    ) -> impl Future<Output = Result<CriStatus, NodeError>> + Send;

    /// Ask until the runtime is ready and lists `handler`, for `timeout` (plus at most
    /// [`MIN_STATUS_CALL_MS`]: the last call is not cut short).
    ///
    /// Fails at once with [`NodeError::CriUnavailable`] when containerd answers that the CRI
    /// service is unimplemented (the CRI plugin failed to load: it will not recover without
    /// a config fix and a restart). Otherwise, at the deadline, fails with the last reason
    /// seen: [`NodeError::CriUnavailable`], [`NodeError::RuntimeNotReady`] or
    /// [`NodeError::HandlerMissing`].
    fn wait_for_handler(
        &self,
        handler: &str,
        timeout: Duration,
    ) -> impl Future<Output = Result<CriStatus, NodeError>> + Send
    where
        Self: Sync,
    {
        async move {
            let deadline = Instant::now() + timeout;
            loop {
                // Every call gets a fair budget, so that a call squeezed into the last
                // milliseconds does not replace a real answer with a timeout.
                let left = deadline.saturating_duration_since(Instant::now());
                let budget = left.clamp(
                    Duration::from_millis(MIN_STATUS_CALL_MS),
                    Duration::from_millis(STATUS_CALL_TIMEOUT_MS),
                );
                let err = match self.status(budget).await {
                    Ok(st) => match check_handler(&st, handler) {
                        Ok(()) => return Ok(st),
                        Err(e) => e,
                    },
                    Err(
                        e @ NodeError::CriUnavailable {
                            plugin_not_loaded: true,
                            ..
                        },
                    ) => return Err(e),
                    Err(e) => e,
                };
                let pause = Duration::from_millis(HANDLER_POLL_INTERVAL_MS);
                if Instant::now() + pause >= deadline {
                    return Err(err);
                }
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Whether a status shows the runtime ready and serving `handler`.
pub fn check_handler(status: &CriStatus, handler: &str) -> Result<(), NodeError> {
    if !status.runtime_ready {
        return Err(NodeError::RuntimeNotReady {
            detail: status.runtime_detail.clone(),
        });
    }
    if !status.handlers.iter().any(|h| h == handler) {
        return Err(NodeError::HandlerMissing {
            handler: handler.to_string(),
            present: status.handlers.clone(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;

    use super::*;

    /// A CRI that answers from a script; the last answer repeats.
    struct Scripted(Mutex<VecDeque<Result<CriStatus, &'static str>>>);

    impl Scripted {
        fn new(answers: Vec<Result<CriStatus, &'static str>>) -> Scripted {
            Scripted(Mutex::new(answers.into()))
        }
    }

    impl RuntimeHealth for Scripted {
        async fn status(&self, _timeout: Duration) -> Result<CriStatus, NodeError> {
            let next = {
                let mut q = self.0.lock().unwrap();
                if q.len() > 1 {
                    q.pop_front()
                } else {
                    q.front().cloned()
                }
            };
            next.expect("a scripted answer")
                .map_err(|what| NodeError::CriUnavailable {
                    socket: "test.sock".into(),
                    detail: what.into(),
                    plugin_not_loaded: what == "unimplemented",
                })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_for_a_handler_polls_until_it_is_served() {
        let cri = Scripted::new(vec![
            Err("connection refused"),
            Ok(CriStatus::default()),
            Ok(ready(&["runc"])),
            Ok(ready(&["runc", "spin"])),
        ]);
        let t0 = Instant::now();
        let st = cri
            .wait_for_handler("spin", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(st.handlers, vec!["runc", "spin"]);
        assert_eq!(
            t0.elapsed(),
            Duration::from_millis(3 * HANDLER_POLL_INTERVAL_MS)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_unimplemented_cri_fails_at_once() {
        let cri = Scripted::new(vec![Err("unimplemented")]);
        let t0 = Instant::now();
        let e = cri
            .wait_for_handler("spin", Duration::from_secs(30))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "CriUnavailable");
        assert_eq!(t0.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_never_served_fails_with_the_last_answer_at_the_deadline() {
        let cri = Scripted::new(vec![Err("connection refused"), Ok(ready(&["runc"]))]);
        let t0 = Instant::now();
        let e = cri
            .wait_for_handler("spin", Duration::from_secs(2))
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "HandlerMissing");
        assert!(t0.elapsed() <= Duration::from_secs(2), "{:?}", t0.elapsed());
        assert!(
            t0.elapsed() >= Duration::from_millis(1_900),
            "{:?}",
            t0.elapsed()
        );
    }

    fn ready(handlers: &[&str]) -> CriStatus {
        CriStatus {
            runtime_ready: true,
            handlers: handlers.iter().map(|h| h.to_string()).collect(),
            ..CriStatus::default()
        }
    }

    #[test]
    fn a_listed_handler_on_a_ready_runtime_passes() {
        assert!(check_handler(&ready(&["runc", "spin"]), "spin").is_ok());
    }

    #[test]
    fn a_missing_handler_names_what_is_there() {
        let e = check_handler(&ready(&["runc"]), "spin").unwrap_err();
        assert_eq!(e.reason(), "HandlerMissing");
        assert_eq!(
            e.to_string(),
            "containerd does not serve runtime handler `spin` (it serves: runc)"
        );
    }

    #[test]
    fn a_runtime_not_ready_fails_even_with_the_handler_listed() {
        let st = CriStatus {
            runtime_ready: false,
            runtime_detail: "NotReady: boom".into(),
            ..ready(&["spin"])
        };
        assert_eq!(
            check_handler(&st, "spin").unwrap_err().reason(),
            "RuntimeNotReady"
        );
    }

    #[test]
    fn restart_errors_name_the_unit_and_the_job_result() {
        let e = NodeError::RestartFailed {
            unit: "containerd.service".into(),
            job_result: "failed".into(),
            state: Box::new(UnitState {
                active_state: "activating".into(),
                sub_state: "auto-restart".into(),
                result: "exit-code".into(),
                ..UnitState::default()
            }),
        };
        assert_eq!(
            e.to_string(),
            "restart of containerd.service failed: job result `failed`, unit now \
             activating/auto-restart (result exit-code)"
        );
        assert_eq!(e.reason(), "RestartFailed");
    }
}
