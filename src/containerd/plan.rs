//! The pure planner: config bytes in, an ordered list of file changes out. No I/O.
//!
//! # Decisions
//! **Default runtime kept (1.x).** containerd 1.x replaces its default runtimes map with the
//! file's `runtimes` table, so for config versions 1 and 2 with no handler at all the agent
//! also writes `runc` explicitly, as containerd 1.6/1.7 define it by default:
//! `runtime_type = "io.containerd.runc.v2"` and no `options` table. Unset options are exactly
//! containerd's default (`SystemdCgroup = false`); a file with no runtimes table states no
//! per-runtime cgroup setting anywhere, so nothing else is copied. That table is marked
//! `# shim-agent: default runtime kept for handler <h>` and removed with the last handler that
//! needs it (`tests/pure/containerd_real.rs` checks with a real containerd 1.6.20 `config dump`
//! that every handler of every v1/v2 corpus file survives). Existing handlers (whatever `default_runtime_name` is: `nvidia`, `shimpei`, …)
//! are never touched. Version 3/4 files are only read by 2.x, which deep-merges: no runc.
//!
//! **Drop-ins only for config version ≥ 3.** On 1.x a drop-in replaces whole plugin sections:
//! a v2 drop-in holding only `runtimes.spin` would remove runc and every CRI setting of the
//! main file. A version 1/2 file may be read by 1.x, so it is always edited in place (and an
//! explicit drop-in dir is refused with `DropinUnsafe`). Version ≥ 3 implies containerd 2.x,
//! which deep-merges drop-ins; the drop-in carries the main file's version (2.3 refuses a
//! drop-in newer than its root). In `Auto` mode a drop-in is used when the main file already
//! imports a directory glob (k0s `/etc/k0s/containerd.d/*.toml`, containerd 2.2+
//! `/etc/containerd/conf.d/*.toml`, EKS `config.d`, and beside a k3s/rke2 rendered file
//! that is never edited, `config-v3.toml.d`: `template`); with an explicit dir and no covering
//! import, the exact file path is imported (created first, import removed first).
//!
//! **Refusals.** Templates (`{{`, `{%`, `+++` front matter, `${VAR}`), parse errors (line and
//! column), unknown versions, read-only or generated layouts (Flatcar `/usr`, Talos
//! `/etc/cri/`, Bottlerocket `shimpei`, k3s/rke2/microk8s generated files, k0s-managed file
//! edited in place), a disabled CRI plugin, runtime tables under another version's plugin ID,
//! a non-glob import whose file is missing (containerd would not start). Only drop-ins the
//! main file imports count as definitions of a handler.

use std::path::{Path, PathBuf};

use toml_edit::Table;

use super::doc::Doc;
use super::edit;
use super::error::ConfigError;
use super::marks::{self, Mark};
use super::schema::{self, Version};
use super::spec::{self, RuntimeSpec};

/// One config file as read from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigFile {
    /// Host path (as the node sees it, e.g. `/etc/containerd/config.toml`).
    pub host_path: PathBuf,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

/// The main config file and the drop-ins it imports (plus those of an explicit drop-in dir).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigSet {
    /// The file containerd is started with (`--config`).
    pub main: ConfigFile,
    /// Existing drop-ins, in the order containerd reads them.
    pub dropins: Vec<ConfigFile>,
}

/// Where a new handler goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DropinPolicy {
    /// A drop-in when the main file has config version ≥ 3 and already imports a directory
    /// glob; otherwise the main file, in place.
    #[default]
    Auto,
    /// Always the main file, in place.
    Never,
    /// A drop-in in this directory (version ≥ 3 only); the import is added when missing.
    Dir(PathBuf),
}

/// Options of [`plan_add`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AddOptions {
    /// Overwrite a handler of the same name that has different settings.
    pub replace: bool,
    /// Drop-in or in place.
    pub dropin: DropinPolicy,
}

