//! Live-node transactions: install, upgrade and uninstall with a containerd restart, CRI
//! verification and rollback (docs/design.md §3, §4).
//!
//! The shell around [`machine`](super::machine): every phase is journalled in the state store
//! before the side effect that follows it; the world is reached through two narrow ports,
//! [`Restarter`] (systemd) and [`HealthCheck`] (containerd's CRI), so the same code runs
//! against the real node, the node-env test container, or scripted fakes.
//!
//! # Guarantees
//! - Fetch and verify of every artifact happen before anything on the host changes.
//! - Several changes go into one transaction: one restart for all of them.
//! - A restart whose job does not finish `done`, or a containerd that does not serve every
//!   expected handler afterwards, rolls the transaction back on the spot: backups restored,
//!   containerd restarted and checked again. If even that fails the journal stays open at
//!   `Broken` and the error says so.
//! - [`Node::recover`] finishes or undoes an interrupted transaction from the journal alone.
//! - Nothing is restarted when no change is needed.
//!
//! # Failpoints
//! With the `failpoints` feature, `txn::<phase>` fires right after each phase is journalled
//! (before the next side effect), e.g. `FAILPOINTS=txn::applied=panic`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::machine::{self, Event, Next, Recovery};
use crate::api::Shim;
use crate::artifact::{self, Platform, Store};
use crate::containerd::{
    self, AddOptions, ConfigFile, ConfigSet, DropinPolicy, FileChange, Plan, RuntimeSpec,
};
use crate::hostroot::HostRoot;
use crate::install::{
    Undo, backups_dir, fetch_spec, fetcher, gc_artifact, merge_config_records, now_secs,
    remove_binary, restore_backups, runtime_spec, sha256_hex, spec_hash, spec_location,
    stage_backups,
};
use crate::profile::Profile;
use crate::settings::Settings;
use crate::state::{
    ConfigRecord, InstalledShim, Journal, NodeState, Origin, Phase, ShimState, StateStore, TxnKind,
};

/// Restarts containerd's unit (systemd over D-Bus in production).
pub trait Restarter {
    /// Restart `unit` and wait for the job; `Err` carries the unit and the job result.
    fn restart(&self, unit: &str) -> impl Future<Output = Result<(), String>>;
}

/// Asks containerd itself whether it serves the runtime handlers (CRI `Status`).
pub trait HealthCheck {
    /// Succeed when the runtime is ready, every handler in `present` is served and none in
    /// `absent` is; `Err` says what is wrong.
    fn verify(
        &self,
        present: &[String],
        absent: &[String],
    ) -> impl Future<Output = Result<(), String>>;
}

/// One requested change.
#[derive(Debug, Clone)]
pub enum Change {
    /// Install or upgrade this Shim.
    Install(Box<Shim>),
    /// Install or upgrade this Shim, recording where it came from (instead of the node's
    /// default origin).
    InstallAs(Box<Shim>, Origin),
    /// Uninstall the Shim with this name.
    Uninstall(String),
}

/// What a transaction did, with the time of each phase (for the overhead benchmark).
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub installed: Vec<String>,
    pub removed: Vec<String>,
    pub unchanged: Vec<String>,
    pub restarts: u32,
    /// (phase reached, time the step leading to it took)
    pub phases: Vec<(Phase, Duration)>,
}

/// The node: where things are and how to reach the world.
pub struct Node<'a, R, H> {
    pub root: &'a HostRoot,
    pub settings: &'a Settings,
    pub profile: Profile,
    pub platform: Platform,
    pub origin: Origin,
    pub restarter: R,
    pub health: H,
}

/// A change after fetching: everything needed to apply it.
struct Prepared {
    record: InstalledShim,
    binary_src: PathBuf,
    previous: Option<InstalledShim>,
    runtime: RuntimeSpec,
}

