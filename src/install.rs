//! Offline install and uninstall: the host half of a Shim inside an image root
//! (`shim-agent install --root DIR -f shim.yaml`), for image builders. docs/design.md §8.
//!
//! Fetch and verify come first (nothing on the host changes before the artifact is in the
//! store), then the transaction is journalled through its phases — Planned, Fetched, Staged
//! (backups of every file it will touch), Applied — and committed with the shim recorded as
//! `pending-verification`: there is no containerd to restart in an image, so the agent
//! verifies, labels and adopts it on first boot.
//!
//! # Guarantees
//! - A failure at any step leaves the root exactly as it was: config bytes, state document,
//!   store, installed files, and the directories this run created (an in-memory undo log,
//!   run in reverse).
//! - A crash mid-way leaves an open journal; the next run rolls it back from the journal
//!   alone (backups restored, created files removed) before doing anything else.
//! - Everything is resolved through one [`HostRoot`]: no path escapes the root.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};

use crate::api::{FetchType, Shim};
use crate::artifact::{self, FetchSpec, Fetcher, Limits, Platform, RetryPolicy, Store};
use crate::containerd::{self, AddOptions, DropinPolicy, RuntimeSpec};
use crate::fsutil;
use crate::hostroot::HostRoot;
use crate::profile;
use crate::settings::Settings;
use crate::state::{
    Backup, ConfigRecord, InstalledShim, Journal, NodeState, Origin, ShimState, StateStore, TxnKind,
};
use crate::txn::machine::{self, Event, Next};

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallOutcome {
    /// Installed (or upgraded) now.
    Installed {
        binary: String,
        config_files: Vec<String>,
        upgraded: bool,
    },
    /// The same Shim was already installed; nothing changed.
    Unchanged,
}

/// Options of an offline install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Platform of the image (default: this machine's).
    pub platform: Platform,
    /// Show a progress bar.
    pub progress: bool,
}

/// Undo log of one run: what to put back if a later step fails.
#[derive(Default)]
pub(crate) struct Undo {
    /// Local paths of files to restore (Some bytes) or delete (None), in order of change.
    pub(crate) files: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// Local paths of directories this run created, in order of creation.
    pub(crate) dirs: Vec<PathBuf>,
}

impl Undo {
    /// Create `dir` and its missing parents, remembering each one created.
    pub(crate) fn create_dir_all(&mut self, dir: &Path) -> std::io::Result<()> {
        let mut missing = Vec::new();
        let mut cur = Some(dir);
        while let Some(d) = cur {
            if d.exists() {
                break;
            }
            missing.push(d.to_path_buf());
            cur = d.parent();
        }
        for d in missing.into_iter().rev() {
            std::fs::create_dir(&d)?;
            self.dirs.push(d);
        }
        Ok(())
    }

    /// Remember the current content of a file before changing it.
    pub(crate) fn save_file(&mut self, local: &Path) -> std::io::Result<()> {
        let before = match std::fs::read(local) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        self.files.push((local.to_path_buf(), before));
        Ok(())
    }

    /// Put everything back, newest first. Errors are logged: undo goes on regardless.
    pub(crate) fn run(self) {
        for (path, before) in self.files.into_iter().rev() {
            let r = match before {
                Some(bytes) => fsutil::write_atomic(&path, &bytes, None),
                None => fsutil::remove_durable(&path),
            };
            if let Err(e) = r {
                tracing::error!(path = %path.display(), error = %e, "undo: cannot restore file");
            }
        }
        for dir in self.dirs.into_iter().rev() {
            if let Err(e) = std::fs::remove_dir_all(&dir) {
                tracing::error!(path = %dir.display(), error = %e, "undo: cannot remove directory");
            }
        }
    }
}

