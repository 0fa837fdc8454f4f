//! What went wrong in a coordinator write: the step and the API's answer, each with a stable
//! reason (a log field and the label of `shim_agent_coordinator_errors_total`).

use thiserror::Error;

/// A write of the coordinator that failed; the Shim is looked at again shortly.
#[derive(Debug, Error)]
pub enum CoordinatorError {
    #[error("cannot write the finalizer: {0}")]
    Finalizer(#[source] kube::Error),
    #[error("cannot write the RuntimeClass: {0}")]
    RuntimeClass(#[source] kube::Error),
    #[error("cannot write the status: {0}")]
    Status(#[source] kube::Error),
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
        }
    }

    /// Why, from the API's answer: `Conflict` (someone wrote first: the next round reads
    /// again), `NotFound`, `Forbidden` (RBAC or an admission policy), `Invalid`,
    /// `Unavailable` (5xx, 429, no connection), `Other`.
    pub fn reason(&self) -> &'static str {
        let (CoordinatorError::Finalizer(e)
        | CoordinatorError::RuntimeClass(e)
        | CoordinatorError::Status(e)) = self;
        match e {
            kube::Error::Api(s) => match s.code {
                409 => "Conflict",
                404 => "NotFound",
                403 => "Forbidden",
                400 | 422 => "Invalid",
                429 | 500..=599 => "Unavailable",
                _ => "Other",
            },
            kube::Error::HyperError(_) | kube::Error::Service(_) => "Unavailable",
            _ => "Other",
        }
    }
}
