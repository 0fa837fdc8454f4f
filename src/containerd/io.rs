//! The thin I/O shell: load a [`ConfigSet`] through a [`HostRoot`], apply a [`Plan`].

use std::io;
use std::path::{Path, PathBuf};

use crate::fsutil;
use crate::hostroot::HostRoot;

use super::error::ConfigError;
use super::plan::{self, ConfigFile, ConfigSet, Plan};

fn io_err(path: &Path, action: &str, source: io::Error) -> ConfigError {
    ConfigError::Io {
        path: path.to_path_buf(),
        action: action.to_string(),
        source,
    }
}

/// Read a host file; `Ok(None)` when it does not exist.
pub(super) fn read_optional(
    root: &HostRoot,
    host_path: &Path,
) -> Result<Option<Vec<u8>>, ConfigError> {
    let local = root
        .resolve(host_path)
        .map_err(|e| io_err(host_path, "cannot resolve the path", e))?;
    match std::fs::read(&local) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(host_path, "cannot read the file", e)),
    }
}

/// Load the main config and every drop-in it imports (globs expanded, sorted like containerd
/// does), plus the `*.toml` files of `extra_dir` (an explicit drop-in directory).
pub fn load(
    root: &HostRoot,
    main_host_path: &Path,
    extra_dir: Option<&Path>,
) -> Result<ConfigSet, ConfigError> {
    let bytes = read_optional(root, main_host_path)?.ok_or_else(|| {
        io_err(
            main_host_path,
            "the containerd config file does not exist (create it with `containerd config \
             default`, or pass --config with the file containerd is started with)",
            io::Error::from(io::ErrorKind::NotFound),
        )
    })?;
    let dropins = load_dropins(root, main_host_path, &bytes, extra_dir)?;
    Ok(ConfigSet {
        main: ConfigFile {
            host_path: main_host_path.to_path_buf(),
            bytes,
        },
        dropins,
    })
}

/// The drop-ins a main file with `bytes` imports (globs expanded, sorted like containerd
/// does), plus the `*.toml` files of `extra_dir`; missing files are left out.
pub(super) fn load_dropins(
    root: &HostRoot,
    main_host_path: &Path,
    bytes: &[u8],
    extra_dir: Option<&Path>,
) -> Result<Vec<ConfigFile>, ConfigError> {
    let base = main_host_path.parent().unwrap_or(Path::new("/"));
    let mut paths: Vec<PathBuf> = Vec::new();
    // An unparsable main file has no imports; planning reports its error.
    let imports = std::str::from_utf8(bytes)
        .ok()
        .and_then(|t| t.parse::<toml_edit::DocumentMut>().ok())
        .map(|d| super::schema::string_array(d.as_table().get("imports")))
        .unwrap_or_default();
    for import in &imports {
        let p = base.join(import);
        let is_glob = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(['*', '?']));
        match (is_glob, p.parent(), p.file_name()) {
            (true, Some(dir), Some(pat)) => {
                paths.extend(list_dir(root, dir, &pat.to_string_lossy())?)
            }
            _ => paths.push(p),
        }
    }
    if let Some(dir) = extra_dir {
        paths.extend(list_dir(root, &base.join(dir), "*.toml")?);
    }
    let mut dropins = Vec::new();
    for p in paths {
        if p == main_host_path || dropins.iter().any(|d: &ConfigFile| d.host_path == p) {
            continue;
        }
        if let Some(bytes) = read_optional(root, &p)? {
            dropins.push(ConfigFile {
                host_path: p,
                bytes,
            });
        }
    }
    Ok(dropins)
}

/// Host paths of the files in `dir` matching `pattern`, sorted; a missing dir is empty.
fn list_dir(root: &HostRoot, dir: &Path, pattern: &str) -> Result<Vec<PathBuf>, ConfigError> {
    let local = root
        .resolve(dir)
        .map_err(|e| io_err(dir, "cannot resolve the directory", e))?;
    let entries = match std::fs::read_dir(&local) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(dir, "cannot list the directory", e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| !n.starts_with('.') && plan::glob_match(pattern.as_bytes(), n.as_bytes()))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

/// Apply a plan: first check that every file still has the bytes the plan was made from
/// (nothing is written otherwise), then write (atomically, keeping mode and owner) or delete
/// each file in order, creating a missing directory for a new file; last, remove the
/// plan's directories that are empty now.
pub fn apply(root: &HostRoot, plan: &Plan) -> Result<(), ConfigError> {
    for c in &plan.changes {
        if read_optional(root, &c.host_path)? != c.before {
            return Err(ConfigError::StaleFile {
                path: c.host_path.clone(),
            });
        }
    }
    for c in &plan.changes {
        let local = root
            .resolve(&c.host_path)
            .map_err(|e| io_err(&c.host_path, "cannot resolve the path", e))?;
        match &c.after {
            Some(bytes) => {
                if let Some(dir) = local.parent()
                    && !dir.exists()
                {
                    std::fs::create_dir_all(dir)
                        .map_err(|e| io_err(&c.host_path, "cannot create the directory", e))?;
                    if let Some(up) = dir.parent() {
                        fsutil::sync_dir(up)
                            .map_err(|e| io_err(&c.host_path, "cannot sync the directory", e))?;
                    }
                }
                fsutil::write_atomic(&local, bytes, None)
                    .map_err(|e| io_err(&c.host_path, "cannot write the file", e))?;
            }
            None => fsutil::remove_durable(&local)
                .map_err(|e| io_err(&c.host_path, "cannot delete the file", e))?,
        }
    }
    for dir in &plan.remove_empty_dirs {
        let local = root
            .resolve(dir)
            .map_err(|e| io_err(dir, "cannot resolve the directory", e))?;
        fsutil::remove_dir_if_empty(&local)
            .map_err(|e| io_err(dir, "cannot remove the empty directory", e))?;
    }
    Ok(())
}
