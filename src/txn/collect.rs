//! The node's side of retained versions ([`super::retain`] decides): scan containerd's
//! tasks, retire stray version directories, and delete the versions no task uses any more.

use std::collections::BTreeSet;
use std::path::Path;

use super::engine::Node;
use super::files::gc_artifact;
use super::ports::{HealthCheck, Restarter};
use super::record::now_secs;
use super::retain::{dir_of, judge, retire};
use crate::artifact::{self, Store};
use crate::node::tasks::{self, TaskScan};
use crate::state::{NodeState, RetainedVersion, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    /// Every task containerd records on this node.
    pub fn scan_tasks(&self) -> TaskScan {
        let config = self
            .root
            .resolve(&self.profile.config)
            .ok()
            .and_then(|p| std::fs::read_to_string(p).ok());
        let dirs = tasks::state_dirs(&self.profile.socket, config.as_deref());
        let reached: Vec<std::path::PathBuf> = self
            .health
            .socket_dir()
            .into_iter()
            .flat_map(|d| [d.join("containerd"), d])
            .collect();
        tasks::scan(self.root, &dirs, &reached)
    }

    /// Directories under the shims directory that neither an installed record nor a
    /// retained one names (left by a crash, or by an older agent): retired like the rest.
    pub(super) fn retire_strays(&self, state: &mut NodeState) {
        let Ok(base) = self.root.resolve(artifact::SHIMS_DIR) else {
            return;
        };
        let known: BTreeSet<String> = state
            .shims
            .values()
            .map(dir_of)
            .chain(state.retained.iter().map(|r| r.dir.clone()))
            .collect();
        let mut strays = Vec::new();
        for shim in read_names(&base) {
            for version in read_names(&base.join(&shim)) {
                let dir = Path::new(artifact::SHIMS_DIR).join(&shim).join(&version);
                if !known.contains(&dir.display().to_string()) {
                    strays.push((shim.clone(), version));
                }
            }
        }
        retire(state, &strays, now_secs());
    }

    /// Delete the retained versions no task uses any more (see the module's guarantees);
    /// does nothing while a transaction is open.
    pub fn collect_retained(
        &self,
        store: &StateStore,
        state: &mut NodeState,
    ) -> anyhow::Result<()> {
        if state.journal.is_some() {
            return Ok(());
        }
        if state.retained.is_empty() {
            publish(state);
            return Ok(());
        }
        let installed: BTreeSet<String> = state.shims.values().map(dir_of).collect();
        let j = judge(&state.retained, &self.scan_tasks(), &installed);
        let artifacts = Store::open(store.dir().join("store"))?;
        for v in &j.drop {
            if let Err(e) = self.remove_version(v) {
                tracing::warn!(shim = %v.name, digest = %v.digest, "cannot remove a retained version yet: {e:#}");
                continue;
            }
            tracing::info!(shim = %v.name, digest = %v.digest, "removed a replaced version: no containerd task uses it");
        }
        let before = state.retained.clone();
        state.retained = j.keep;
        // versions that failed to go stay recorded
        for v in &j.drop {
            if self.root.resolve(&v.dir).is_ok_and(|p| p.exists()) {
                state.retained.push(v.clone());
            }
        }
        if state.retained != before {
            store.save(state)?;
        }
        for v in &j.drop {
            if !state.retained.iter().any(|r| r.digest == v.digest) {
                gc_artifact(&artifacts, state, &v.digest)?;
            }
        }
        publish(state);
        Ok(())
    }

    fn remove_version(&self, v: &RetainedVersion) -> anyhow::Result<()> {
        let local = self.root.resolve(&v.dir)?;
        match std::fs::remove_dir_all(&local) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(parent) = local.parent() {
            let _ = std::fs::remove_dir(parent); // only when empty
        }
        Ok(())
    }
}

/// The retained versions in the metrics.
fn publish(state: &NodeState) {
    let v: Vec<(String, usize)> = state
        .retained
        .iter()
        .map(|r| (r.name.clone(), r.task_count))
        .collect();
    crate::telemetry::retained(&v);
}

fn read_names(dir: &Path) -> Vec<String> {
    crate::fsutil::subdir_names(dir).unwrap_or_default()
}
