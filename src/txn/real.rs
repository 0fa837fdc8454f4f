//! The live transaction's ports on a real node: systemd over D-Bus restarts containerd, and
//! containerd's own CRI `Status` says whether it serves the handlers.

use std::time::{Duration, Instant};

use super::ports::{HealthCheck, Restarter};
use crate::node::check::{self, CheckPlace, CheckReport, HandlerCheck};
use crate::node::{CriClient, NodeError, RuntimeHealth, ServiceManager, SystemdDbus};

/// [`Restarter`] through systemd's D-Bus API.
pub struct SystemdRestarter {
    pub systemd: SystemdDbus,
    pub timeout: Duration,
}

impl Restarter for SystemdRestarter {
    async fn restart(&self, unit: &str) -> Result<(), NodeError> {
        let out = self.systemd.restart_unit(unit, self.timeout).await;
        crate::telemetry::containerd_restarted(out.is_ok());
        let out = out?;
        tracing::info!(unit, job = %out.job_result, elapsed_ms = out.elapsed.as_millis() as u64, state = %out.state.summary(), "containerd restarted");
        Ok(())
    }
}

/// [`HealthCheck`] through CRI: the runtime is ready, every expected handler is listed and
/// none of the removed ones is; each new handler runs a pod sandbox (and its check container).
pub struct CriHealth {
    pub cri: CriClient,
    pub timeout: Duration,
    /// Where the functional checks write and how long they may take; `None`: the node's
    /// config turned them off (`check.sandbox = false`).
    pub check: Option<CheckPlace>,
}

/// How many handlers are checked at once.
const CHECKS_AT_ONCE: usize = 4;

impl HealthCheck for CriHealth {
    fn socket_dir(&self) -> Option<std::path::PathBuf> {
        // through one link (the node env links the socket from the container's /run)
        let socket = self.cri.socket();
        let real = std::fs::read_link(socket)
            .map(|t| match socket.parent() {
                Some(dir) if t.is_relative() => dir.join(t),
                _ => t,
            })
            .unwrap_or_else(|_| socket.to_path_buf());
        real.parent().map(std::path::Path::to_path_buf)
    }

    async fn prove(
        &self,
        checks: &[HandlerCheck],
    ) -> Result<Vec<CheckReport>, Vec<(String, NodeError)>> {
        let Some(place) = &self.check else {
            return Ok(Vec::new());
        };
        let mut passed = Vec::new();
        let mut failed = Vec::new();
        for group in checks.chunks(CHECKS_AT_ONCE) {
            let runs = group
                .iter()
                .map(|c| async move { (c, check::check_handler(&self.cri, c, place).await) });
            for (c, result) in futures_util::future::join_all(runs).await {
                match result {
                    Ok(report) => passed.push(report),
                    Err(e) => failed.push((c.handler.clone(), e)),
                }
            }
        }
        for r in &passed {
            crate::telemetry::runtime_checked("");
            crate::telemetry::runtime_check_took("sandbox", r.sandbox);
            if let Some(c) = r.container {
                crate::telemetry::runtime_check_took("container", c);
            }
            crate::telemetry::runtime_check_took("total", r.total);
        }
        for (_, e) in &failed {
            crate::telemetry::runtime_checked(e.reason());
        }
        if failed.is_empty() {
            Ok(passed)
        } else {
            Err(failed)
        }
    }

    async fn sweep_checks(&self) -> Result<usize, NodeError> {
        if self.check.is_none() {
            return Ok(0);
        }
        check::sweep(&self.cri).await
    }

    async fn sandbox_ready(&self) -> Result<(), NodeError> {
        let Some(place) = &self.check else {
            return Ok(());
        };
        match check::node_runs_pods(&self.cri, place).await {
            Err(e @ NodeError::NoSandboxImage { .. }) => Err(e),
            // a containerd that does not answer now is asked again after the restart
            Err(_) | Ok(()) => Ok(()),
        }
    }

    async fn runtime_version(&self) -> Option<String> {
        let v = self.cri.version(Duration::from_secs(5)).await.ok()?;
        Some(v.runtime_version).filter(|v| !v.is_empty())
    }

    async fn verify(&self, present: &[String], absent: &[String]) -> Result<(), NodeError> {
        let deadline = Instant::now() + self.timeout;
        for h in present {
            let left = deadline.saturating_duration_since(Instant::now());
            self.cri
                .wait_for_handler(h, left.max(Duration::from_millis(1)))
                .await?;
        }
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let st = match self
                .cri
                .status(left.clamp(Duration::from_millis(1), Duration::from_secs(2)))
                .await
            {
                Ok(st) => st,
                // CRI answers "not initialized yet" for a moment after a restart: ask again,
                // unless the plugin did not load at all (that needs a config fix).
                Err(
                    e @ NodeError::CriUnavailable {
                        plugin_not_loaded: true,
                        ..
                    },
                ) => return Err(e),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if !st.runtime_ready {
                if Instant::now() >= deadline {
                    return Err(NodeError::RuntimeNotReady {
                        detail: st.runtime_detail,
                    });
                }
            } else {
                let still: Vec<String> = absent
                    .iter()
                    .filter(|h| st.handlers.contains(h))
                    .cloned()
                    .collect();
                if still.is_empty() {
                    return Ok(());
                }
                if Instant::now() >= deadline {
                    return Err(NodeError::HandlerStillServed { handlers: still });
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The node as seen from here: systemd on the system bus restarts containerd, its CRI socket
/// (`CONTAINERD_ADDRESS`, else the profile's under `root`) verifies.
pub async fn live_node<'a>(
    root: &'a crate::hostroot::HostRoot,
    settings: &'a crate::settings::Settings,
    origin: crate::state::Origin,
) -> anyhow::Result<super::Node<'a, SystemdRestarter, CriHealth>> {
    use anyhow::Context;
    let profile = crate::profile::resolve(root, &settings.containerd);
    let socket = match std::env::var_os("CONTAINERD_ADDRESS") {
        Some(s) => std::path::PathBuf::from(s),
        None => root.resolve(&profile.socket)?,
    };
    let systemd = SystemdDbus::connect_system()
        .await
        .context("cannot reach systemd on the system bus")?;
    let secs = Duration::from_secs;
    Ok(super::Node {
        root,
        settings,
        platform: crate::artifact::node_platform(),
        origin,
        restarter: SystemdRestarter {
            systemd,
            timeout: secs(settings.containerd.restart_timeout_secs),
        },
        health: CriHealth {
            cri: CriClient::new(socket),
            timeout: secs(settings.containerd.verify_timeout_secs),
            check: check_place(root, settings)?,
        },
        profile,
    })
}

/// Where the functional checks of a live node write (`<state-dir>/checks`), as containerd
/// sees it and as this process reaches it; `None` when `check.sandbox` is off.
pub fn check_place(
    root: &crate::hostroot::HostRoot,
    settings: &crate::settings::Settings,
) -> anyhow::Result<Option<CheckPlace>> {
    if !settings.check.sandbox {
        return Ok(None);
    }
    let logs_node = crate::node::check::checks_dir(&settings.paths.state_dir);
    Ok(Some(CheckPlace {
        logs_local: root.resolve(&logs_node)?,
        logs_node,
        sandbox_timeout: Duration::from_secs(settings.check.sandbox_timeout_secs),
    }))
}
