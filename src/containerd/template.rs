//! k3s and rke2: containerd's config is rendered from a Go template at every start, so the
//! handler goes into the template, never into the rendered file.
//!
//! The template is `config-v3.toml.tmpl` (their containerd 2.x releases, config version 3)
//! or `config.toml.tmpl`, beside the rendered `config.toml`; an existing one is used as it is.
//! A new one starts with a marker line and `{{ template "base" . }}` (the distro's own config,
//! kept up to date by the distro), or with a copy of the rendered file for releases older than
//! September 2023 that lack the base template.
//!
//! Each handler is one block appended to the template between
//! `# shim-agent: handler <h> (begin)` and `… (end)` lines: plain TOML tables with no template
//! action, so they render as they are. Appended tables are valid TOML wherever they stand,
//! since the base never defines our handler: a handler the rendered file already defines (a
//! runtime k3s found on its own, or one of the node owner's) is a conflict, never duplicated.
//! Removing the block gives back the template's bytes; a template the agent created is
//! deleted with its last block.
//!
//! # Drop-ins first
//! Since k3s-io/k3s#13680 (rke2 builds on k3s's agent) the base template imports a drop-in
//! directory beside the rendered file: `imports = [".../config-v3.toml.d/*.toml"]` for
//! config version 3, `.../config.toml.d/*.toml` for version 2. Where the rendered file has
//! config version ≥ 3 and such an import, a new handler goes there as a drop-in
//! `shim-agent-<h>.toml` carrying the rendered file's version, as for containerd ≥ 2.2's
//! `conf.d` (`plan_add_generated`): nothing to go stale when the distro upgrades, and the
//! rendered file is still never edited. Version 2 keeps the template, as the engine never
//! writes drop-ins for a file containerd 1.x may read. A handler that already has a block
//! in the template (written before the distro imported the directory) stays there until it
//! is removed. A drop-in written into a directory the agent created starts with
//! [`DIR_MARK`]; deleting the last such drop-in removes the directory when it is empty.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item, Table};

use super::doc::Doc;
use super::edit;
use super::error::ConfigError;
use super::plan::{self, ConfigFile, ConfigSet, FileChange, Plan};
use super::register;
use super::schema;
pub use super::schema::Version;
use super::spec::{self, RuntimeSpec};

/// First line of a template the agent created.
pub const CREATED_MARK: &str =
    "# shim-agent: created this template; it is deleted with the last handler below";
/// The base template, as k3s and rke2 name it.
pub const BASE_LINE: &str = "{{ template \"base\" . }}";

/// First line of a drop-in the agent wrote into a drop-in directory it created.
pub const DIR_MARK: &str =
    "# shim-agent: created this directory; it is removed with the last drop-in holding this line";

/// Drop-in directories a k3s or rke2 base template imports, beside the rendered file
/// (k3s-io/k3s#13680): config version 3, then 2.
pub const DROPIN_DIRS: [&str; 2] = ["config-v3.toml.d", "config.toml.d"];

/// The drop-in directory the rendered file imports, and the drop-ins containerd reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropins {
    /// `config-v3.toml.d` or `config.toml.d` beside the rendered file (host path).
    pub dir: PathBuf,
    /// Whether the directory exists.
    pub dir_exists: bool,
    /// Every file the rendered file imports (globs expanded), in the order containerd
    /// reads them.
    pub files: Vec<ConfigFile>,
}

/// The rendered config and the template it comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSet {
    /// The rendered `config.toml` (read only).
    pub rendered: ConfigFile,
    /// The template's path, and its bytes when it exists.
    pub template: (PathBuf, Option<Vec<u8>>),
    /// Start a new template from the base template (else from a copy of the rendered file).
    pub base: bool,
    /// Who renders it (`k3s`, `rke2`), for messages.
    pub by: String,
    /// The drop-in directory new handlers go to, when the rendered file (config version ≥ 3)
    /// imports one beside it; `None`: the template.
    pub dropins: Option<Dropins>,
}

