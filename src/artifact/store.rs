//! The content-addressed store: `<dir>/sha256/<digest>/` holds the unpacked tree of the
//! artifact whose downloaded bytes have that sha256.
//!
//! Guarantees:
//! - an entry under `sha256/` is complete and verified: trees are built in
//!   `tmp/<unique>/`, fsynced, and renamed into place only after the digest matched;
//! - a failed or abandoned fetch leaves nothing behind: a [`Staging`] dir removes itself
//!   when dropped uncommitted, and [`Store::open`] clears `tmp/` left by a crash.
//!
//! Assumptions: one agent per node (the journal's file lock), so `open` may clear `tmp/`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::ArtifactError;
use crate::fsutil::sync_dir;

/// The content-addressed artifact store.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// A verified artifact in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredArtifact {
    /// sha256 of the downloaded bytes, 64 lowercase hex digits.
    pub digest: String,
    /// `<store>/sha256/<digest>`: the unpacked tree.
    pub dir: PathBuf,
    /// False when the artifact was already in the store (no network was used).
    pub fetched: bool,
    /// The registry host that served it (or its manifest) without its certificate being
    /// verified (containerd's `skip_verify`), in this fetch.
    pub insecure_host: Option<String>,
}

impl Store {
    /// Open (creating if needed) the store at `dir` and remove stale staging directories.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, ArtifactError> {
        let dir = dir.into();
        let store = Store { dir };
        for sub in [store.dir.join("sha256"), store.tmp_dir(), store.refs_dir()] {
            fs::create_dir_all(&sub)
                .map_err(|e| ArtifactError::io("create store directory", &sub, e))?;
        }
        let tmp = store.tmp_dir();
        let entries =
            fs::read_dir(&tmp).map_err(|e| ArtifactError::io("list store directory", &tmp, e))?;
        for entry in entries.flatten() {
            let p = entry.path();
            tracing::info!(path = %p.display(), "removing stale partial download");
            remove_tree(&p).map_err(|e| ArtifactError::io("remove stale download", &p, e))?;
        }
        Ok(store)
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// Small index files (OCI reference digest → layer digest).
    pub(crate) fn refs_dir(&self) -> PathBuf {
        self.dir.join("refs")
    }

    /// Where the artifact with `digest` lives (whether or not it is there).
    pub fn dir_of(&self, digest: &str) -> PathBuf {
        self.dir.join("sha256").join(digest)
    }

    /// The stored artifact with `digest`, if present.
    pub fn get(&self, digest: &str) -> Option<StoredArtifact> {
        let dir = self.dir_of(digest);
        match fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => Some(StoredArtifact {
                digest: digest.to_string(),
                dir,
                fetched: false,
                insecure_host: None,
            }),
            _ => None,
        }
    }

    /// Remove an artifact (garbage collection by the caller); missing is not an error.
    pub fn remove(&self, digest: &str) -> Result<(), ArtifactError> {
        let dir = self.dir_of(digest);
        match remove_tree(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ArtifactError::io("remove artifact", &dir, e)),
        }
    }

    /// A fresh, empty staging directory under `tmp/`.
    pub(crate) fn staging(&self) -> Result<Staging, ArtifactError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{}-{}-{nanos}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let path = self.tmp_dir().join(name);
        fs::create_dir(&path)
            .map_err(|e| ArtifactError::io("create staging directory", &path, e))?;
        Ok(Staging {
            path,
            committed: false,
        })
    }

    /// Move a fully verified staging tree into place under `digest`. If another fetch got
    /// there first, the staged copy is dropped and the existing entry returned.
    pub(crate) fn commit(
        &self,
        mut staging: Staging,
        digest: &str,
    ) -> Result<StoredArtifact, ArtifactError> {
        let dir = self.dir_of(digest);
        sync_tree_dirs(&staging.path)
            .map_err(|e| ArtifactError::io("sync staged artifact", &staging.path, e))?;
        match fs::rename(&staging.path, &dir) {
            Ok(()) => {
                staging.committed = true;
                let parent = self.dir.join("sha256");
                sync_dir(&parent).map_err(|e| ArtifactError::io("sync store", &parent, e))?;
            }
            // Already present (a directory that is not empty): keep the existing one.
            Err(_) if dir.is_dir() => {}
            Err(e) => return Err(ArtifactError::io("move artifact into the store", &dir, e)),
        }
        Ok(StoredArtifact {
            digest: digest.to_string(),
            dir,
            fetched: true,
            insecure_host: None,
        })
    }
}

/// A staging directory under `store/tmp/`; removed on drop unless committed.
#[derive(Debug)]
pub(crate) struct Staging {
    path: PathBuf,
    committed: bool,
}

impl Staging {
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Empty it for a new attempt.
    pub(crate) fn reset(&self) -> Result<(), ArtifactError> {
        remove_tree(&self.path).map_err(|e| ArtifactError::io("clear staging", &self.path, e))?;
        fs::create_dir(&self.path).map_err(|e| ArtifactError::io("create staging", &self.path, e))
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = remove_tree(&self.path);
        }
    }
}

/// Remove a file or a directory tree without following symlinks.
fn remove_tree(p: &Path) -> io::Result<()> {
    match fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(p),
        Ok(_) => fs::remove_file(p),
        Err(e) => Err(e),
    }
}

/// fsync every directory in a tree (files are synced as they are written).
fn sync_tree_dirs(root: &Path) -> io::Result<()> {
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in fs::read_dir(&d)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                todo.push(entry.path());
            }
        }
        sync_dir(&d)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_clears_stale_partial_downloads() {
        let d = tempfile::tempdir().unwrap();
        let stale = d.path().join("tmp/1234-0-0/sub");
        fs::create_dir_all(&stale).unwrap();
        fs::write(stale.join("partial"), b"x").unwrap();
        let store = Store::open(d.path()).unwrap();
        assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn uncommitted_staging_disappears_and_committed_is_found() {
        let d = tempfile::tempdir().unwrap();
        let store = Store::open(d.path()).unwrap();
        let s = store.staging().unwrap();
        fs::write(s.path().join("f"), b"x").unwrap();
        drop(s);
        assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0);

        let digest = "ab".repeat(32);
        assert!(store.get(&digest).is_none());
        let s = store.staging().unwrap();
        fs::write(s.path().join("f"), b"x").unwrap();
        let a = store.commit(s, &digest).unwrap();
        assert_eq!(fs::read(a.dir.join("f")).unwrap(), b"x");
        assert_eq!(store.get(&digest).unwrap().dir, a.dir);
        // a second commit of the same digest keeps the first and cleans up
        let s = store.staging().unwrap();
        fs::write(s.path().join("g"), b"y").unwrap();
        store.commit(s, &digest).unwrap();
        assert!(!a.dir.join("g").exists());
        assert_eq!(fs::read_dir(store.tmp_dir()).unwrap().count(), 0);
    }
}
