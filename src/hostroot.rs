//! `HostRoot`: the one place where host paths are resolved.
//!
//! Every file the agent reads or writes on the host goes through a [`HostRoot`]: `/` in
//! production, a temporary directory in tests, a mounted image in offline mode
//! (`--root DIR`). Paths handed to it are *host* paths (absolute, as the node sees them);
//! [`HostRoot::resolve`] maps them under the root and refuses anything that would escape it
//! (`..` components or symlinks pointing outside the root).
//!
//! Guarantees: a path returned by `resolve` is lexically under the root, and no existing
//! symlink along it (below the root) leads outside the root.

use std::io;
use std::path::{Component, Path, PathBuf};

/// A root directory under which all host paths are resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
}

/// Maximum number of symlinks followed while resolving one path (Linux uses 40).
const MAX_SYMLINK_HOPS: usize = 40;

impl HostRoot {
    /// The real host: `/`.
    pub fn system() -> Self {
        HostRoot {
            root: PathBuf::from("/"),
        }
    }

    /// A root directory; it must exist and be a directory.
    pub fn new(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        let meta = std::fs::metadata(&root)
            .map_err(|e| io::Error::new(e.kind(), format!("root {}: {e}", root.display())))?;
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("root {} is not a directory", root.display()),
            ));
        }
        let root = std::fs::canonicalize(&root)?;
        Ok(HostRoot { root })
    }

    /// The root directory itself (as seen from this process).
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// True when this root is the real `/`.
    pub fn is_system(&self) -> bool {
        self.root == Path::new("/")
    }

    /// Map a host path (absolute, e.g. `/etc/containerd/config.toml`) to the path this
    /// process uses. Relative paths are taken relative to the root's `/` (on the real host:
    /// to the working directory). Symlinks that
    /// already exist along the path are followed *inside* the root (an absolute link
    /// target is re-rooted), like `chroot` would; a path that would climb above the
    /// root is an error.
    pub fn resolve(&self, host_path: impl AsRef<Path>) -> io::Result<PathBuf> {
        let host_path = host_path.as_ref();
        // On the real host a relative path means what it means to the user: relative to the
        // working directory.
        let absolute;
        let host_path = if self.is_system() && host_path.is_relative() {
            absolute = std::path::absolute(host_path)?;
            absolute.as_path()
        } else {
            host_path
        };
        // Components still to walk, in reverse (so we can push link targets in front).
        let mut todo: Vec<PathBuf> = host_path
            .components()
            .rev()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(PathBuf::from(n)),
                Component::ParentDir => Some(PathBuf::from("..")),
                _ => None,
            })
            .collect();
        // The resolved path, as host components below the root.
        let mut done: Vec<std::ffi::OsString> = Vec::new();
        let mut hops = 0usize;
        while let Some(c) = todo.pop() {
            if c.as_os_str() == ".." {
                if done.pop().is_none() {
                    return Err(escape_error(host_path, &self.root));
                }
                continue;
            }
            done.push(c.into_os_string());
            let here = self.join(&done);
            match std::fs::symlink_metadata(&here) {
                Ok(m) if m.file_type().is_symlink() => {
                    hops += 1;
                    if hops > MAX_SYMLINK_HOPS {
                        return Err(io::Error::other(format!(
                            "too many symlinks resolving {}",
                            host_path.display()
                        )));
                    }
                    let target = std::fs::read_link(&here)?;
                    done.pop();
                    if target.is_absolute() {
                        done.clear();
                    }
                    for comp in target.components().rev() {
                        match comp {
                            Component::Normal(n) => todo.push(PathBuf::from(n)),
                            Component::ParentDir => todo.push(PathBuf::from("..")),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(self.join(&done))
    }

    fn join(&self, comps: &[std::ffi::OsString]) -> PathBuf {
        let mut p = self.root.clone();
        for c in comps {
            p.push(c);
        }
        p
    }

    /// Inverse of [`resolve`](Self::resolve) for display: the host path of a path under the root.
    pub fn host_path_of(&self, local: &Path) -> PathBuf {
        match local.strip_prefix(&self.root) {
            Ok(rel) => Path::new("/").join(rel),
            Err(_) => local.to_path_buf(),
        }
    }
}

fn escape_error(p: &Path, root: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("path {} escapes the root {}", p.display(), root.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_plain_paths_under_the_root() {
        let d = tempfile::tempdir().unwrap();
        let r = HostRoot::new(d.path()).unwrap();
        let p = r.resolve("/etc/containerd/config.toml").unwrap();
        assert_eq!(p, r.path().join("etc/containerd/config.toml"));
        assert_eq!(r.host_path_of(&p), Path::new("/etc/containerd/config.toml"));
    }

    #[test]
    fn refuses_dotdot_above_the_root() {
        let d = tempfile::tempdir().unwrap();
        let r = HostRoot::new(d.path()).unwrap();
        assert!(r.resolve("/../../etc/passwd").is_err());
        assert_eq!(r.resolve("/etc/../opt").unwrap(), r.path().join("opt"));
    }

    #[test]
    fn absolute_symlinks_are_rerooted() {
        let d = tempfile::tempdir().unwrap();
        let r = HostRoot::new(d.path()).unwrap();
        std::fs::create_dir_all(d.path().join("real/etc")).unwrap();
        std::os::unix::fs::symlink("/real/etc", d.path().join("etc")).unwrap();
        assert_eq!(
            r.resolve("/etc/x.toml").unwrap(),
            r.path().join("real/etc/x.toml")
        );
        // a relative link that climbs out is refused
        std::os::unix::fs::symlink("../../..", d.path().join("up")).unwrap();
        assert!(r.resolve("/up/etc").is_err());
    }

    #[test]
    fn a_root_that_is_not_a_directory_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        let e = HostRoot::new(&f).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");
        assert!(HostRoot::new(d.path().join("missing")).is_err());
    }
}
