//! What both run modes share on the node (`shim-agent run` with or without a cluster): the
//! static Shims of `/etc/shim-agent/shims.d/`, offline installs adopted once containerd serves
//! them, and the watch on the node's files that starts a round.
//!
//! # Guarantees
//! - A Shim file that does not parse is reported and ignored *as a whole*: the Shims it
//!   held are neither installed nor removed until it is fixed ([`static_changes`]).
//! - Only Shims that came from `shims.d` are removed when their file goes; offline and CLI
//!   installs are left alone.
//! - Offline installs pending verification are adopted once containerd serves their handler
//!   and it runs a pod sandbox ([`adopt_pending`]); one that fails is checked again later
//!   ([`Adoption`]).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;

use crate::api::Shim;
use crate::api::load::parse_shims;
use crate::state::{NodeState, Origin, ShimState, StateStore};
use crate::txn::{Change, HealthCheck, Node};

/// Quiet time after a file event before a round starts (editors write in several steps).
pub const FILE_SETTLE_MILLIS: u64 = 300;

/// The Shims of `dir/*.yaml` (and `.yml`), sorted by file name; files that fail to parse are
/// returned as errors (file name + message) together with the names they *might* hold.
pub fn read_static_shims(dir: &Path) -> (Vec<Shim>, Vec<String>) {
    let mut shims = Vec::new();
    let mut errors = Vec::new();
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
        Err(e) => return (vec![], vec![format!("{}: {e}", dir.display())]),
    };
    files.sort();
    for f in files {
        let name = f.display().to_string();
        match std::fs::read_to_string(&f)
            .map_err(|e| e.to_string())
            .and_then(|t| parse_shims(&t, &name).map_err(|e| e.to_string()))
        {
            Ok(s) => shims.extend(s),
            Err(e) => errors.push(e),
        }
    }
    (shims, errors)
}

/// What to do so the node matches `desired` (pure). `blocked` holds "some file did not
/// parse": then nothing static is removed, since the broken file may still want it.
pub fn static_changes(desired: &[Shim], state: &NodeState, blocked: bool) -> Vec<Change> {
    let mut out: Vec<Change> = desired
        .iter()
        .map(|s| Change::Install(Box::new(s.clone())))
        .collect();
    if !blocked {
        let wanted: BTreeSet<&str> = desired.iter().map(|s| s.name()).collect();
        for rec in state.shims.values() {
            if rec.origin == Origin::Static && !wanted.contains(rec.name.as_str()) {
                out.push(Change::Uninstall(rec.name.clone()));
            }
        }
    }
    out
}

/// When pre-baked shims that failed their check are checked again: first after
/// [`ADOPT_RETRY_FIRST_SECS`], doubling to [`ADOPT_RETRY_MOST_SECS`].
pub const ADOPT_RETRY_FIRST_SECS: u64 = 10;
pub const ADOPT_RETRY_MOST_SECS: u64 = 600;

/// The adoption of offline installs over a run: at start, then again with backoff while a
/// pending shim fails its check (both run modes keep one).
#[derive(Debug, Default)]
pub struct Adoption {
    next: Option<tokio::time::Instant>,
    pause: std::time::Duration,
}

impl Adoption {
    /// Adopt what is pending when it is due (at once the first time): see [`adopt_pending`].
    pub async fn run_if_due<H: HealthCheck>(
        &mut self,
        health: &H,
        store: &StateStore,
        state: &mut NodeState,
    ) -> anyhow::Result<()> {
        let now = tokio::time::Instant::now();
        if self.next.is_some_and(|n| n > now) {
            return Ok(());
        }
        let failed = adopt_pending(health, store, state).await?;
        if failed == 0 {
            self.next = None;
            self.pause = std::time::Duration::ZERO;
        } else {
            let first = std::time::Duration::from_secs(ADOPT_RETRY_FIRST_SECS);
            let most = std::time::Duration::from_secs(ADOPT_RETRY_MOST_SECS);
            self.pause = (self.pause * 2).clamp(first, most);
            self.next = Some(now + self.pause);
        }
        Ok(())
    }

    /// When the next try is due, while one is.
    pub fn next_due(&self) -> Option<tokio::time::Instant> {
        self.next
    }
}

/// Adopt offline installs: a pending shim becomes installed once containerd serves its
/// handler and the handler runs a pod sandbox (and the shim's check container): installed is
/// not working, and a pre-baked shim is proven on the node before its label can follow. One
/// that fails stays pending (never labelled), its reason logged; how many failed.
pub async fn adopt_pending<H: HealthCheck>(
    health: &H,
    store: &StateStore,
    state: &mut NodeState,
) -> anyhow::Result<usize> {
    let pending: Vec<String> = state
        .shims
        .values()
        .filter(|s| s.state == ShimState::PendingVerification)
        .map(|s| s.name.clone())
        .collect();
    let (mut changed, mut failed) = (false, 0);
    for name in pending {
        let Some(rec) = state.shims.get_mut(&name) else {
            continue;
        };
        if let Err(e) = health.verify(std::slice::from_ref(&rec.handler), &[]).await {
            tracing::warn!(shim = %name, "offline install not served by containerd yet: {e}");
            failed += 1;
            continue;
        }
        let checks = crate::txn::prove::handler_checks(std::slice::from_ref(rec));
        match health.prove(&checks).await {
            Ok(_) => {
                tracing::info!(shim = %name, handler = %rec.handler, "adopted an offline install: containerd serves it and it ran a pod sandbox");
                rec.state = ShimState::Installed;
                changed = true;
            }
            Err(errors) => {
                for (_, e) in errors {
                    tracing::error!(shim = %name, reason = e.reason(), "offline install not adopted: it does not work on this node ({e}); it stays pending-verification, unlabelled, and is checked again later");
                }
                failed += 1;
            }
        }
    }
    if changed {
        store.save(state)?;
    }
    Ok(failed)
}

/// Paths whose changes start a round.
pub fn watched_paths<R, H>(node: &Node<'_, R, H>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut add = |host: &str| {
        if let Ok(p) = node.root.resolve(host) {
            out.push(p);
        }
    };
    add(&node.settings.paths.static_shims_dir);
    if let Some(parent) = Path::new(&node.profile.config).parent() {
        add(&parent.display().to_string());
    }
    if let Some(d) = &node.profile.dropin_dir {
        add(d);
    }
    add(crate::artifact::SHIMS_DIR);
    out
}

/// Watch `paths` (recursively; a missing one through its parent) and send `()` on change.
pub fn watch(
    paths: &[PathBuf],
    tx: mpsc::Sender<()>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let mut w = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        if ev.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.try_send(());
        }
    })?;
    for p in paths {
        // A directory that does not exist yet is watched through its parent.
        let target = if p.exists() {
            p.clone()
        } else {
            p.parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| p.clone())
        };
        if let Err(e) = w.watch(&target, RecursiveMode::Recursive) {
            tracing::warn!(path = %target.display(), "cannot watch path; relying on the periodic resync: {e}");
        }
    }
    Ok(w)
}