/// The template to write beside `rendered`, given which templates exist: the distro reads
/// `config-v3.toml.tmpl` first when its containerd reads version 3, then `config.toml.tmpl`.
pub fn template_path(rendered: &Path, version: Version, exists: impl Fn(&Path) -> bool) -> PathBuf {
    let dir = rendered.parent().unwrap_or(Path::new("/"));
    let v3 = dir.join("config-v3.toml.tmpl");
    let v2 = dir.join("config.toml.tmpl");
    if version.0 >= 3 && (exists(&v3) || !exists(&v2)) {
        v3
    } else {
        v2
    }
}

/// The drop-in directory beside `rendered` that it imports with a glob covering the agent's
/// drop-ins (one of [`DROPIN_DIRS`]), when its config version is 3 or later; `None` sends
/// handlers to the template. The import is read as containerd reads it: a relative path is
/// relative to the rendered file's directory, any quoting.
pub fn imported_dropin_dir(rendered: &ConfigFile) -> Result<Option<PathBuf>, ConfigError> {
    if rendered_version(rendered)?.0 < 3 {
        return Ok(None);
    }
    let doc = Doc::parse(&rendered.host_path, &rendered.bytes)?;
    let base = rendered.host_path.parent().unwrap_or(Path::new("/"));
    let sample = plan::dropin_file_name("handler");
    Ok(schema::string_array(doc.doc.as_table().get("imports"))
        .iter()
        .filter_map(|i| plan::glob_dir(base, i, &sample))
        .find(|dir| DROPIN_DIRS.iter().any(|d| *dir == base.join(d))))
}

/// The rendered file's config version.
pub fn rendered_version(rendered: &ConfigFile) -> Result<Version, ConfigError> {
    let doc = Doc::parse(&rendered.host_path, &rendered.bytes)?;
    schema::detect_version(&doc.doc, &rendered.host_path)
}

fn begin_line(h: &str) -> String {
    format!("# shim-agent: handler {h} (begin)")
}

fn end_line(h: &str) -> String {
    format!("# shim-agent: handler {h} (end)")
}

/// The begin line of a block appended to a template that did not end with a newline: the
/// block then starts with one, which goes with it.
fn begin_line_after_newline(h: &str) -> String {
    format!("# shim-agent: handler {h} (begin; newline added before)")
}

/// Byte range of the block of `handler` in `text`, from its begin line (or the newline added
/// before it) through the newline of its end line.
fn block_range(text: &str, handler: &str) -> Option<(usize, usize)> {
    let begin = begin_line(handler);
    let begin_nl = begin_line_after_newline(handler);
    let end = end_line(handler);
    let mut offset = 0usize;
    let mut start = None;
    for line in text.split_inclusive('\n') {
        let l = line.trim_end_matches(['\n', '\r']);
        if start.is_none() && l == begin {
            start = Some(offset);
        } else if start.is_none() && l == begin_nl {
            start = Some(offset.saturating_sub(1));
        } else if let Some(s) = start
            && l == end
        {
            return Some((s, offset + line.len()));
        }
        offset += line.len();
    }
    None
}

/// Handlers that have a block in the template.
fn block_handlers(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| {
            l.trim_end()
                .strip_prefix("# shim-agent: handler ")
                .and_then(|r| {
                    r.strip_suffix(" (begin)")
                        .or_else(|| r.strip_suffix(" (begin; newline added before)"))
                })
                .map(str::to_string)
        })
        .collect()
}

/// The block of `spec` for config version `version`.
fn render_block(spec: &RuntimeSpec, version: Version) -> Result<String, ConfigError> {
    let mut doc = DocumentMut::new();
    let mut cur: &mut Table = doc.as_table_mut();
    for seg in schema::runtimes_path(version) {
        let mut t = Table::new();
        t.set_implicit(true);
        cur = cur
            .entry(seg)
            .or_insert(Item::Table(t))
            .as_table_mut()
            .ok_or_else(|| ConfigError::InvalidRuntimeSpec {
                handler: spec.handler.clone(),
                detail: format!("cannot build the table path {seg}"),
            })?;
    }
    cur.insert(&spec.handler, Item::Table(spec.to_table()));
    let tables = doc.to_string();
    if tables.contains("{{") || tables.contains("}}") {
        return Err(ConfigError::InvalidRuntimeSpec {
            handler: spec.handler.clone(),
            detail: "a value holds `{{` or `}}`, which the distro's Go template would read as \
                     an action"
                .into(),
        });
    }
    Ok(format!(
        "{}\n{}{}\n",
        begin_line(&spec.handler),
        tables,
        end_line(&spec.handler)
    ))
}