fn failpoint(_name: &str) {
    fail::fail_point!(_name);
}

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    fn state_dir(&self) -> anyhow::Result<PathBuf> {
        Ok(self.root.resolve(&self.settings.paths.state_dir)?)
    }

    fn load_set(&self) -> anyhow::Result<ConfigSet> {
        Ok(containerd::load(
            self.root,
            Path::new(&self.profile.config),
            self.profile.dropin_dir.as_deref().map(Path::new),
        )?)
    }

    fn dropin_policy(&self) -> DropinPolicy {
        match &self.profile.dropin_dir {
            Some(d) => DropinPolicy::Dir(PathBuf::from(d)),
            None => DropinPolicy::Auto,
        }
    }

    /// Open the store and finish any interrupted transaction first.
    pub async fn open(&self) -> anyhow::Result<(StateStore, NodeState)> {
        let store = StateStore::open(&self.state_dir()?)?;
        let mut state = store.load()?.state;
        self.recover(&store, &mut state).await?;
        Ok((store, state))
    }

    /// Roll an open journal forward or back (see the recovery table in `machine`).
    pub async fn recover(&self, store: &StateStore, state: &mut NodeState) -> anyhow::Result<()> {
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        let result = self.recover_journal(store, state, &j).await;
        // Whatever the outcome, binaries of these shims that the state does not name go.
        self.remove_stray_binaries(state, &j.shims);
        result
    }

    async fn recover_journal(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        j: &Journal,
    ) -> anyhow::Result<()> {
        let action = machine::recovery_for(j.phase);
        tracing::warn!(txn = %j.id, phase = ?j.phase, ?action, "recovering an unfinished transaction");
        match action {
            Recovery::Discard | Recovery::Close => self.close(store, state, j)?,
            Recovery::RollBackFiles => {
                restore_backups(self.root, j)?;
                self.close(store, state, j)?;
            }
            Recovery::RollBackAndRestart => {
                self.roll_back(
                    store,
                    state,
                    j.reason.clone().unwrap_or_else(|| "interrupted".into()),
                )
                .await?;
            }
            Recovery::RollForward(phase) => {
                let mut report = Report::default();
                if phase == Phase::Applied {
                    if let Err(e) = self.restarter.restart(&self.profile.unit).await {
                        return self.fail(store, state, e).await;
                    }
                    self.event(store, state, Event::Restarted)?;
                }
                if matches!(phase, Phase::Applied | Phase::Restarted) {
                    if let Err(e) = self.verify_journal(j).await {
                        return self.fail(store, state, e).await;
                    }
                    self.event(store, state, Event::Verified)?;
                }
                self.commit(store, state, &mut report)?;
            }
        }
        Ok(())
    }

    /// Remove `<shims>/<name>/<digest>/` directories that no installed record points at.
    fn remove_stray_binaries(&self, state: &NodeState, names: &[String]) {
        for name in names {
            let Ok(dir) = self.root.resolve(Path::new(artifact::SHIMS_DIR).join(name)) else {
                continue;
            };
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let keep = state.shims.get(name).map(|r| r.artifact_sha256.clone());
            for e in entries.flatten() {
                if Some(e.file_name().to_string_lossy().into_owned()) != keep {
                    tracing::info!(path = %e.path().display(), "removing a binary no installed shim uses");
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
            let _ = std::fs::remove_dir(&dir);
        }
    }

    fn close(&self, store: &StateStore, state: &mut NodeState, j: &Journal) -> anyhow::Result<()> {
        state.journal = None;
        store.save(state)?;
        let _ = std::fs::remove_dir_all(backups_dir(store.dir(), &j.id));
        Ok(())
    }

    fn event(&self, store: &StateStore, state: &mut NodeState, event: Event) -> anyhow::Result<()> {
        let Some(j) = state.journal.as_mut() else {
            bail!("no open transaction for {event:?}")
        };
        match machine::next(j.phase, &event)? {
            Next::Phase(p) => j.phase = p,
            Next::Abort { reason } => bail!("transaction aborted: {reason}"),
        }
        if let Event::Failed { reason } = &event {
            j.reason = Some(reason.clone());
        }
        let phase = j.phase;
        store.save(state)?;
        failpoint(&format!("txn::{}", phase_name(phase)));
        Ok(())
    }

    async fn verify_journal(&self, j: &Journal) -> Result<(), String> {
        let present: Vec<String> = j.pending.iter().map(|r| r.handler.clone()).collect();
        let absent: Vec<String> = j.removing.clone();
        self.health.verify(&present, &absent).await
    }

    /// Apply `changes` in one transaction (one restart).
    pub async fn apply(&self, changes: Vec<Change>) -> anyhow::Result<Report> {
        let (store, mut state) = self.open().await?;
        self.apply_with(&store, &mut state, changes).await
    }

    /// Like [`apply`](Self::apply) with an already open store.
    pub async fn apply_with(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        changes: Vec<Change>,
    ) -> anyhow::Result<Report> {
        let mut report = Report::default();
        let t0 = Instant::now();
        let mut installs = Vec::new();
        let mut removes = Vec::new();
        let set = self.load_set()?;
        // the handlers the config defines, parsed once for all the changes
        let defined: std::collections::BTreeSet<String> = containerd::inspect(&set)
            .map(|i| i.handlers.into_iter().map(|h| h.name).collect())
            .unwrap_or_default();
        for c in changes {
            let (shim, origin) = match c {
                Change::Install(s) => (s, self.origin),
                Change::InstallAs(s, o) => (s, o),
                Change::Uninstall(name) => {
                    match state.shims.get(&name) {
                        Some(rec) => removes.push(rec.clone()),
                        None => report.unchanged.push(name),
                    }
                    continue;
                }
            };
            let prev = state.shims.get(shim.name());
            if let Some(p) = prev
                && p.spec_hash == spec_hash(&shim)
                && self.root.resolve(&p.binary)?.exists()
                && defined.contains(&p.handler)
            {
                report.unchanged.push(shim.name().to_string());
                continue;
            }
            if let Some(other) = state
                .shims
                .values()
                .find(|s| s.handler == shim.handler() && s.name != shim.name())
            {
                bail!(
                    "handler {:?} is already installed for Shim {:?}",
                    shim.handler(),
                    other.name
                );
            }
            installs.push((shim, origin));
        }
        if installs.is_empty() && removes.is_empty() {
            return Ok(report);
        }

        // Fetch and verify everything before the host changes.
        let mut undo = Undo::default();
        let prepared = match self.fetch_all(state, &installs, &mut undo).await {
            Ok(p) => p,
            Err(e) => {
                undo.run();
                return Err(e);
            }
        };
        report.phases.push((Phase::Fetched, t0.elapsed()));

        // Plan every config change on one evolving view of the files.
        let plan = match self.plan_all(set, &prepared, &removes) {
            Ok(p) => p,
            Err(e) => {
                undo.run();
                return Err(e);
            }
        };

        let id = format!("{}-{}", now_secs(), std::process::id());
        let kind = match (&prepared[..], &removes[..]) {
            ([], _) => TxnKind::Uninstall,
            (p, _) if p.iter().any(|x| x.previous.is_some()) => TxnKind::Upgrade,
            _ => TxnKind::Install,
        };
        let shims = prepared
            .iter()
            .map(|p| p.record.name.clone())
            .chain(removes.iter().map(|r| r.name.clone()))
            .collect();
        let mut journal = Journal::planned(id.clone(), kind, shims);
        journal.pending = prepared.iter().map(|p| p.record.clone()).collect();
        journal.removing = removes.iter().map(|r| r.handler.clone()).collect();
        state.journal = Some(journal);
        store.save(state)?;
        failpoint("txn::planned");
        self.event(store, state, Event::Fetched)?;
        // No cluster here: the rollout slot is trivially ours (the rollout gate comes with
        // the Kubernetes daemon).
        self.event(store, state, Event::SlotAcquired)?;

        let t = Instant::now();
        let mut touched: Vec<String> = plan
            .changes
            .iter()
            .map(|c| c.host_path.display().to_string())
            .collect();
        touched.extend(prepared.iter().map(|p| p.record.binary.clone()));
        let backups = match stage_backups(self.root, store.dir(), &id, &touched, &mut undo) {
            Ok(b) => b,
            Err(e) => {
                undo.run();
                state.journal = None;
                store.save(state)?;
                return Err(e);
            }
        };
        if let Some(j) = state.journal.as_mut() {
            j.backups = backups;
        }
        self.event(store, state, Event::Staged)?;
        report.phases.push((Phase::Staged, t.elapsed()));

        let t = Instant::now();
        if let Err(e) = self.apply_files(&prepared, &plan) {
            return self
                .fail(store, state, format!("{e:#}"))
                .await
                .map(|_| report);
        }
        self.event(store, state, Event::Applied)?;
        report.phases.push((Phase::Applied, t.elapsed()));

        let t = Instant::now();
        // containerd reads its config only at start: no config change, no restart (a
        // binary put back in place is picked up at the next shim start).
        if !plan.is_empty() {
            report.restarts += 1;
            if let Err(e) = self.restarter.restart(&self.profile.unit).await {
                return self.fail(store, state, e).await.map(|_| report);
            }
        }
        self.event(store, state, Event::Restarted)?;
        report.phases.push((Phase::Restarted, t.elapsed()));

        let t = Instant::now();
        let present: Vec<String> = prepared.iter().map(|p| p.record.handler.clone()).collect();
        let absent: Vec<String> = removes.iter().map(|r| r.handler.clone()).collect();
        if let Err(e) = self.health.verify(&present, &absent).await {
            return self.fail(store, state, e).await.map(|_| report);
        }
        self.event(store, state, Event::Verified)?;
        report.phases.push((Phase::Verified, t.elapsed()));

        let t = Instant::now();
        self.commit(store, state, &mut report)?;
        report.phases.push((Phase::Committed, t.elapsed()));
        Ok(report)
    }

    async fn fetch_all(
        &self,
        state: &NodeState,
        installs: &[(Box<Shim>, Origin)],
        undo: &mut Undo,
    ) -> anyhow::Result<Vec<Prepared>> {
        let store_dir = self.state_dir()?.join("store");
        for sub in ["sha256", "tmp", "refs"] {
            undo.create_dir_all(&store_dir.join(sub))?;
        }
        let artifacts = Store::open(&store_dir)?;
        let fetcher = fetcher(self.settings, self.platform.clone(), false)?;
        let mut out = Vec::new();
        for (shim, origin) in installs {
            let spec = fetch_spec(shim, self.settings)?;
            let fetched = fetcher
                .fetch(&spec, &artifacts)
                .await
                .with_context(|| format!("Shim {:?}", shim.name()))?;
            if fetched.fetched {
                undo.dirs.push(fetched.dir.clone());
            }
            let wanted = shim.spec.runtime.as_ref().and_then(|r| r.binary.as_deref());
            let bin = artifact::find_shim_binary(&fetched.dir, wanted, &self.platform.arch)?;
            let bin_name = bin
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let host = Path::new(artifact::SHIMS_DIR)
                .join(shim.name())
                .join(&fetched.digest)
                .join(&bin_name);
            let host_s = host.display().to_string();
            let rt = runtime_spec(shim, &host_s);
            out.push(Prepared {
                record: InstalledShim {
                    name: shim.name().to_string(),
                    handler: shim.handler().to_string(),
                    runtime_type: rt.runtime_type.clone(),
                    artifact_sha256: fetched.digest.clone(),
                    source: spec_location(&spec),
                    binary: host_s,
                    spec_hash: spec_hash(shim),
                    config_files: vec![],
                    state: ShimState::Installed,
                    origin: *origin,
                    runtime_class: Some(shim.spec.runtime_class.name.clone()),
                    installed_at: now_secs(),
                },
                binary_src: bin,
                previous: state.shims.get(shim.name()).cloned(),
                runtime: rt,
            });
        }
        Ok(out)
    }

    fn plan_all(
        &self,
        mut set: ConfigSet,
        prepared: &[Prepared],
        removes: &[InstalledShim],
    ) -> anyhow::Result<Plan> {
        let mut steps: Vec<Plan> = Vec::new();
        for r in removes {
            let p = containerd::plan_remove(&set, &r.handler)?;
            update_set(&mut set, &p);
            steps.push(p);
        }
        for p in prepared {
            let opts = AddOptions {
                replace: p.previous.is_some(),
                dropin: self.dropin_policy(),
            };
            let plan = containerd::plan_add(&set, &p.runtime, &opts)?;
            update_set(&mut set, &plan);
            steps.push(plan);
        }
        Ok(combine(steps))
    }

    fn apply_files(&self, prepared: &[Prepared], plan: &Plan) -> anyhow::Result<()> {
        for p in prepared {
            failpoint("txn::place_binary");
            artifact::place_binary(
                self.root,
                &p.record.name,
                &p.record.artifact_sha256,
                &p.binary_src,
            )?;
        }
        failpoint("txn::write_config");
        containerd::apply(self.root, plan)?;
        Ok(())
    }

    /// A step failed: journal it, roll back, and return the error.
    async fn fail(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: String,
    ) -> anyhow::Result<()> {
        tracing::error!(%reason, "transaction failed; rolling back");
        self.event(
            store,
            state,
            Event::Failed {
                reason: reason.clone(),
            },
        )?;
        self.roll_back(store, state, reason.clone()).await?;
        bail!("{reason}; rolled back: containerd runs the previous configuration")
    }

    async fn roll_back(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        reason: String,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        restore_backups(self.root, &j)?;
        failpoint("txn::restored");
        // containerd must come back with the handlers it had before.
        let before: Vec<String> = state.shims.values().map(|s| s.handler.clone()).collect();
        let new: Vec<String> = j
            .pending
            .iter()
            .filter(|p| !state.shims.contains_key(&p.name))
            .map(|p| p.handler.clone())
            .collect();
        let outcome = match self.restarter.restart(&self.profile.unit).await {
            Ok(()) => self.health.verify(&before, &new).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(()) => {
                self.event(store, state, Event::RolledBack)?;
                // New binaries of the failed transaction go; the store keeps verified artifacts.
                for p in &j.pending {
                    if state.shims.get(&p.name).map(|s| &s.binary) != Some(&p.binary) {
                        let _ = remove_binary(self.root, p);
                    }
                }
                self.close(store, state, &j)?;
                Ok(())
            }
            Err(e) => {
                self.event(store, state, Event::RollbackFailed { reason: e.clone() })?;
                bail!(
                    "{reason}; the rollback failed too ({e}): containerd is not healthy, the journal stays open at Broken"
                )
            }
        }
    }

    fn commit(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        report: &mut Report,
    ) -> anyhow::Result<()> {
        let Some(j) = state.journal.clone() else {
            return Ok(());
        };
        let artifacts = Store::open(store.dir().join("store"))?;
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
        for mut rec in j.pending.clone() {
            let prev = state.shims.get(&rec.name).cloned();
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
            rec.config_files = merge_config_records(prev.as_ref(), files);
            if let Some(p) = prev
                && p.binary != rec.binary
            {
                old.push(p);
            }
            report.installed.push(rec.name.clone());
            state.shims.insert(rec.name.clone(), rec);
        }
        self.event(store, state, Event::Committed)?;
        self.close(store, state, &j)?;
        for rec in old {
            remove_binary(self.root, &rec)?;
            gc_artifact(&artifacts, state, &rec.artifact_sha256)?;
        }
        Ok(())
    }
}

fn phase_name(p: Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Reflect a plan's results in the in-memory view of the files.
fn update_set(set: &mut ConfigSet, plan: &Plan) {
    for c in &plan.changes {
        if c.host_path == set.main.host_path {
            if let Some(after) = &c.after {
                set.main.bytes = after.clone();
            }
            continue;
        }
        set.dropins.retain(|d| d.host_path != c.host_path);
        if let Some(after) = &c.after {
            set.dropins.push(ConfigFile {
                host_path: c.host_path.clone(),
                bytes: after.clone(),
            });
        }
    }
}

/// Several plans as one: per file the first `before` and the last `after`, in the order
/// files first appear (which keeps "drop-in before its import, import before its removal").
fn combine(plans: Vec<Plan>) -> Plan {
    let mut out: Vec<FileChange> = Vec::new();
    for p in plans {
        for c in p.changes {
            match out.iter_mut().find(|x| x.host_path == c.host_path) {
                Some(x) => x.after = c.after,
                None => out.push(c),
            }
        }
    }
    out.retain(|c| c.before != c.after);
    Plan { changes: out }
}
