//! The installed tree: a stored artifact placed whole, content-addressed, at
//! `/opt/shim-agent/shims/<shim>/<sha256>/` ([`place_tree`]), so that a runtime of several
//! files (gVisor's `runsc` beside its shim and a `runsc.toml`, kata's `opt/kata/…` tree)
//! finds them beside its shim; and the files of that tree named in a handler's options
//! ([`resolve_option_paths`]).
//!
//! # Guarantees
//! - A new version's tree is built in a hidden sibling (`.<sha256>.tmp`) and renamed into
//!   place once complete: a crash leaves the whole tree or none of it.
//! - An existing version's tree is repaired file by file (a file deleted by hand is put
//!   back; identical files are left alone, so a running shim keeps its inode).
//! - Files keep the store's modes (0755 or 0644, set by the unpacker), directories are
//!   0755, all root-owned; symlinks are recreated as they are (the unpacker allowed only
//!   links that stay inside the tree).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::ArtifactError;
use super::place::{SHIMS_DIR, create_dirs, install_file, list_files};
use crate::fsutil::sync_dir;
use crate::hostroot::HostRoot;

/// An installed tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTree {
    /// As the host sees it: `/opt/shim-agent/shims/<shim>/<sha256>`.
    pub host_dir: PathBuf,
    /// As this process reaches it (under the HostRoot).
    pub local_dir: PathBuf,
    /// Files (and links) written now; 0 when the tree was already complete.
    pub written: usize,
}

/// The host directory of a Shim's installed version `digest`.
pub fn version_dir(shim_name: &str, digest: &str) -> PathBuf {
    Path::new(SHIMS_DIR).join(shim_name).join(digest)
}

/// Install the tree `src` (a stored artifact) as `version_dir(shim_name, digest)`.
pub fn place_tree(
    root: &HostRoot,
    shim_name: &str,
    digest: &str,
    src: &Path,
) -> Result<PlacedTree, ArtifactError> {
    for (what, part) in [("shim name", shim_name), ("digest", digest)] {
        if part.is_empty() || part.starts_with('.') || part.contains('/') {
            return Err(ArtifactError::InvalidSpec {
                detail: format!("{what} {part:?} cannot be used as a path component"),
            });
        }
    }
    let host_dir = version_dir(shim_name, digest);
    let local_dir = root
        .resolve(&host_dir)
        .map_err(|e| ArtifactError::io("resolve", &host_dir, e))?;
    let files = list_files(src)?;
    if local_dir.is_dir() {
        let written = copy_tree(src, &files, &local_dir)?;
        return Ok(PlacedTree {
            host_dir,
            local_dir,
            written,
        });
    }
    let parent = local_dir.parent().unwrap_or(root.path()).to_path_buf();
    let created = create_dirs(&parent)?;
    let staging = parent.join(format!(".{digest}.tmp"));
    let result = (|| {
        if staging.exists() {
            fs::remove_dir_all(&staging)
                .map_err(|e| ArtifactError::io("remove stale", &staging, e))?;
        }
        make_dir(&staging)?;
        let written = copy_tree(src, &files, &staging)?;
        fs::rename(&staging, &local_dir)
            .map_err(|e| ArtifactError::io("rename into", &local_dir, e))?;
        sync_dir(&parent).map_err(|e| ArtifactError::io("sync", &parent, e))?;
        Ok(written)
    })();
    match result {
        Ok(written) => Ok(PlacedTree {
            host_dir,
            local_dir,
            written,
        }),
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            for d in created.iter().rev() {
                let _ = fs::remove_dir(d); // only succeeds while empty
            }
            Err(e)
        }
    }
}

/// Copy every file and link of `src` (listed in `files`) to the same relative path under
/// `dest`; returns how many were written.
fn copy_tree(src: &Path, files: &[PathBuf], dest: &Path) -> Result<usize, ArtifactError> {
    let mut written = 0;
    for from in files {
        let rel = from.strip_prefix(src).unwrap_or(from);
        let to = dest.join(rel);
        if let Some(dir) = to.parent() {
            create_dirs(dir)?;
        }
        let meta = fs::symlink_metadata(from).map_err(|e| ArtifactError::io("inspect", from, e))?;
        if meta.file_type().is_symlink() {
            let target =
                fs::read_link(from).map_err(|e| ArtifactError::io("read link", from, e))?;
            if fs::read_link(&to).ok().as_deref() == Some(target.as_path()) {
                continue;
            }
            let _ = fs::remove_file(&to);
            std::os::unix::fs::symlink(&target, &to)
                .map_err(|e| ArtifactError::io("create link", &to, e))?;
            written += 1;
        } else {
            let mode = if meta.permissions().mode() & 0o111 != 0 {
                0o755
            } else {
                0o644
            };
            if !install_file(from, &to, mode)? {
                written += 1;
            }
        }
    }
    Ok(written)
}

fn make_dir(p: &Path) -> Result<(), ArtifactError> {
    fs::create_dir(p).map_err(|e| ArtifactError::io("create directory", p, e))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(|e| ArtifactError::io("set mode of", p, e))
}

/// The relative path of `file` inside the tree `dir` ("/"-separated).
pub fn relative_in(dir: &Path, file: &Path) -> String {
    file.strip_prefix(dir)
        .unwrap_or(file)
        .to_string_lossy()
        .into_owned()
}

/// `runtime.optionPaths` made absolute: each relative path must name a file (or a link to
/// one) in the stored tree `dir`; the value is its path under the installed `host_dir`. An
/// option also set in `options` is refused.
pub fn resolve_option_paths(
    dir: &Path,
    host_dir: &Path,
    option_paths: &BTreeMap<String, String>,
    options: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<BTreeMap<String, String>, ArtifactError> {
    let mut out = BTreeMap::new();
    for (option, rel) in option_paths {
        if options.is_some_and(|o| o.contains_key(option)) {
            return Err(ArtifactError::InvalidSpec {
                detail: format!(
                    "runtime.optionPaths.{option} and runtime.options.{option} both set the option; keep one"
                ),
            });
        }
        let clean = rel.trim_start_matches("./");
        let bad = clean.is_empty() || clean.starts_with('/') || clean.split('/').any(|c| c == "..");
        let local = dir.join(clean);
        let inside = fs::canonicalize(&local)
            .ok()
            .zip(fs::canonicalize(dir).ok())
            .is_some_and(|(f, d)| f.starts_with(&d) && f.is_file());
        if bad || !inside {
            return Err(ArtifactError::InvalidSpec {
                detail: format!(
                    "runtime.optionPaths.{option} names {rel:?}, which is not a file in the artifact"
                ),
            });
        }
        out.insert(
            option.clone(),
            host_dir.join(clean).to_string_lossy().into_owned(),
        );
    }
    Ok(out)
}