impl TemplateSet {
    fn text(&self) -> Result<String, ConfigError> {
        let bytes = self.template.1.clone().unwrap_or_default();
        String::from_utf8(bytes).map_err(|e| ConfigError::ParseError {
            path: self.template.0.clone(),
            line: 0,
            column: 0,
            message: format!("not UTF-8: {e}"),
        })
    }

    /// Handlers containerd serves once the distro renders the template: those of the
    /// rendered file and those with a block in the template.
    pub fn handlers(&self) -> Result<BTreeSet<String>, ConfigError> {
        let version = rendered_version(&self.rendered)?;
        let doc = Doc::parse(&self.rendered.host_path, &self.rendered.bytes)?;
        let mut out: BTreeSet<String> =
            edit::handler_names(&doc.doc, version).into_iter().collect();
        out.extend(block_handlers(&self.text()?));
        if let Some(d) = &self.dropins {
            out.extend(plan::generated_handler_names(&self.config_set(d))?);
        }
        Ok(out)
    }

    /// The rendered file (never edited) and its drop-ins, as the config engine reads them.
    fn config_set(&self, d: &Dropins) -> ConfigSet {
        ConfigSet {
            main: self.rendered.clone(),
            dropins: d.files.clone(),
        }
    }

    /// True when the agent created the drop-in directory: it does not exist yet, or one of
    /// the agent's drop-ins in it says so.
    fn agent_made_dir(d: &Dropins) -> bool {
        !d.dir_exists
            || d.files.iter().any(|f| {
                f.host_path.parent() == Some(d.dir.as_path())
                    && f.bytes.starts_with(DIR_MARK.as_bytes())
            })
    }

    /// Plan registering `spec` as a drop-in in `d.dir`.
    fn plan_add_dropin(
        &self,
        d: &Dropins,
        spec: &RuntimeSpec,
        replace: bool,
    ) -> Result<Plan, ConfigError> {
        let mut plan =
            register::plan_add_generated(&self.config_set(d), spec, replace, &d.dir, &self.by)?;
        if Self::agent_made_dir(d) {
            for c in &mut plan.changes {
                if let (None, Some(after)) = (&c.before, &mut c.after)
                    && c.host_path.parent() == Some(d.dir.as_path())
                {
                    let mut marked = format!("{DIR_MARK}\n").into_bytes();
                    marked.append(after);
                    *after = marked;
                }
            }
        }
        Ok(plan)
    }

    /// Plan removing the agent's drop-in of `handler` from `d.dir`; the directory goes too
    /// when the agent created it and nothing else is left in it.
    fn plan_remove_dropin(&self, d: &Dropins, handler: &str) -> Result<Plan, ConfigError> {
        let mut plan = register::plan_remove_generated(&self.config_set(d), handler, &self.by)?;
        let dir_goes = plan.changes.iter().any(|c| {
            c.after.is_none()
                && c.host_path.parent() == Some(d.dir.as_path())
                && c.before
                    .as_deref()
                    .is_some_and(|b| b.starts_with(DIR_MARK.as_bytes()))
        });
        if dir_goes {
            plan.remove_empty_dirs.push(d.dir.clone());
        }
        Ok(plan)
    }

    /// What a new template starts with.
    fn created(&self) -> Vec<u8> {
        let mut out = format!("{CREATED_MARK}\n").into_bytes();
        if self.base {
            out.extend_from_slice(format!("{BASE_LINE}\n").as_bytes());
        } else {
            out.extend_from_slice(&self.rendered.bytes);
            if !out.ends_with(b"\n") {
                out.push(b'\n');
            }
        }
        out
    }