/// The Shim's fetchStrategy as the artifact module's plain input.
pub fn fetch_spec(shim: &Shim, settings: &Settings) -> anyhow::Result<FetchSpec> {
    let fs = &shim.spec.fetch_strategy;
    let token = match settings.fetch.registry_token_file.as_str() {
        "" => None,
        path => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read fetch.registry-token-file {path}"))?
                .trim()
                .to_string(),
        ),
    };
    Ok(FetchSpec {
        strategy: match fs.type_ {
            FetchType::AnonymousHttp => "anonymousHttp".into(),
            FetchType::Oci => "oci".into(),
        },
        anon_http: fs.anon_http.as_ref().and_then(|a| {
            a.location.as_ref().map(|l| artifact::ArtifactSource {
                location: l.clone(),
                sha256: a.sha256.clone(),
            })
        }),
        platforms: fs
            .platforms
            .iter()
            .flatten()
            .map(|p| artifact::PlatformSource {
                os: p.os.clone(),
                arch: p.arch.clone(),
                source: artifact::ArtifactSource {
                    location: p.location.clone(),
                    sha256: p.sha256.clone(),
                },
            })
            .collect(),
        oci: fs.oci.as_ref().map(|o| artifact::OciSource {
            reference: o.reference.clone(),
            auth: token.map(artifact::OciAuth::Bearer).unwrap_or_default(),
            layer: o.layer.clone(),
            insecure_http: false,
        }),
    })
}

/// Hash of everything that, when it changes, means a new install (artifact + runtime settings).
pub fn spec_hash(shim: &Shim) -> String {
    let v = serde_json::json!({
        "handler": shim.handler(),
        "fetch": shim.spec.fetch_strategy,
        "runtime": shim.spec.runtime,
    });
    hex::encode(Sha256::digest(v.to_string().as_bytes()))
}

/// A fetcher configured from the settings.
pub fn fetcher(settings: &Settings, platform: Platform, progress: bool) -> anyhow::Result<Fetcher> {
    let f = &settings.fetch;
    let limits = Limits {
        max_download_bytes: f.max_download_bytes,
        max_unpacked_bytes: f.max_unpacked_bytes,
        max_file_bytes: f.max_unpacked_bytes,
        max_entries: f.max_entries,
        connect_timeout: std::time::Duration::from_secs(f.connect_timeout_secs),
        read_timeout: std::time::Duration::from_secs(f.read_timeout_secs),
        ..Limits::default()
    };
    let retry = RetryPolicy {
        max_attempts: f.attempts,
        ..RetryPolicy::default()
    };
    Ok(Fetcher::new(limits, retry)?
        .allow_unverified(f.allow_unverified)
        .for_platform(platform)
        .with_progress(progress))
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

pub(crate) fn backups_dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join("backups").join(id)
}

/// Roll back an unfinished transaction from its journal alone: restore saved files, delete
/// files that did not exist, then close the journal.
pub fn roll_back_journal(
    root: &HostRoot,
    store: &StateStore,
    state: &mut NodeState,
) -> anyhow::Result<()> {
    let Some(journal) = state.journal.clone() else {
        return Ok(());
    };
    tracing::warn!(txn = %journal.id, phase = ?journal.phase, shims = ?journal.shims, "rolling back an unfinished transaction");
    restore_backups(root, &journal)?;
    state.journal = None;
    store.save(state)?;
    let _ = std::fs::remove_dir_all(backups_dir(store.dir(), &journal.id));
    Ok(())
}

/// Put every backed-up file back (or delete files that did not exist), newest first;
/// files that already hold their backed-up bytes are left alone (idempotent).
pub(crate) fn restore_backups(root: &HostRoot, j: &Journal) -> anyhow::Result<()> {
    for b in j.backups.iter().rev() {
        let local = root.resolve(&b.path)?;
        match &b.saved_as {
            Some(saved) => {
                let bytes = std::fs::read(root.resolve(saved)?)
                    .with_context(|| format!("backup {saved} of {} is missing", b.path))?;
                if std::fs::read(&local).ok().as_deref() != Some(&bytes[..]) {
                    fsutil::write_atomic(&local, &bytes, None)?;
                }
            }
            None => fsutil::remove_durable(&local)?,
        }
    }
    Ok(())
}