/// One file to create, replace or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileChange {
    /// Host path of the file.
    pub host_path: PathBuf,
    /// Bytes expected on disk now (`None`: the file must not exist).
    pub before: Option<Vec<u8>>,
    /// Bytes to write (`None`: delete the file).
    pub after: Option<Vec<u8>>,
}

/// Ordered file changes: a drop-in is created before its import is added, and an import is
/// removed before its drop-in is deleted, so containerd never sees a missing import.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Changes in the order they must be applied.
    pub changes: Vec<FileChange>,
    /// Directories the agent created for its drop-ins, removed after the changes when they
    /// are empty (host paths; one that still holds a file stays).
    pub remove_empty_dirs: Vec<PathBuf>,
}

impl Plan {
    /// A plan of file changes only.
    pub fn of(changes: Vec<FileChange>) -> Plan {
        Plan {
            changes,
            remove_empty_dirs: Vec::new(),
        }
    }

    /// True when nothing needs to change.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty() && self.remove_empty_dirs.is_empty()
    }
}

/// A parsed, checked config file.
pub(crate) struct Analyzed {
    pub path: PathBuf,
    pub before: Vec<u8>,
    pub doc: Doc,
    pub version: Version,
}

/// Parse and check the main config file.
pub(crate) fn analyze_main(file: &ConfigFile) -> Result<Analyzed, ConfigError> {
    schema::check_path(&file.host_path)?;
    let a = analyze_common(file, None)?;
    schema::check_generated(&a.doc.text, &a.path)?;
    schema::check_content(&a.doc.doc, a.version, &a.path)?;
    Ok(a)
}

/// Parse and check a main file its distribution generates (k3s's and rke2's rendered
/// `config.toml`): the checks of [`analyze_main`] but those that refuse a generated file,
/// since it is only read here. [`plan_add_generated`] and [`plan_remove_generated`] never
/// change it.
pub(crate) fn analyze_generated(file: &ConfigFile) -> Result<Analyzed, ConfigError> {
    let a = analyze_common(file, None)?;
    schema::check_content(&a.doc.doc, a.version, &a.path)?;
    Ok(a)
}

/// Parse a drop-in; a drop-in without `version` is read with the main file's version.
pub(crate) fn analyze_dropin(file: &ConfigFile, main: Version) -> Result<Analyzed, ConfigError> {
    analyze_common(file, Some(main))
}

fn analyze_common(file: &ConfigFile, default: Option<Version>) -> Result<Analyzed, ConfigError> {
    let path = &file.host_path;
    let lossy = String::from_utf8_lossy(&file.bytes);
    if let Some(marker) = schema::template_marker(path, &lossy) {
        return Err(ConfigError::TemplateFile {
            path: path.clone(),
            marker: marker.to_string(),
        });
    }
    let doc = Doc::parse(path, &file.bytes)?;
    let version = match (default, doc.doc.as_table().contains_key("version")) {
        (Some(v), false) => v,
        _ => schema::detect_version(&doc.doc, path)?,
    };
    Ok(Analyzed {
        path: path.clone(),
        before: file.bytes.clone(),
        doc,
        version,
    })
}

/// Where the handler is defined: index into `[main, dropins...]` and its plain value.
pub(super) struct Definition {
    pub(super) file: usize,
    pub(super) value: serde_json::Value,
    pub(super) mark: Mark,
}

pub(super) fn find_definitions(files: &[Analyzed], handler: &str) -> Vec<Definition> {
    files
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let item = edit::handler_item(&f.doc.doc, f.version, handler)?;
            Some(Definition {
                file: i,
                value: spec::item_to_json(item),
                mark: edit::handler_mark(&f.doc.doc, f.version, handler),
            })
        })
        .collect()
}

