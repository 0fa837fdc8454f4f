//! The node's side of retained versions ([`super::retain`] decides): scan containerd's
//! tasks, retire stray version directories, and delete the versions no task uses any more.

use std::collections::BTreeSet;
use std::path::Path;

use super::files::gc_artifact;
use super::host::Node;
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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::artifact::node_platform;
    use crate::hostroot::HostRoot;
    use crate::node::tasks::{SHIM_PATH_FILE, TASK_DIR};
    use crate::settings::Settings;
    use crate::state::{Journal, Origin, TxnKind};
    use crate::txn::ports::{DeferredVerification, NoRestart};

    /// The retained-version gauges are one per process: the tests that publish them take
    /// turns, so one's collection does not clear another's values before it reads them.
    static GAUGES: Mutex<()> = Mutex::new(());

    struct World {
        _tmp: tempfile::TempDir,
        root: HostRoot,
        settings: Settings,
    }

    fn world() -> World {
        let tmp = tempfile::tempdir().unwrap();
        World {
            root: HostRoot::new(tmp.path()).unwrap(),
            settings: Settings::default(),
            _tmp: tmp,
        }
    }

    fn node(w: &World) -> Node<'_, NoRestart, DeferredVerification> {
        Node {
            root: &w.root,
            settings: &w.settings,
            profile: crate::profile::builtin("containerd"),
            platform: node_platform(),
            origin: Origin::Cluster,
            restarter: NoRestart,
            health: DeferredVerification::default(),
        }
    }

    /// A version of `name` on disk, recorded as retained (no tasks known yet).
    fn retained_on_disk(w: &World, name: &str, digest: &str) -> RetainedVersion {
        let dir = artifact::version_dir(name, digest).display().to_string();
        let local = w.root.resolve(&dir).unwrap();
        std::fs::create_dir_all(&local).unwrap();
        std::fs::write(local.join(format!("containerd-shim-{name}-v2")), b"shim").unwrap();
        RetainedVersion {
            name: name.into(),
            digest: digest.into(),
            dir,
            since: 1,
            tasks: vec![],
            task_count: 0,
        }
    }

    /// A task bundle as containerd records it, started through `v`'s binary.
    fn task_on(w: &World, v: &RetainedVersion, id: &str) {
        let bundle = w
            .root
            .resolve(
                Path::new("/run/containerd")
                    .join(TASK_DIR)
                    .join("k8s.io")
                    .join(id),
            )
            .unwrap();
        std::fs::create_dir_all(&bundle).unwrap();
        let bin = format!("{}/containerd-shim-{}-v2", v.dir, v.name);
        std::fs::write(bundle.join(SHIM_PATH_FILE), bin).unwrap();
    }

    fn on_disk(w: &World, v: &RetainedVersion) -> bool {
        w.root.resolve(&v.dir).unwrap().exists()
    }

    /// The line of `metric` for Shim `shim` in the metrics endpoint's text.
    fn gauge(metric: &str, shim: &str) -> Option<String> {
        let prefix = format!("shim_agent_{metric}{{shim=\"{shim}\"}} ");
        crate::telemetry::metrics()
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    }

    #[test]
    fn a_collection_publishes_each_shims_retained_versions_and_their_tasks_as_metrics() {
        let _turn = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
        let w = world();
        let n = node(&w);
        let (store, mut state) = n.open_unrecovered().unwrap();
        let a1 = retained_on_disk(&w, "metrics-a", &"1".repeat(64));
        let a2 = retained_on_disk(&w, "metrics-a", &"2".repeat(64));
        let b1 = retained_on_disk(&w, "metrics-b", &"3".repeat(64));
        let idle = retained_on_disk(&w, "metrics-idle", &"4".repeat(64));
        for i in 0..20 {
            task_on(&w, &a1, &format!("a1-{i}"));
        }
        task_on(&w, &a2, "a2-0");
        task_on(&w, &a2, "a2-1");
        task_on(&w, &b1, "b1-0");
        state.retained = vec![a1.clone(), a2, b1, idle.clone()];

        n.collect_retained(&store, &mut state).unwrap();

        // the version no task uses went; the others are kept with their tasks, 16 named
        assert!(!on_disk(&w, &idle));
        assert_eq!(state.retained.len(), 3, "{:?}", state.retained);
        let kept_a1 = state
            .retained
            .iter()
            .find(|r| r.digest == a1.digest)
            .unwrap();
        assert_eq!(kept_a1.task_count, 20);
        assert_eq!(kept_a1.tasks.len(), crate::state::RETAINED_TASKS_LISTED);
        assert_eq!(store.load().unwrap().state.retained, state.retained);

        // what the metrics endpoint serves: versions and tasks by Shim
        assert_eq!(
            gauge("retained_versions", "metrics-a").as_deref(),
            Some("2")
        );
        assert_eq!(gauge("retained_tasks", "metrics-a").as_deref(), Some("22"));
        assert_eq!(
            gauge("retained_versions", "metrics-b").as_deref(),
            Some("1")
        );
        assert_eq!(gauge("retained_tasks", "metrics-b").as_deref(), Some("1"));
        assert_eq!(gauge("retained_versions", "metrics-idle"), None);

        // the tasks exit: the next collection removes the versions and the gauges
        std::fs::remove_dir_all(w.root.resolve("/run/containerd").unwrap()).unwrap();
        n.collect_retained(&store, &mut state).unwrap();
        assert!(state.retained.is_empty(), "{:?}", state.retained);
        assert_eq!(gauge("retained_versions", "metrics-a"), None);
        assert_eq!(gauge("retained_tasks", "metrics-b"), None);
    }

    #[test]
    fn nothing_is_collected_while_a_transaction_is_open_and_it_is_once_the_journal_closes() {
        let _turn = GAUGES.lock().unwrap_or_else(|e| e.into_inner());
        let w = world();
        let n = node(&w);
        let (store, mut state) = n.open_unrecovered().unwrap();
        // a version whose tasks are all gone
        let v1 = retained_on_disk(&w, "risky", &"5".repeat(64));
        state.retained = vec![v1.clone()];
        state.journal = Some(Journal::planned(
            "t1".into(),
            TxnKind::Upgrade,
            vec!["risky".into()],
        ));
        store.save(&state).unwrap();

        n.collect_retained(&store, &mut state).unwrap();
        assert_eq!(state.retained, vec![v1.clone()], "kept in the risky window");
        assert!(on_disk(&w, &v1), "its files stay in the risky window");
        assert_eq!(store.load().unwrap().state.retained, vec![v1.clone()]);

        state.journal = None;
        store.save(&state).unwrap();
        n.collect_retained(&store, &mut state).unwrap();
        assert!(state.retained.is_empty(), "{:?}", state.retained);
        assert!(!on_disk(&w, &v1), "its files go once the journal is closed");
        assert!(store.load().unwrap().state.retained.is_empty());
    }
}
