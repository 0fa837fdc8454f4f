//! From a stored artifact to the installed shim: find the binary in the unpacked tree
//! ([`find_shim_binary`]) and install it, content-addressed, at
//! `/opt/shim-agent/shims/<shim>/<sha256>/<binary>` ([`place_binary`]).
//!
//! Guarantees: the installed file is written to a temp name, fsynced and renamed, never
//! rewritten in place (a running shim keeps its inode); an existing identical file is
//! left alone; a failure removes the temp file and the directories this call created.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::paths::shown_name;
use super::{ArtifactError, elf};
use crate::fsutil::{sync_dir, temp_sibling};
use crate::hostroot::HostRoot;

/// Host directory under which shims are installed.
pub const SHIMS_DIR: &str = "/opt/shim-agent/shims";

/// Entries listed in a "no shim binary" message.
const LISTED_MAX: usize = 20;

/// An installed shim binary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedBinary {
    /// As the host sees it: what containerd's config names.
    pub host_path: PathBuf,
    /// As this process reaches it (under the HostRoot).
    pub local_path: PathBuf,
    /// True when an identical file was already there.
    pub already_present: bool,
}

/// True for `containerd-shim-<name>-v<N>`.
pub fn is_shim_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("containerd-shim-") else {
        return false;
    };
    match rest.rsplit_once("-v") {
        Some((middle, ver)) => {
            !middle.is_empty() && !ver.is_empty() && ver.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

/// Find the shim binary in an unpacked artifact and check it is an ELF executable for
/// `arch`. `wanted` is `runtime.binary`: a file name (searched anywhere in the tree) or a
/// relative path; without it, the one `containerd-shim-*-v*` file is taken.
pub fn find_shim_binary(
    dir: &Path,
    wanted: Option<&str>,
    arch: &str,
) -> Result<PathBuf, ArtifactError> {
    let files = list_files(dir)?;
    let rel_names: Vec<String> = files
        .iter()
        .map(|p| p.strip_prefix(dir).unwrap_or(p).display().to_string())
        .collect();
    let name_of = |p: &PathBuf| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let candidates: Vec<&PathBuf> = match wanted {
        Some(w) if w.contains('/') => {
            let w = w.trim_start_matches("./");
            files
                .iter()
                .zip(&rel_names)
                .filter(|(_, r)| r.as_str() == w)
                .map(|(p, _)| p)
                .collect()
        }
        Some(w) => files
            .iter()
            .filter(|p| name_of(p).as_deref() == Some(w))
            .collect(),
        None => files
            .iter()
            .filter(|p| name_of(p).is_some_and(|n| is_shim_name(&n)))
            .collect(),
    };
    let path = match candidates.as_slice() {
        [one] => (*one).clone(),
        [] => {
            let mut found: Vec<String> = files.iter().map(|p| listed(dir, p)).collect();
            if found.len() > LISTED_MAX {
                let more = found.len() - LISTED_MAX;
                found.truncate(LISTED_MAX);
                found.push(format!("... {more} more"));
            }
            return Err(ArtifactError::NoShimBinary {
                wanted: match wanted {
                    Some(w) => format!("{w:?}"),
                    None => "matching containerd-shim-*-v*".to_string(),
                },
                found: found.join(", "),
            });
        }
        many => {
            let names: Vec<String> = many.iter().map(|p| listed(dir, p)).collect();
            return Err(ArtifactError::AmbiguousShimBinary {
                candidates: names.join(", "),
            });
        }
    };
    // A symlink must lead to a regular file inside the tree.
    let real = fs::canonicalize(&path).map_err(|e| ArtifactError::io("resolve", &path, e))?;
    let root = fs::canonicalize(dir).map_err(|e| ArtifactError::io("resolve", dir, e))?;
    if !real.starts_with(&root) || !real.is_file() {
        return Err(ArtifactError::NotExecutable {
            path,
            detail: "a link that does not lead to a file in the artifact".into(),
        });
    }
    elf::check_elf(&path, arch)?;
    Ok(path)
}

/// A file of the artifact as a message lists it: relative, quoted and escaped (names are
/// any bytes: control characters, invalid UTF-8), cut if long.
fn listed(dir: &Path, p: &Path) -> String {
    let rel = p.strip_prefix(dir).unwrap_or(p);
    format!("{:?}", shown_name(rel.as_os_str().as_bytes()))
}

/// Files and symlinks in a tree, sorted, not following links.
pub(super) fn list_files(dir: &Path) -> Result<Vec<PathBuf>, ArtifactError> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let entries = fs::read_dir(&d).map_err(|e| ArtifactError::io("list", &d, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ArtifactError::io("list", &d, e))?;
            let t = entry
                .file_type()
                .map_err(|e| ArtifactError::io("inspect", entry.path(), e))?;
            if t.is_dir() {
                todo.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Install `bin_path` as `/opt/shim-agent/shims/<shim_name>/<digest>/<file name>` under
/// `root`, root-owned 0755.
pub fn place_binary(
    root: &HostRoot,
    shim_name: &str,
    digest: &str,
    bin_path: &Path,
) -> Result<PlacedBinary, ArtifactError> {
    let file_name = bin_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for (what, part) in [
        ("shim name", shim_name),
        ("digest", digest),
        ("binary name", &file_name),
    ] {
        if part.is_empty() || part == "." || part == ".." || part.contains('/') {
            return Err(ArtifactError::InvalidSpec {
                detail: format!("{what} {part:?} cannot be used as a path component"),
            });
        }
    }
    let host_path = Path::new(SHIMS_DIR)
        .join(shim_name)
        .join(digest)
        .join(&file_name);
    let local_path = root
        .resolve(&host_path)
        .map_err(|e| ArtifactError::io("resolve", &host_path, e))?;
    let dir = local_path.parent().unwrap_or(root.path()).to_path_buf();
    let created = create_dirs(&dir)?;
    let result = install_file(bin_path, &local_path, 0o755);
    if result.is_err() {
        for d in created.iter().rev() {
            let _ = fs::remove_dir(d); // only succeeds while empty
        }
    }
    let already_present = result?;
    Ok(PlacedBinary {
        host_path,
        local_path,
        already_present,
    })
}

/// Create missing directories (0755); returns the ones created, outermost first.
pub(super) fn create_dirs(dir: &Path) -> Result<Vec<PathBuf>, ArtifactError> {
    crate::fsutil::create_missing_dirs(dir, Some(0o755))
        .map_err(|e| ArtifactError::io("create directory", &e.path, e.source))
}

/// Copy `src` to `dest` (root-owned, `mode`) through a temp sibling; Ok(true) if an
/// identical file was there.
pub(super) fn install_file(src: &Path, dest: &Path, mode: u32) -> Result<bool, ArtifactError> {
    if let Ok(m) = fs::symlink_metadata(dest)
        && m.is_file()
        && same_content(src, dest).unwrap_or(false)
    {
        if m.permissions().mode() & 0o7777 != mode {
            fs::set_permissions(dest, fs::Permissions::from_mode(mode))
                .map_err(|e| ArtifactError::io("set mode of", dest, e))?;
        }
        return Ok(true);
    }
    let tmp = temp_sibling(dest);
    let result = (|| -> Result<(), ArtifactError> {
        let mut from = File::open(src).map_err(|e| ArtifactError::io("open", src, e))?;
        let mut to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(|e| ArtifactError::io("create", &tmp, e))?;
        io::copy(&mut from, &mut to).map_err(|e| ArtifactError::io("write", &tmp, e))?;
        to.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| ArtifactError::io("set mode of", &tmp, e))?;
        chown_root(&to).map_err(|e| ArtifactError::io("chown", &tmp, e))?;
        to.sync_all()
            .map_err(|e| ArtifactError::io("sync", &tmp, e))?;
        fs::rename(&tmp, dest).map_err(|e| ArtifactError::io("rename into", dest, e))?;
        if let Some(parent) = dest.parent() {
            sync_dir(parent).map_err(|e| ArtifactError::io("sync", parent, e))?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|()| false)
}

/// Make the file root-owned. Without the privilege to do so (tests as a normal user), the
/// file stays with the caller.
fn chown_root(f: &File) -> io::Result<()> {
    let m = f.metadata()?;
    if m.uid() == 0 && m.gid() == 0 {
        return Ok(());
    }
    match std::os::unix::fs::fchown(f, Some(0), Some(0)) {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied && m.uid() != 0 => Ok(()),
        other => other,
    }
}

/// Byte-for-byte comparison.
fn same_content(a: &Path, b: &Path) -> io::Result<bool> {
    let (ma, mb) = (fs::metadata(a)?, fs::metadata(b)?);
    if ma.len() != mb.len() {
        return Ok(false);
    }
    let (mut fa, mut fb) = (File::open(a)?, File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = read_full(&mut fa, &mut ba)?;
        let m = read_full(&mut fb, &mut bb)?;
        if n != m || ba[..n] != bb[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_names_follow_the_containerd_pattern() {
        assert!(is_shim_name("containerd-shim-spin-v2"));
        assert!(is_shim_name("containerd-shim-runc-v10"));
        assert!(!is_shim_name("containerd-shim-v2"));
        assert!(!is_shim_name("containerd-shim-spin"));
        assert!(!is_shim_name("containerd-shim-spin-vx"));
        assert!(!is_shim_name("shim-spin-v2"));
    }
}
