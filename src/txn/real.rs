//! The live transaction's ports on a real node: systemd over D-Bus restarts containerd, and
//! containerd's own CRI `Status` says whether it serves the handlers.

use std::time::{Duration, Instant};

use super::ports::{HealthCheck, Restarter};
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
/// none of the removed ones is.
pub struct CriHealth {
    pub cri: CriClient,
    pub timeout: Duration,
}

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
        },
        profile,
    })
}