pub(super) fn load_all(
    set: &ConfigSet,
    analyze: fn(&ConfigFile) -> Result<Analyzed, ConfigError>,
) -> Result<Vec<Analyzed>, ConfigError> {
    let main = analyze(&set.main)?;
    let v = main.version;
    let base = main.path.parent().unwrap_or(Path::new("/")).to_path_buf();
    for import in schema::string_array(main.doc.doc.as_table().get("imports")) {
        let p = base.join(&import);
        let is_glob = p
            .file_name()
            .is_some_and(|n| n.to_string_lossy().contains(['*', '?', '[']));
        if !is_glob && !set.dropins.iter().any(|d| d.host_path == p) {
            return Err(ConfigError::MissingImport {
                path: main.path.clone(),
                import,
            });
        }
    }
    let imports = schema::string_array(main.doc.doc.as_table().get("imports"));
    let mut files = vec![main];
    // Only drop-ins containerd reads count (a file of an explicit --dropin-dir that is not
    // imported is not part of the config).
    for d in &set.dropins {
        if is_imported(&base, &imports, &d.host_path) {
            files.push(analyze_dropin(d, v)?);
        }
    }
    Ok(files)
}

fn is_imported(base: &Path, imports: &[String], file: &Path) -> bool {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name().and_then(|n| n.to_str())) else {
        return false;
    };
    imports
        .iter()
        .any(|i| base.join(i) == file || glob_dir(base, i, name).is_some_and(|d| d == dir))
}

/// Handlers of a generated main file and the drop-ins it imports.
pub(crate) fn generated_handler_names(set: &ConfigSet) -> Result<Vec<String>, ConfigError> {
    Ok(load_all(set, analyze_generated)?
        .iter()
        .flat_map(|f| edit::handler_names(&f.doc.doc, f.version))
        .collect())
}

/// A plan that would change a generated main file is refused: the distribution writes it
/// again at its next start.
pub(super) fn refuse_generated_edit(
    set: &ConfigSet,
    plan: Plan,
    by: &str,
) -> Result<Plan, ConfigError> {
    if plan
        .changes
        .iter()
        .any(|c| c.host_path == set.main.host_path)
    {
        return Err(ConfigError::GeneratedFile {
            path: set.main.host_path.clone(),
            by: by.to_string(),
            hint: "the handler belongs in a drop-in the file imports; nothing was written".into(),
        });
    }
    Ok(plan)
}

/// Render an edited file and re-parse it: the result must parse, and where the edit was
/// spliced into the original text it must read back as the edited document.
pub(super) fn render_checked(
    f: &Analyzed,
) -> Result<(Vec<u8>, toml_edit::DocumentMut), ConfigError> {
    let after = f.doc.render();
    let reread: toml_edit::DocumentMut = std::str::from_utf8(&after)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or_else(|| unexpected(&f.path))?;
    if f.doc.is_spliced()
        && spec::item_to_json(reread.as_item()) != spec::item_to_json(f.doc.doc.as_item())
    {
        return Err(unexpected(&f.path));
    }
    Ok((after, reread))
}

pub(super) fn unexpected(path: &Path) -> ConfigError {
    ConfigError::UnsupportedLayout {
        path: path.to_path_buf(),
        detail: "the edited file did not read back as planned (unexpected layout); nothing was \
                 written, please report this file"
            .into(),
    }
}

/// containerd 1.x replaces its default runtimes map with the file's `runtimes` table: when the
/// file has none, the default (runc) must be written explicitly next to the new handler.
pub(super) fn keep_default<'a>(main: &Analyzed, handler: &str) -> Option<&'a str> {
    let empty = edit::handler_names(&main.doc.doc, main.version).is_empty();
    (main.version.0 <= 2 && empty && handler != marks::KEPT_RUNTIME).then_some(marks::KEPT_RUNTIME)
}

/// containerd's own default runc handler (1.6/1.7 `DefaultConfig`): only its runtime type. Its
/// options are left unset, which is containerd's default (`SystemdCgroup = false`).
pub(super) fn runc_default() -> Table {
    let mut t = Table::new();
    t.insert("runtime_type", toml_edit::value("io.containerd.runc.v2"));
    t
}

