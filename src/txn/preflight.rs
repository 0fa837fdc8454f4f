//! The preflight of a new shim, on its verified copy in the store, before any rollout slot is
//! asked for and before containerd is touched (docs/design.md §3): its ELF interpreter and
//! every library it needs must resolve on the node (`artifact::check_links`), and the shim must
//! answer `-v` (`node::shim_version`), whose version is recorded. A failure blames its Shim
//! alone and is counted in `shim_agent_runtime_checks` by its reason; nothing on the host
//! changed.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;

use futures_util::future::join_all;

use super::error::TxnError;
use super::host::Node;
use super::ports::{HealthCheck, Restarter};
use crate::api::Shim;
use crate::artifact;
use crate::node::shim_version::shim_version;
use crate::state::CheckRecord;

/// How many shims of a batch are asked their version at once.
const PREFLIGHTS_AT_ONCE: usize = 8;

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// The preflight of each Shim's binary (in the store), up to [`PREFLIGHTS_AT_ONCE`] side by
    /// side: the versions they told, in order; `Err` blames the first Shim that failed.
    pub(super) async fn preflight_all(
        &self,
        items: &[(&Shim, &Path)],
    ) -> Result<Vec<Option<String>>, TxnError> {
        let mut versions = Vec::with_capacity(items.len());
        for group in items.chunks(PREFLIGHTS_AT_ONCE) {
            let runs = group.iter().map(|(shim, bin)| self.preflight(shim, bin));
            for ((shim, _), ran) in group.iter().zip(join_all(runs).await) {
                versions.push(ran.map_err(|e| failed_preflight(shim, e))?);
            }
        }
        Ok(versions)
    }

    /// The preflight of `shim`'s binary at `bin` (in the store): its version when it told
    /// one; `Err` names what is missing or why it does not run.
    async fn preflight(&self, shim: &Shim, bin: &Path) -> anyhow::Result<Option<String>> {
        let context = || format!("Shim {:?}: preflight of its binary", shim.name());
        artifact::check_links(self.root, bin).with_context(context)?;
        let runs_here = self.platform.arch == artifact::node_platform().arch;
        let timeout = Duration::from_secs(self.settings.check.version_timeout_secs);
        let version = shim_version(self.root, bin, runs_here, timeout)
            .await
            .with_context(context)?;
        if let Some(v) = &version {
            tracing::info!(shim = %shim.name(), version = %v, "the shim tells its version");
        }
        Ok(version)
    }
}

/// A failed preflight as the transaction's error, counted among the failed runtime checks
/// by its reason (`MissingLibraries`, `ShimDoesNotRun`): one series with the sandbox check's.
fn failed_preflight(shim: &Shim, e: anyhow::Error) -> TxnError {
    let te = TxnError::unprepared(shim.name(), e);
    crate::telemetry::runtime_checked(te.reason());
    te
}

/// The Shim's check container as the state records it (`spec.check.container`).
pub fn check_record(shim: &Shim) -> Option<CheckRecord> {
    let c = shim.spec.check.as_ref()?.container.as_ref()?;
    Some(CheckRecord {
        image: c.image.clone(),
        command: c.command.clone(),
        args: c.args.clone().unwrap_or_default(),
        exit_code: c.exit_code(),
        output_contains: c.success.as_ref().and_then(|s| s.output_contains.clone()),
        timeout_secs: c.timeout().as_secs(),
    })
}