    /// Plan registering `spec`: where the template has its block, there (replacing the agent's
    /// own block when `replace`); else as a drop-in when the rendered file imports a drop-in
    /// directory, else in the template. A handler the rendered file defines is a conflict.
    pub fn plan_add(&self, spec: &RuntimeSpec, replace: bool) -> Result<Plan, ConfigError> {
        spec.validate()?;
        let version = rendered_version(&self.rendered)?;
        let text = self.text()?;
        let (path, before) = (&self.template.0, &self.template.1);
        let (begin, begin_nl) = (
            begin_line(&spec.handler),
            begin_line_after_newline(&spec.handler),
        );
        let after = match block_range(&text, &spec.handler) {
            Some((s, e)) => {
                let block = render_block(spec, version)?;
                let (head, existing, tail) = cut(&text, s, e);
                let nl = existing.starts_with('\n');
                if existing
                    .trim_start_matches('\n')
                    .replacen(&begin_nl, &begin, 1)
                    == block
                {
                    return Ok(Plan::default());
                }
                if !replace {
                    return Err(ConfigError::HandlerConflict {
                        path: path.clone(),
                        handler: spec.handler.clone(),
                        fields: block_fields(existing, spec, version),
                    });
                }
                let new = if nl {
                    format!("\n{}", block.replacen(&begin, &begin_nl, 1))
                } else {
                    block.clone()
                };
                format!("{head}{new}{tail}")
            }
            None => {
                let doc = Doc::parse(&self.rendered.host_path, &self.rendered.bytes)?;
                if let Some(item) = edit::handler_item(&doc.doc, version, &spec.handler) {
                    let fields = spec::differing_fields(&spec::item_to_json(item), &spec.to_json());
                    return Err(ConfigError::HandlerConflict {
                        path: self.rendered.host_path.clone(),
                        handler: spec.handler.clone(),
                        fields: if fields.is_empty() {
                            vec![format!(
                                "(defined by {} or its template, not by shim-agent)",
                                self.by
                            )]
                        } else {
                            fields
                        },
                    });
                }
                if let Some(d) = &self.dropins {
                    return self.plan_add_dropin(d, spec, replace);
                }
                let block = render_block(spec, version)?;
                let mut t = match before {
                    Some(_) => text.clone(),
                    None => String::from_utf8_lossy(&self.created()).into_owned(),
                };
                if !t.is_empty() && !t.ends_with('\n') {
                    t.push('\n');
                    t.push_str(&block.replacen(&begin, &begin_nl, 1));
                } else {
                    t.push_str(&block);
                }
                t
            }
        };
        self.check_renders(&after, spec, version)?;
        Ok(Plan::of(vec![FileChange {
            host_path: path.clone(),
            before: before.clone(),
            after: Some(after.into_bytes()),
        }]))
    }

    /// The rendered file once the distro renders `template`: the blocks are the only part
    /// that changes, so it is the rendered file without the old blocks plus the new ones. It
    /// must parse and hold the handler exactly as wanted.
    fn check_renders(
        &self,
        template: &str,
        spec: &RuntimeSpec,
        version: Version,
    ) -> Result<(), ConfigError> {
        let mut rendered = String::from_utf8_lossy(&self.rendered.bytes).into_owned();
        for h in block_handlers(&self.text()?) {
            if let Some((s, e)) = block_range(&rendered, &h) {
                let (head, _, tail) = cut(&rendered, s, e);
                rendered = format!("{head}{tail}");
            }
        }
        if !rendered.is_empty() && !rendered.ends_with('\n') {
            rendered.push('\n');
        }
        for h in block_handlers(template) {
            if let Some((s, e)) = block_range(template, &h) {
                rendered.push_str(cut(template, s, e).1);
            }
        }
        let doc = Doc::parse(&self.template.0, rendered.as_bytes())?;
        let got = edit::handler_item(&doc.doc, version, &spec.handler).map(spec::item_to_json);
        if got
            .as_ref()
            .is_none_or(|g| !spec::differing_fields(g, &spec.to_json()).is_empty())
        {
            return Err(ConfigError::UnsupportedLayout {
                path: self.template.0.clone(),
                detail: format!(
                    "the rendered config would not hold handler `{}` as wanted",
                    spec.handler
                ),
            });
        }
        Ok(())
    }

