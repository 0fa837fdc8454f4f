//! A node whose containerd answers at once and runs every runtime: the ports for the benches
//! that measure the engine's own work (`txn_overhead`, `task_scan`), not containerd's.

use std::path::PathBuf;
use std::time::Duration;

use shim_agent::node::NodeError;
use shim_agent::node::check::{CheckReport, HandlerCheck};
use shim_agent::txn::{HealthCheck, Restarter};

/// Restarts at once, serves and runs every handler; `socket_dir`: where containerd's task
/// bundles are looked for (the retained-version scan).
pub struct InstantNode(pub Option<PathBuf>);

impl Restarter for InstantNode {
    async fn restart(&self, _unit: &str) -> Result<(), NodeError> {
        Ok(())
    }
}

impl HealthCheck for InstantNode {
    async fn prove(
        &self,
        checks: &[HandlerCheck],
    ) -> Result<Vec<CheckReport>, Vec<(String, NodeError)>> {
        Ok(checks
            .iter()
            .map(|c| CheckReport {
                handler: c.handler.clone(),
                sandbox: Duration::ZERO,
                container: None,
                total: Duration::ZERO,
            })
            .collect())
    }

    async fn sweep_checks(&self) -> Result<usize, NodeError> {
        Ok(0)
    }

    async fn sandbox_ready(&self) -> Result<(), NodeError> {
        Ok(())
    }

    async fn runtime_version(&self) -> Option<String> {
        None
    }

    async fn verify(&self, _present: &[String], _absent: &[String]) -> Result<(), NodeError> {
        Ok(())
    }

    fn socket_dir(&self) -> Option<PathBuf> {
        self.0.clone()
    }
}
