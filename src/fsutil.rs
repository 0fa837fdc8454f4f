//! Crash-safe file writes, and the directories they need: temp file in the same directory → fsync → rename → fsync of the
//! directory. A reader sees the old bytes or the new bytes, never a mix, and after the call
//! returns the new bytes survive a power loss.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode and owner for a newly written file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileMode {
    pub mode: u32,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

impl FileMode {
    pub const fn new(mode: u32) -> Self {
        FileMode {
            mode,
            uid: None,
            gid: None,
        }
    }
}

/// Temporary sibling name for `path` (hidden, unique per process and call).
/// The names of the directories in `dir`, sorted; a missing `dir` has none.
pub fn subdir_names(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

pub fn temp_sibling(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = format!(
        ".{name}.shim-agent-{}-{}.tmp",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    path.with_file_name(tmp)
}

/// fsync a directory so that a rename or create inside it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Atomically replace (or create) `path` with `bytes`.
///
/// An existing file keeps its mode and owner; a new file gets `new_mode`
/// (default 0644, root-owned as the caller is).
pub fn write_atomic(path: &Path, bytes: &[u8], new_mode: Option<FileMode>) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let (mode, uid, gid) = match fs::metadata(path) {
        Ok(m) => (
            m.permissions().mode() & 0o7777,
            Some(m.uid()),
            Some(m.gid()),
        ),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let m = new_mode.unwrap_or(FileMode::new(0o644));
            (m.mode, m.uid, m.gid)
        }
        Err(e) => return Err(e),
    };
    let tmp = temp_sibling(path);
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        // mode given to open() is filtered by the umask: set it exactly.
        f.set_permissions(fs::Permissions::from_mode(mode))?;
        if uid.is_some() || gid.is_some() {
            let cur = f.metadata()?;
            if Some(cur.uid()) != uid || Some(cur.gid()) != gid {
                std::os::unix::fs::fchown(&f, uid, gid)?;
            }
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Remove a file and fsync its directory; a missing file is not an error.
pub fn remove_durable(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(dir)?;
    }
    Ok(())
}

/// A directory [`create_missing_dirs`] could not create, and why.
#[derive(Debug)]
pub struct DirError {
    pub path: PathBuf,
    pub source: io::Error,
}

impl From<DirError> for io::Error {
    fn from(e: DirError) -> Self {
        io::Error::new(
            e.source.kind(),
            format!("cannot create {}: {}", e.path.display(), e.source),
        )
    }
}

/// Create `dir` and its missing parents (with `mode`, else the umask's), and return the ones
/// this call created, outermost first, so the caller can take them away again. A directory
/// made meanwhile by someone else is not counted: not this call's to take away. When one
/// cannot be created, those created before it are removed again.
pub fn create_missing_dirs(dir: &Path, mode: Option<u32>) -> Result<Vec<PathBuf>, DirError> {
    let mut missing = Vec::new();
    let mut cur = Some(dir);
    while let Some(d) = cur {
        if d.exists() {
            break;
        }
        missing.push(d.to_path_buf());
        cur = d.parent();
    }
    missing.reverse();
    let mut created: Vec<PathBuf> = Vec::new();
    for d in missing {
        match fs::create_dir(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => continue,
            Err(source) => {
                for c in created.iter().rev() {
                    let _ = fs::remove_dir(c);
                }
                return Err(DirError { path: d, source });
            }
        }
        if let Some(m) = mode {
            let _ = fs::set_permissions(&d, fs::Permissions::from_mode(m));
        }
        created.push(d);
    }
    Ok(created)
}

/// Remove the directory `path` when it is empty, durably; `Ok(false)` when it holds
/// something or does not exist.
pub fn remove_dir_if_empty(path: &Path) -> io::Result<bool> {
    match fs::remove_dir(path) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::DirectoryNotEmpty
            ) =>
        {
            return Ok(false);
        }
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        sync_dir(dir)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_dirs_are_created_outermost_first_and_taken_back_when_one_cannot_be() {
        let d = tempfile::tempdir().unwrap();
        let deep = d.path().join("a/b/c");
        let made = create_missing_dirs(&deep, Some(0o750)).unwrap();
        assert_eq!(
            made,
            [d.path().join("a"), d.path().join("a/b"), deep.clone()]
        );
        assert_eq!(
            fs::metadata(&deep).unwrap().permissions().mode() & 0o777,
            0o750
        );
        assert!(
            create_missing_dirs(&deep, None).unwrap().is_empty(),
            "all there"
        );
        // the last one cannot be made (its name is too long): the one made before it goes again
        let bad = d.path().join("n").join("l".repeat(300));
        let e = create_missing_dirs(&bad, None).unwrap_err();
        assert_eq!(e.path, bad);
        assert!(!d.path().join("n").exists(), "taken back");
        let io: io::Error = e.into();
        assert!(io.to_string().contains("/n/lll"), "{io}");
    }

    #[test]
    fn replaces_content_and_keeps_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("config.toml");
        fs::write(&p, b"old").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, b"new", None).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"new");
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // no temp files left behind
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_directory_is_removed_only_when_empty() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("config-v3.toml.d");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("10-mine.toml"), b"").unwrap();
        assert!(!remove_dir_if_empty(&dir).unwrap(), "it holds a file");
        assert!(dir.exists());
        fs::remove_file(dir.join("10-mine.toml")).unwrap();
        assert!(remove_dir_if_empty(&dir).unwrap());
        assert!(!dir.exists());
        assert!(!remove_dir_if_empty(&dir).unwrap(), "gone already");
    }

    #[test]
    fn new_files_get_the_requested_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bin");
        write_atomic(&p, b"x", Some(FileMode::new(0o755))).unwrap();
        assert_eq!(
            fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o755
        );
    }

    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let d = tempfile::tempdir().unwrap();
        // target is a directory: rename fails
        let p = d.path().join("dir");
        fs::create_dir(&p).unwrap();
        fs::write(p.join("x"), b"").unwrap();
        assert!(write_atomic(&p, b"x", None).is_err());
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1);
    }
}
