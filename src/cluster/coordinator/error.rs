//! What went wrong in a coordinator write: the step and the API's answer, each with a stable
//! reason (a log field and the label of `shim_agent_coordinator_errors_total`), and how long
//! a Shim whose reconcile failed waits before it is looked at again ([`retry_delay`]).

use std::time::Duration;

use thiserror::Error;

use crate::cluster::api_answer::ApiAnswer;

/// Pause before a Shim whose reconcile failed because the server was away or overloaded (or
/// answered oddly) is looked at again.
pub const RETRY_SECS: u64 = 5;

/// Pause after a race (someone wrote first, the object went): the next round reads again.
pub const RACE_RETRY_MILLIS: u64 = 1000;

/// Pause after a refusal (forbidden, invalid): the same write is refused again until someone
/// changes the RBAC, a policy or the Shim (a Shim's change brings a round at once anyway).
pub const REFUSED_RETRY_SECS: u64 = 30;

/// How long a Shim whose reconcile failed with `answer` waits before it is looked at again:
/// a race at once-ish, an unavailable server after [`RETRY_SECS`], a refusal after
/// [`REFUSED_RETRY_SECS`] (retrying it every few seconds would only warn every few seconds).
pub fn retry_delay(answer: ApiAnswer) -> Duration {
    match answer {
        ApiAnswer::Conflict | ApiAnswer::NotFound => Duration::from_millis(RACE_RETRY_MILLIS),
        ApiAnswer::Unavailable | ApiAnswer::Other => Duration::from_secs(RETRY_SECS),
        ApiAnswer::Forbidden | ApiAnswer::Invalid => Duration::from_secs(REFUSED_RETRY_SECS),
    }
}

/// A write of the coordinator that failed; it is tried again at a later round.
#[derive(Debug, Error)]
pub enum CoordinatorError {
    #[error("cannot write the finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    #[error("cannot write the RuntimeClass: {0}")]
    RuntimeClass(#[source] kube::Error),
    #[error("cannot write the status: {0}")]
    Status(#[source] kube::Error),
    #[error("cannot write a rollout slot: {0}")]
    Slot(#[source] kube::Error),
    #[error("cannot remove a startup taint: {0}")]
    StartupTaint(#[source] kube::Error),
    #[error("cannot point a Node at its reserved slots: {0}")]
    ReservationHint(#[source] kube::Error),
    #[error("cannot take or renew the coordinator lease: {0}")]
    Election(#[source] kube::Error),
}

impl CoordinatorError {
    pub fn finalizer(e: kube::Error) -> Self {
        CoordinatorError::Finalizer(e)
    }
    pub fn runtime_class(e: kube::Error) -> Self {
        CoordinatorError::RuntimeClass(e)
    }
    pub fn status(e: kube::Error) -> Self {
        CoordinatorError::Status(e)
    }

    /// Which write failed.
    pub fn step(&self) -> &'static str {
        match self {
            CoordinatorError::Finalizer(_) => "finalizer",
            CoordinatorError::RuntimeClass(_) => "runtime_class",
            CoordinatorError::Status(_) => "status",
            CoordinatorError::Slot(_) => "slot",
            CoordinatorError::StartupTaint(_) => "startup_taint",
            CoordinatorError::ReservationHint(_) => "reservation_hint",
            CoordinatorError::Election(_) => "election",
        }
    }

    /// Why, from the API's answer: `Conflict` (someone wrote first: the next round reads
    /// again), `NotFound`, `Forbidden` (RBAC or an admission policy), `Invalid`,
    /// `Unavailable` (5xx, 429, no connection), `Other`.
    pub fn reason(&self) -> &'static str {
        self.answer().as_str()
    }

    /// The API's answer.
    fn answer(&self) -> ApiAnswer {
        let (CoordinatorError::Finalizer(e)
        | CoordinatorError::RuntimeClass(e)
        | CoordinatorError::Status(e)
        | CoordinatorError::Slot(e)
        | CoordinatorError::StartupTaint(e)
        | CoordinatorError::ReservationHint(e)
        | CoordinatorError::Election(e)) = self;
        ApiAnswer::of(e)
    }

    /// How long the Shim whose reconcile failed with this waits: by the API's answer, a race
    /// about a second, an away server 5 s, a refusal 30 s (see `retry_delay`).
    pub fn retry_after(&self) -> Duration {
        retry_delay(self.answer())
    }

    /// Someone else wrote first (a 409) or the object went (a 404): expected while agents
    /// and the coordinator race, and settled by the next round.
    pub fn is_race(&self) -> bool {
        matches!(self.answer(), ApiAnswer::Conflict | ApiAnswer::NotFound)
    }

    /// Count it (`shim_agent_coordinator_errors_total{step, reason}`) and log it: a race at
    /// debug level, anything else as a warning.
    pub fn record(&self, what: &str) {
        crate::telemetry::coordinator_error(self.step(), self.reason());
        if self.is_race() {
            tracing::debug!(
                step = self.step(),
                reason = self.reason(),
                "{what}: {self}; next round"
            );
        } else {
            tracing::warn!(
                step = self.step(),
                reason = self.reason(),
                "{what}: {self}; retrying"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::api_answer::api_error as api;

    #[test]
    fn every_step_has_a_name_and_every_answer_a_reason() {
        let e = CoordinatorError::Slot(api(409));
        assert_eq!(
            (e.step(), e.reason(), e.is_race()),
            ("slot", "Conflict", true)
        );
        let e = CoordinatorError::StartupTaint(api(403));
        assert_eq!(
            (e.step(), e.reason(), e.is_race()),
            ("startup_taint", "Forbidden", false)
        );
        let e = CoordinatorError::ReservationHint(api(404));
        assert_eq!(
            (e.step(), e.reason(), e.is_race()),
            ("reservation_hint", "NotFound", true)
        );
        let e = CoordinatorError::Election(api(503));
        assert_eq!((e.step(), e.reason()), ("election", "Unavailable"));
        assert_eq!(CoordinatorError::Status(api(422)).reason(), "Invalid");
    }

    #[test]
    fn a_race_retries_at_once_an_away_server_soon_and_a_refusal_after_a_while() {
        let after = |code: u16| CoordinatorError::RuntimeClass(api(code)).retry_after();
        let secs = Duration::from_secs;
        assert!(after(409) <= secs(1) && after(404) <= secs(1));
        assert_eq!((after(503), after(429)), (secs(5), secs(5)));
        assert_eq!(
            (after(403), after(422), after(400)),
            (secs(30), secs(30), secs(30))
        );
        assert_eq!(retry_delay(ApiAnswer::Other), secs(RETRY_SECS));
    }
}