/// On 1.x a drop-in that defines the CRI plugin replaces the main file's whole section.
pub(super) fn check_not_shadowed(files: &[Analyzed]) -> Result<(), ConfigError> {
    let main = &files[0];
    if main.version.0 >= 3 {
        return Ok(());
    }
    let id = schema::runtime_plugin_id(main.version);
    for d in &files[1..] {
        if schema::get_path(d.doc.doc.as_table(), &["plugins", id]).is_some() {
            return Err(ConfigError::ShadowedByDropin {
                path: main.path.clone(),
                dropin: d.path.clone(),
            });
        }
    }
    Ok(())
}

pub(super) enum Target {
    InPlace,
    Dropin {
        file: PathBuf,
        import: Option<String>,
    },
}

/// File name of the agent's drop-in for a handler.
pub fn dropin_file_name(handler: &str) -> String {
    format!("shim-agent-{handler}.toml")
}

pub(super) fn choose_target(
    files: &[Analyzed],
    spec: &RuntimeSpec,
    opts: &AddOptions,
) -> Result<Target, ConfigError> {
    let main = &files[0];
    let name = dropin_file_name(&spec.handler);
    let imports = schema::string_array(main.doc.doc.as_table().get("imports"));
    let base = main.path.parent().unwrap_or(Path::new("/"));
    let target = match &opts.dropin {
        DropinPolicy::Never => Target::InPlace,
        DropinPolicy::Auto => {
            let covered = imports.iter().find_map(|i| glob_dir(base, i, &name));
            match covered {
                Some(dir) if main.version.0 >= 3 => Target::Dropin {
                    file: dir.join(&name),
                    import: None,
                },
                _ => Target::InPlace,
            }
        }
        DropinPolicy::Dir(dir) => {
            if main.version.0 < 3 {
                return Err(ConfigError::DropinUnsafe {
                    path: main.path.clone(),
                    version: main.version.0,
                });
            }
            let dir = base.join(dir);
            let file = dir.join(&name);
            let covered = imports.iter().any(|i| {
                glob_dir(base, i, &name).is_some_and(|d| d == dir) || base.join(i) == file
            });
            let import = (!covered).then(|| file.to_string_lossy().into_owned());
            Target::Dropin { file, import }
        }
    };
    if matches!(target, Target::InPlace) && main.doc.text.starts_with("# k0s_managed=true") {
        return Err(ConfigError::GeneratedFile {
            path: main.path.clone(),
            by: "k0s (first line `# k0s_managed=true`)".into(),
            hint: "add the handler as a drop-in in /etc/k0s/containerd.d/ (--dropin-dir)".into(),
        });
    }
    Ok(target)
}

/// The directory of a glob import whose pattern matches `name` (`dir/*.toml`, `dir/*`).
pub(crate) fn glob_dir(base: &Path, import: &str, name: &str) -> Option<PathBuf> {
    let p = base.join(import);
    let pattern = p.file_name()?.to_str()?;
    let dir = p.parent()?;
    let is_glob = pattern.contains(['*', '?']);
    let dir_plain = !dir.to_string_lossy().contains(['*', '?', '[']);
    (is_glob && dir_plain && glob_match(pattern.as_bytes(), name.as_bytes()))
        .then(|| dir.to_path_buf())
}

/// `*` and `?` glob match of one path component.
pub(crate) fn glob_match(p: &[u8], s: &[u8]) -> bool {
    match (p.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob_match(&p[1..], s) || (!s.is_empty() && glob_match(p, &s[1..])),
        (Some(b'?'), Some(_)) => glob_match(&p[1..], &s[1..]),
        (Some(a), Some(b)) if a == b => glob_match(&p[1..], &s[1..]),
        _ => false,
    }
}
