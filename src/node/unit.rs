//! A systemd unit as the service manager reports it, and what a restart of it did.

use std::time::Duration;

/// A systemd unit's state, as its D-Bus object reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitState {
    /// `ActiveState`: `active`, `activating`, `failed`, `inactive`, ...
    pub active_state: String,
    /// `SubState`: `running`, `auto-restart`, `failed`, ...
    pub sub_state: String,
    /// The service's `Result`: `success`, `exit-code`, `start-limit-hit`, ... (empty for
    /// units that are not services).
    pub result: String,
    /// `MainPID` (0 when not running).
    pub main_pid: u32,
    /// `InvocationID` as hex; a new one for every start of the unit.
    pub invocation_id: String,
    /// `NRestarts`: automatic restarts only (`Restart=`), not restarts asked for.
    pub n_restarts: u32,
}

impl UnitState {
    /// `active/running (result success)`, for messages.
    pub fn summary(&self) -> String {
        format!(
            "{}/{} (result {})",
            self.active_state,
            self.sub_state,
            if self.result.is_empty() {
                "-"
            } else {
                &self.result
            }
        )
    }
}

/// What a restart did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestartOutcome {
    /// The job's result from `JobRemoved`: `done`, `failed`, `timeout`, `canceled`,
    /// `dependency` or `skipped`. [`ServiceManager::restart_unit`] returns an outcome only
    /// for `done`; every other result is an error carrying it.
    pub job_result: String,
    /// From the `RestartUnit` call to the job's `JobRemoved` signal (of the last attempt).
    pub elapsed: Duration,
    /// The unit's state right after the job finished.
    pub state: UnitState,
    /// True when the first attempt hit the start limit and the unit was reset and restarted.
    pub retried_after_start_limit: bool,
}