    /// Plan removing the agent's block (or drop-in) of `handler`.
    pub fn plan_remove(&self, handler: &str) -> Result<Plan, ConfigError> {
        let text = self.text()?;
        let Some((s, e)) = block_range(&text, handler) else {
            if let Some(d) = &self.dropins {
                return self.plan_remove_dropin(d, handler);
            }
            let version = rendered_version(&self.rendered)?;
            let doc = Doc::parse(&self.rendered.host_path, &self.rendered.bytes)?;
            if edit::handler_item(&doc.doc, version, handler).is_some() {
                return Err(ConfigError::NotOwned {
                    path: self.rendered.host_path.clone(),
                    handler: handler.to_string(),
                });
            }
            return Ok(Plan::default());
        };
        let rest = without_block(&text, s, e);
        let created = text.starts_with(CREATED_MARK) && block_handlers(&rest).is_empty();
        let base_only = rest == format!("{CREATED_MARK}\n{BASE_LINE}\n");
        let after = if created && (base_only || !rest.contains(BASE_LINE)) {
            None
        } else {
            Some(rest.into_bytes())
        };
        Ok(Plan::of(vec![FileChange {
            host_path: self.template.0.clone(),
            before: self.template.1.clone(),
            after,
        }]))
    }

    /// Reflect a plan's results in this view.
    pub fn update(&mut self, plan: &Plan) {
        for c in &plan.changes {
            if c.host_path == self.template.0 {
                self.template.1 = c.after.clone();
            } else if let Some(d) = &mut self.dropins {
                d.files.retain(|f| f.host_path != c.host_path);
                if let Some(after) = &c.after {
                    d.files.push(ConfigFile {
                        host_path: c.host_path.clone(),
                        bytes: after.clone(),
                    });
                    d.dir_exists |= c.host_path.parent() == Some(d.dir.as_path());
                }
            }
        }
        if let Some(d) = &mut self.dropins
            && plan.remove_empty_dirs.contains(&d.dir)
            && !d
                .files
                .iter()
                .any(|f| f.host_path.parent() == Some(d.dir.as_path()))
        {
            d.dir_exists = false;
        }
    }
}

/// `text` without the block at `s..e`. A block that starts with the newline it added before
/// itself takes that newline along only when nothing follows it; otherwise the newline stays,
/// and the next block (if it is the agent's) now owns it.
fn without_block(text: &str, s: usize, e: usize) -> String {
    let (head, block, tail) = cut(text, s, e);
    if !block.starts_with('\n') || tail.is_empty() {
        return format!("{head}{tail}");
    }
    let first = tail.lines().next().unwrap_or_default();
    let tail = match first
        .strip_prefix("# shim-agent: handler ")
        .and_then(|r| r.strip_suffix(" (begin)"))
    {
        Some(h) => tail.replacen(&begin_line(h), &begin_line_after_newline(h), 1),
        None => tail.to_string(),
    };
    // the block's leading newline stays
    format!("{head}\n{tail}")
}

/// `text` cut at the byte offsets `s..e` (found by searching `text`, so on character
/// boundaries; an offset that is not yields empty parts rather than a panic).
fn cut(text: &str, s: usize, e: usize) -> (&str, &str, &str) {
    (
        text.get(..s).unwrap_or_default(),
        text.get(s..e).unwrap_or_default(),
        text.get(e..).unwrap_or_default(),
    )
}

/// Which fields of the agent's block differ from `spec` (for a conflict message).
fn block_fields(block: &str, spec: &RuntimeSpec, version: Version) -> Vec<String> {
    let doc = match block.parse::<DocumentMut>() {
        Ok(d) => d,
        Err(_) => return vec!["(the block does not parse)".into()],
    };
    match edit::handler_item(&doc, version, &spec.handler) {
        Some(item) => spec::differing_fields(&spec::item_to_json(item), &spec.to_json()),
        None => vec!["(the block holds no such handler)".into()],
    }
}
