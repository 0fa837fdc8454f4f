//! Committed: the transaction's Shims recorded as installed (with the hashes of the config
//! files it wrote), the versions it replaced retired until no task runs them (`retain`), and
//! the journal closed.

use super::files::backups_dir;
use super::host::{Node, Report};
use super::machine::Event;
use super::notices;
use super::ports::{HealthCheck, Restarter};
use super::record::{merge_config_records, now_secs, sha256_hex};
use super::retain;
use crate::artifact;
use crate::state::{ConfigRecord, InstalledShim, Journal, NodeState, StateStore};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    pub(super) fn close(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        j: &Journal,
    ) -> anyhow::Result<()> {
        state.journal = None;
        store.save(state)?;
        let _ = std::fs::remove_dir_all(backups_dir(store.dir(), &j.id));
        Ok(())
    }

    pub(super) fn commit(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        let mut old = Vec::new();
        for name in j
            .shims
            .iter()
            .filter(|n| !j.pending.iter().any(|p| &p.name == *n))
        {
            if let Some(rec) = state.shims.remove(name) {
                report.removed.push(name.clone());
                old.push(rec);
            }
        }
        // the config files as the transaction left them, read and hashed once for the batch
        let files: Vec<ConfigRecord> = j
            .backups
            .iter()
            .filter(|b| !b.path.starts_with(artifact::SHIMS_DIR))
            .map(|b| ConfigRecord {
                path: b.path.clone(),
                sha256_before: b.sha256.clone(),
                sha256_after: self
                    .root
                    .resolve(&b.path)
                    .ok()
                    .and_then(|l| std::fs::read(l).ok())
                    .map(|x| sha256_hex(&x)),
            })
            .collect();
        for mut rec in j.pending.clone() {
            let prev = state.shims.get(&rec.name).cloned();
            rec.config_files = merge_config_records(prev.as_ref(), files.clone());
            if let Some(p) = prev
                && p.binary != rec.binary
            {
                old.push(p);
            }
            report.installed.push(rec.name.clone());
            state.shims.insert(rec.name.clone(), rec);
        }
        // The replaced versions are recorded in the same write as the commit: they go only
        // once no containerd task runs through them (retain.rs).
        let versions: Vec<(String, String)> = old
            .iter()
            .map(|r| (r.name.clone(), r.artifact_sha256.clone()))
            .collect();
        retain::retire(state, &versions, now_secs());
        self.event(store, state, Event::Committed)?;
        self.close(store, state, &j)?;
        let installed: Vec<InstalledShim> = j
            .pending
            .iter()
            .filter_map(|p| state.shims.get(&p.name).cloned())
            .collect();
        let removed: Vec<InstalledShim> = old
            .iter()
            .filter(|r| !state.shims.contains_key(&r.name))
            .cloned()
            .collect();
        notices::committed(&j, &installed, &removed);
        self.collect_after(store, state);
        Ok(())
    }

    /// Collect retained versions after a transaction ended; a failure is logged (the
    /// transaction's outcome stands, the next collection tries again).
    pub(super) fn collect_after(&self, store: &StateStore, state: &mut NodeState) {
        if let Err(e) = self.collect_retained(store, state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
    }
}
