//! The two narrow ports through which a transaction reaches the world, and the image root's
//! implementation of them.
//!
//! A live node restarts containerd through systemd and asks containerd's CRI whether it serves
//! the handlers ([`real`](super::real)). An image root (`install --root DIR`) has no running
//! containerd: its restart does nothing and its health check cannot prove anything, so a
//! shim committed there is recorded `pending-verification`, for the agent to verify on the
//! node's first boot. The same engine runs both.

use std::future::Future;

use super::error::GateError;
use crate::node::NodeError;
use crate::node::check::{CheckReport, HandlerCheck};
use crate::state::ShimState;

/// Restarts containerd's unit (systemd over D-Bus in production).
pub trait Restarter {
    /// Restart `unit` and wait for the job; `Err` carries the unit and the job result.
    fn restart(&self, unit: &str) -> impl Future<Output = Result<(), NodeError>>;
}

/// Asks containerd itself whether it serves the runtime handlers (CRI `Status`).
pub trait HealthCheck {
    /// Succeed when the runtime is ready, every handler in `present` is served and none in
    /// `absent` is; `Err` says what is wrong.
    fn verify(
        &self,
        present: &[String],
        absent: &[String],
    ) -> impl Future<Output = Result<(), NodeError>>;

    /// Prove that each handler of `checks` works (docs/design.md §3): a pod sandbox started
    /// through it, ready, and its check container where it names one; everything the checks
    /// make is gone after. `Err`: every handler that failed, with why.
    fn prove(
        &self,
        checks: &[HandlerCheck],
    ) -> impl Future<Output = Result<Vec<CheckReport>, Vec<(String, NodeError)>>>;

    /// Remove what checks interrupted by a crash or a timeout left behind (at start, before
    /// a recovery proves anything): how many sandboxes went.
    fn sweep_checks(&self) -> impl Future<Output = Result<usize, NodeError>>;

    /// Before a restart: whether a pod sandbox can start at all here (containerd has its
    /// sandbox image, or pulls it). `Err(`[`NodeError::NoSandboxImage`]`)`: no pod can run
    /// on this node, with any runtime; containerd is not restarted for nothing. A containerd
    /// that does not answer is no reason to stop here (the check after the restart decides).
    fn sandbox_ready(&self) -> impl Future<Output = Result<(), NodeError>>;

    /// containerd's version as its CRI `Version` reports it (`1.6.20~ds1`, `v2.3.4`), which
    /// picks a Shim's build; `None` when nothing answers.
    fn runtime_version(&self) -> impl Future<Output = Option<String>>;

    /// False when nothing can answer [`verify`](Self::verify) for real (an image root):
    /// shims are then recorded `pending-verification`, and an interrupted transaction is
    /// rolled back, never forward, since nothing can prove its new state works.
    fn proves(&self) -> bool {
        true
    }

    /// containerd's socket directory as this process reaches it, when that differs from the
    /// profile's path under the root (a live root in another mount namespace, whose `/run` is
    /// not the root's): containerd keeps its task bundles beside its socket
    /// ([`crate::node::tasks`]). `None`: look under the root only.
    fn socket_dir(&self) -> Option<std::path::PathBuf> {
        None
    }

    /// The state a committed shim is recorded in.
    fn committed_state(&self) -> ShimState {
        if self.proves() {
            ShimState::Installed
        } else {
            ShimState::PendingVerification
        }
    }
}

/// The image root's restart port: there is no containerd to restart.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoRestart;

impl Restarter for NoRestart {
    async fn restart(&self, _unit: &str) -> Result<(), NodeError> {
        Ok(())
    }
}

/// The image root's health port: verification is deferred to the node's first boot, where
/// the agent proves a pre-baked shim before it adopts it. `containerd_version`: the version
/// of the containerd the image runs (the builder's `--containerd-version`, or read from the
/// image), which picks a Shim's build.
#[derive(Debug, Clone, Default)]
pub struct DeferredVerification {
    pub containerd_version: Option<String>,
}

impl HealthCheck for DeferredVerification {
    async fn verify(&self, _present: &[String], _absent: &[String]) -> Result<(), NodeError> {
        Ok(())
    }

    async fn prove(
        &self,
        _checks: &[HandlerCheck],
    ) -> Result<Vec<CheckReport>, Vec<(String, NodeError)>> {
        Ok(Vec::new())
    }

    async fn sweep_checks(&self) -> Result<usize, NodeError> {
        Ok(0)
    }

    async fn sandbox_ready(&self) -> Result<(), NodeError> {
        Ok(())
    }

    async fn runtime_version(&self) -> Option<String> {
        self.containerd_version.clone()
    }

    fn proves(&self) -> bool {
        false
    }
}

/// The rollout gate (docs/design.md §5): a slot of every Shim whose change restarts
/// containerd, held from before the host changes until the transaction ends.
pub trait Gate {
    /// Wait for (or adopt) a slot of each of `shims`; `Err`: the restart may not happen.
    fn acquire(&self, shims: &[String]) -> impl Future<Output = Result<(), GateError>>;
    /// Renew the held slots right before the restart; `Err`: do not restart.
    fn renew(&self) -> impl Future<Output = Result<(), GateError>>;
    /// The transaction committed: give the slots back.
    fn release(&self) -> impl Future<Output = ()>;
    /// The transaction failed: keep the slots, marked failed with `reason`.
    fn failed(&self, reason: &str) -> impl Future<Output = ()>;
}

/// No rollout control (static Shims, the CLI, an image root): every restart may happen.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ungated;

impl Gate for Ungated {
    async fn acquire(&self, _shims: &[String]) -> Result<(), GateError> {
        Ok(())
    }
    async fn renew(&self) -> Result<(), GateError> {
        Ok(())
    }
    async fn release(&self) {}
    async fn failed(&self, _reason: &str) {}
}

/// A gate whose release, once the transaction committed, waits for [`ReleaseLater::finish`]:
/// the agent gives its slots back beside the Node's label patch instead of before it, one
/// round trip less between a commit and the label the scheduler waits for. A failure is
/// marked at once, as before.
#[derive(Debug)]
pub struct ReleaseLater<G> {
    inner: G,
    due: std::sync::atomic::AtomicBool,
}

impl<G: Gate> ReleaseLater<G> {
    pub fn new(inner: G) -> Self {
        Self {
            inner,
            due: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Give the slots back if the transaction committed (once; a no-op otherwise).
    pub async fn finish(&self) {
        if self.due.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.inner.release().await;
        }
    }
}

impl<G: Gate> Gate for ReleaseLater<G> {
    async fn acquire(&self, shims: &[String]) -> Result<(), GateError> {
        self.inner.acquire(shims).await
    }
    async fn renew(&self) -> Result<(), GateError> {
        self.inner.renew().await
    }
    async fn release(&self) {
        self.due.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    async fn failed(&self, reason: &str) {
        self.inner.failed(reason).await;
    }
}