/// The handler to register for `shim`, whose binary is installed at `binary_host`.
///
/// The installed binary's absolute path is the `runtime_type`, not `runtime_type =
/// "io.containerd.<name>.v<N>"` plus `runtime_path`: containerd 1.6 lists such a handler but
/// ignores `runtime_path` when it starts a shim ("runtime ... binary not installed";
/// containerd#8207, fixed in 1.7 and 2.x), so no pod could run. An absolute `runtime_type`
/// works from 1.6 on.
pub(crate) fn runtime_spec(shim: &Shim, binary_host: &str) -> RuntimeSpec {
    let mut rt = RuntimeSpec {
        handler: shim.handler().to_string(),
        runtime_type: binary_host.to_string(),
        runtime_path: None,
        ..RuntimeSpec::default()
    };
    if let Some(r) = &shim.spec.runtime {
        rt.options = r.options.clone().unwrap_or_default();
        rt.pod_annotations = r.pod_annotations.clone().unwrap_or_default();
        rt.privileged_without_host_devices = r.privileged_without_host_devices.unwrap_or(false);
    }
    rt
}

/// Save `before` copies of every file in `paths` (host paths) for the journal.
pub(crate) fn stage_backups(
    root: &HostRoot,
    state_dir: &Path,
    id: &str,
    paths: &[String],
    undo: &mut Undo,
) -> anyhow::Result<Vec<Backup>> {
    let dir = backups_dir(state_dir, id);
    undo.create_dir_all(&dir)?;
    let mut backups = Vec::new();
    for (i, p) in paths.iter().enumerate() {
        match std::fs::read(root.resolve(p)?) {
            Ok(bytes) => {
                let local = dir.join(format!("{i}"));
                fsutil::write_atomic(&local, &bytes, Some(fsutil::FileMode::new(0o600)))?;
                backups.push(Backup {
                    path: p.clone(),
                    saved_as: Some(root.host_path_of(&local).display().to_string()),
                    sha256: Some(sha256_hex(&bytes)),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                backups.push(Backup {
                    path: p.clone(),
                    saved_as: None,
                    sha256: None,
                });
            }
            Err(e) => return Err(e).with_context(|| format!("cannot back up {p}")),
        }
    }
    Ok(backups)
}

/// Move the open journal on by `event` (through the state machine) and write it to disk.
pub(crate) fn journal_event(
    store: &StateStore,
    state: &mut NodeState,
    event: Event,
) -> anyhow::Result<()> {
    let Some(j) = state.journal.as_mut() else {
        bail!("no open transaction to record {event:?} in")
    };
    match machine::next(j.phase, &event)? {
        Next::Phase(p) => j.phase = p,
        Next::Abort { reason } => bail!("transaction aborted: {reason}"),
    }
    store.save(state)?;
    Ok(())
}

/// Install `shim` into the image at `root`.
pub async fn install_offline(
    root: &HostRoot,
    settings: &Settings,
    shim: &Shim,
    opts: &InstallOptions,
) -> anyhow::Result<InstallOutcome> {
    let mut undo = Undo::default();
    let result = install_inner(root, settings, shim, opts, &mut undo).await;
    if result.is_err() {
        undo.run();
    }
    result
}

async fn install_inner(
    root: &HostRoot,
    settings: &Settings,
    shim: &Shim,
    opts: &InstallOptions,
    undo: &mut Undo,
) -> anyhow::Result<InstallOutcome> {
    let name = shim.name().to_string();
    let handler = shim.handler().to_string();
    let state_dir = root.resolve(&settings.paths.state_dir)?;
    undo.create_dir_all(&state_dir)?;
    undo.save_file(&state_dir.join(crate::state::LOCK_FILE))?;
    let store = StateStore::open(&state_dir)?;
    let loaded = store.load()?;
    let mut state = loaded.state;
    if state.journal.is_some() {
        roll_back_journal(root, &store, &mut state)?;
    }
    undo.save_file(&store.state_path())?;

    let hash = spec_hash(shim);
    let previous = state.shims.get(&name).cloned();
    if let Some(prev) = &previous
        && prev.spec_hash == hash
        && root.resolve(&prev.binary)?.exists()
    {
        return Ok(InstallOutcome::Unchanged);
    }
    if let Some(other) = state
        .shims
        .values()
        .find(|s| s.handler == handler && s.name != name)
    {
        bail!(
            "handler {handler:?} is already installed for Shim {:?}; uninstall it first",
            other.name
        );
    }

    // Fetch and verify before anything else on the host changes.
    let store_dir = state_dir.join("store");
    undo.create_dir_all(&store_dir)?;
    for sub in ["sha256", "tmp", "refs"] {
        undo.create_dir_all(&store_dir.join(sub))?;
    }
    let artifacts = Store::open(&store_dir)?;
    let spec = fetch_spec(shim, settings)?;
    let fetched = fetcher(settings, opts.platform.clone(), opts.progress)?
        .fetch(&spec, &artifacts)
        .await?;
    if fetched.fetched {
        undo.dirs.push(fetched.dir.clone());
    }
    let wanted = shim.spec.runtime.as_ref().and_then(|r| r.binary.as_deref());
    let bin = artifact::find_shim_binary(&fetched.dir, wanted, &opts.platform.arch)?;
    let bin_name = bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let binary_host = Path::new(artifact::SHIMS_DIR)
        .join(&name)
        .join(&fetched.digest)
        .join(&bin_name);
    let binary_host_s = binary_host.display().to_string();

    // Plan the config change (pure), so every file to touch is known before touching any.
    let prof = profile::resolve(root, &settings.containerd);
    let dropin = match &prof.dropin_dir {
        Some(d) => DropinPolicy::Dir(PathBuf::from(d)),
        None => DropinPolicy::Auto,
    };
    let set = containerd::load(
        root,
        Path::new(&prof.config),
        prof.dropin_dir.as_deref().map(Path::new),
    )?;
    let rt = runtime_spec(shim, &binary_host_s);
    let plan = containerd::plan_add(
        &set,
        &rt,
        &AddOptions {
            replace: previous.is_some(),
            dropin,
        },
    )?;

    // Journal: Planned → Fetched → Staged (backups) → Applied → committed.
    let id = format!("{}-{}", now_secs(), &hash[..12]);
    let mut touched: Vec<String> = plan
        .changes
        .iter()
        .map(|c| c.host_path.display().to_string())
        .collect();
    touched.push(binary_host_s.clone());
    let kind = if previous.is_some() {
        TxnKind::Upgrade
    } else {
        TxnKind::Install
    };
    state.journal = Some(Journal::planned(id.clone(), kind, vec![name.clone()]));
    store.save(&state)?;
    journal_event(&store, &mut state, Event::Fetched)?;
    // Offline there is no rollout: the slot is trivially ours.
    journal_event(&store, &mut state, Event::SlotAcquired)?;
    let backups = stage_backups(root, &state_dir, &id, &touched, undo)?;
    if let Some(j) = state.journal.as_mut() {
        j.backups = backups;
    }
    journal_event(&store, &mut state, Event::Staged)?;

    let bin_dir = root.resolve(binary_host.parent().unwrap_or(Path::new("/")))?;
    undo.create_dir_all(&bin_dir)?;
    undo.save_file(&bin_dir.join(&bin_name))?;
    artifact::place_binary(root, &name, &fetched.digest, &bin)?;
    for c in &plan.changes {
        undo.save_file(&root.resolve(&c.host_path)?)?;
    }
    containerd::apply(root, &plan)?;
    journal_event(&store, &mut state, Event::Applied)?;

    let config_files: Vec<ConfigRecord> = plan
        .changes
        .iter()
        .map(|c| ConfigRecord {
            path: c.host_path.display().to_string(),
            sha256_before: c.before.as_deref().map(sha256_hex),
            sha256_after: c.after.as_deref().map(sha256_hex),
        })
        .collect();
    let record = InstalledShim {
        name: name.clone(),
        handler,
        runtime_type: rt.runtime_type.clone(),
        artifact_sha256: fetched.digest.clone(),
        source: spec_location(&spec),
        binary: binary_host_s.clone(),
        spec_hash: hash,
        config_files: merge_config_records(previous.as_ref(), config_files),
        state: ShimState::PendingVerification,
        origin: Origin::Offline,
        runtime_class: Some(shim.spec.runtime_class.name.clone()),
        installed_at: now_secs(),
    };
    let files: Vec<String> = record.config_files.iter().map(|c| c.path.clone()).collect();
    state.shims.insert(name.clone(), record);
    state.journal = None;
    store.save(&state)?;
    let _ = std::fs::remove_dir_all(backups_dir(&state_dir, &id));

    // An upgrade leaves the old binary until the new one is committed; then it goes.
    if let Some(prev) = &previous
        && prev.binary != binary_host_s
    {
        remove_binary(root, prev)?;
        gc_artifact(&artifacts, &state, &prev.artifact_sha256)?;
    }
    Ok(InstallOutcome::Installed {
        binary: binary_host_s,
        config_files: files,
        upgraded: previous.is_some(),
    })
}

/// Keep the original "before" hash across upgrades: uninstall compares with the bytes
/// from before the *first* install.
pub(crate) fn merge_config_records(
    previous: Option<&InstalledShim>,
    now: Vec<ConfigRecord>,
) -> Vec<ConfigRecord> {
    let Some(prev) = previous else { return now };
    let mut out = prev.config_files.clone();
    for rec in now {
        match out.iter_mut().find(|r| r.path == rec.path) {
            Some(r) => r.sha256_after = rec.sha256_after,
            None => out.push(rec),
        }
    }
    out
}

pub(crate) fn spec_location(spec: &FetchSpec) -> String {
    if let Some(o) = &spec.oci {
        return o.reference.clone();
    }
    match (&spec.anon_http, spec.platforms.first()) {
        (Some(a), _) => a.location.clone(),
        (None, Some(p)) => p.source.location.clone(),
        (None, None) => String::new(),
    }
}

pub(crate) fn remove_binary(root: &HostRoot, shim: &InstalledShim) -> anyhow::Result<()> {
    let local = root.resolve(&shim.binary)?;
    fsutil::remove_durable(&local)?;
    // <shims>/<name>/<digest>/ and <shims>/<name>/ when they are empty
    let mut dir = local.parent().map(Path::to_path_buf);
    for _ in 0..2 {
        match dir {
            Some(d) if std::fs::remove_dir(&d).is_ok() => dir = d.parent().map(Path::to_path_buf),
            _ => break,
        }
    }
    Ok(())
}

pub(crate) fn gc_artifact(
    artifacts: &Store,
    state: &NodeState,
    digest: &str,
) -> anyhow::Result<()> {
    if !state.shims.values().any(|s| s.artifact_sha256 == digest) {
        artifacts.remove(digest)?;
    }
    Ok(())
}

/// What an uninstall did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UninstallOutcome {
    /// Config files whose bytes are back to what they were before the install.
    pub restored: Vec<String>,
    /// Config files changed by someone else since the install: only the handler was removed.
    pub changed_since: Vec<String>,
}

/// Undo an offline install of Shim `name`.
pub fn uninstall_offline(
    root: &HostRoot,
    settings: &Settings,
    name: &str,
) -> anyhow::Result<UninstallOutcome> {
    let state_dir = root.resolve(&settings.paths.state_dir)?;
    if !state_dir.join(crate::state::STATE_FILE).exists() {
        bail!(
            "no Shim named {name:?} is installed under {} (no state in {})",
            root.path().display(),
            settings.paths.state_dir
        );
    }
    let store = StateStore::open(&state_dir)?;
    let mut state = store.load()?.state;
    if state.journal.is_some() {
        roll_back_journal(root, &store, &mut state)?;
    }
    let Some(shim) = state.shims.get(name).cloned() else {
        let known: Vec<&str> = state.shims.keys().map(String::as_str).collect();
        bail!(
            "no Shim named {name:?} is installed (installed: {})",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    };
    let prof = profile::resolve(root, &settings.containerd);
    let set = containerd::load(
        root,
        Path::new(&prof.config),
        prof.dropin_dir.as_deref().map(Path::new),
    )?;
    let plan = containerd::plan_remove(&set, &shim.handler)?;

    let id = format!("{}-uninstall-{name}", now_secs());
    state.journal = Some(Journal::planned(
        id.clone(),
        TxnKind::Uninstall,
        vec![name.to_string()],
    ));
    store.save(&state)?;
    let mut undo = Undo::default();
    let touched: Vec<String> = plan
        .changes
        .iter()
        .map(|c| c.host_path.display().to_string())
        .collect();
    let staged = stage_backups(root, &state_dir, &id, &touched, &mut undo);
    let backups = match staged {
        Ok(b) => b,
        Err(e) => {
            undo.run();
            state.journal = None;
            store.save(&state)?;
            return Err(e);
        }
    };
    if let Some(j) = state.journal.as_mut() {
        j.backups = backups;
    }
    // Nothing to fetch and no slot offline: straight to Staged.
    for e in [Event::Fetched, Event::SlotAcquired, Event::Staged] {
        journal_event(&store, &mut state, e)?;
    }
    if let Err(e) = containerd::apply(root, &plan) {
        roll_back_journal(root, &store, &mut state)?;
        return Err(e.into());
    }
    journal_event(&store, &mut state, Event::Applied)?;
    remove_binary(root, &shim)?;
    state.shims.remove(name);
    state.journal = None;
    store.save(&state)?;
    let _ = std::fs::remove_dir_all(backups_dir(&state_dir, &id));
    gc_artifact(
        &Store::open(state_dir.join("store"))?,
        &state,
        &shim.artifact_sha256,
    )?;

    let mut out = UninstallOutcome {
        restored: vec![],
        changed_since: vec![],
    };
    for rec in &shim.config_files {
        let now = std::fs::read(root.resolve(&rec.path)?)
            .ok()
            .map(|b| sha256_hex(&b));
        if now == rec.sha256_before {
            out.restored.push(rec.path.clone());
        } else {
            out.changed_since.push(rec.path.clone());
        }
    }
    Ok(out)
}

/// The state document under `root`, read without taking the lock (for `status`).
pub fn read_state(root: &HostRoot, settings: &Settings) -> anyhow::Result<NodeState> {
    let path = root
        .resolve(&settings.paths.state_dir)?
        .join(crate::state::STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => crate::state::decode_document(&bytes)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NodeState::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// `status` as a table a person reads.
pub fn format_status_table(state: &NodeState) -> String {
    let mut rows = vec![
        ["NAME", "HANDLER", "STATE", "ORIGIN", "DIGEST", "BINARY"]
            .map(String::from)
            .to_vec(),
    ];
    for s in state.shims.values() {
        rows.push(vec![
            s.name.clone(),
            s.handler.clone(),
            s.state.to_string(),
            format!("{:?}", s.origin).to_lowercase(),
            s.artifact_sha256.chars().take(12).collect(),
            s.binary.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if state.shims.is_empty() {
        out.push_str("(no shims installed)\n");
    }
    if let Some(j) = &state.journal {
        out.push_str(&format!(
            "unfinished transaction {} ({:?} of {}) at phase {:?}\n",
            j.id,
            j.kind,
            j.shims.join(", "),
            j.phase
        ));
    }
    out
}
