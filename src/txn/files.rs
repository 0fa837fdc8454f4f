//! The host files of a transaction: the in-memory undo log of one run, the journal's
//! backups (stage and restore), and the artifact store's garbage collection.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::artifact::Store;
use crate::fsutil;
use crate::hostroot::HostRoot;
use crate::state::{Backup, Journal, NodeState};

use super::record::sha256_hex;

/// Undo log of one run: what to put back if a later step fails.
#[derive(Default)]
pub struct Undo {
    /// Local paths of files to restore (Some bytes) or delete (None), in order of change.
    files: Vec<(PathBuf, Option<Vec<u8>>)>,
    /// Local paths of directories this run created, in order of creation.
    dirs: Vec<PathBuf>,
}

impl Undo {
    /// Create `dir` and its missing parents, remembering each one created.
    pub fn create_dir_all(&mut self, dir: &Path) -> std::io::Result<()> {
        let created = fsutil::create_missing_dirs(dir, None)?;
        self.dirs.extend(created);
        Ok(())
    }

    /// Remember a directory this run created by other means (an artifact the store unpacked).
    pub fn created_dir(&mut self, dir: PathBuf) {
        self.dirs.push(dir);
    }

    /// Remember the current content of a file before changing it.
    pub fn save_file(&mut self, local: &Path) -> std::io::Result<()> {
        let before = match std::fs::read(local) {
            Ok(b) => Some(b),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        self.files.push((local.to_path_buf(), before));
        Ok(())
    }

    /// Put everything back, newest first. Errors are logged: undo goes on regardless.
    pub fn run(self) {
        for (path, before) in self.files.into_iter().rev() {
            let r = match before {
                Some(bytes) => fsutil::write_atomic(&path, &bytes, None),
                None => fsutil::remove_durable(&path),
            };
            if let Err(e) = r {
                tracing::error!(path = %path.display(), "undo: cannot restore file: {e}");
            }
        }
        for dir in self.dirs.into_iter().rev() {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::error!(path = %dir.display(), "undo: cannot remove directory: {e}")
                }
            }
        }
    }
}

/// Where the journal `id` keeps its backups.
pub fn backups_dir(state_dir: &Path, id: &str) -> PathBuf {
    state_dir.join("backups").join(id)
}

/// Save `before` copies of every file in `paths` (host paths) for the journal.
pub fn stage_backups(
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

/// Put every backed-up file back (or delete files that did not exist), newest first;
/// files that already hold their backed-up bytes are left alone (idempotent).
///
/// With `keep_new_versions`, the files of the transaction's new versions (in their
/// content-addressed directories) stay: containerd ran with them, so a task may have started
/// through one; the caller retires them, and they go once no task uses them.
pub fn restore_backups(
    root: &HostRoot,
    j: &Journal,
    keep_new_versions: bool,
) -> anyhow::Result<()> {
    let new_dirs: Vec<std::path::PathBuf> = j
        .pending
        .iter()
        .map(|p| crate::artifact::version_dir(&p.name, &p.artifact_sha256))
        .collect();
    for b in j.backups.iter().rev() {
        let new_file = b.saved_as.is_none();
        if keep_new_versions
            && new_file
            && new_dirs.iter().any(|d| Path::new(&b.path).starts_with(d))
        {
            continue;
        }
        let local = root.resolve(&b.path)?;
        match &b.saved_as {
            Some(saved) => {
                let bytes = std::fs::read(root.resolve(saved)?)
                    .with_context(|| format!("backup {saved} of {} is missing", b.path))?;
                if std::fs::read(&local).ok().as_deref() != Some(&bytes[..]) {
                    // the transaction may have removed the file's directory with it
                    if let Some(dir) = local.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    fsutil::write_atomic(&local, &bytes, None)?;
                }
            }
            None => fsutil::remove_durable(&local)?,
        }
    }
    Ok(())
}

/// Drop the artifact `digest` from the store unless an installed shim still uses it.
pub fn gc_artifact(artifacts: &Store, state: &NodeState, digest: &str) -> anyhow::Result<()> {
    if !state.shims.values().any(|s| s.artifact_sha256 == digest) {
        artifacts.remove(digest)?;
    }
    Ok(())
}
