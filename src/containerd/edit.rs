//! Edits of the runtimes table of one document: find, insert, replace and remove handlers,
//! and the `imports` array.
//!
//! A handler is added in the form the file uses along the path to `runtimes` (see
//! [`super::forms`]). In the header form (the default, and for a file with no runtimes yet)
//! new tables are plain `[header]` tables placed right after the existing runtime handlers (or
//! the CRI plugin's tables), parents that do not exist are created *implicit* (no header is
//! written for them, and none is ever added for an existing table), and every table the agent
//! adds carries a marker comment in its header decor: `# shim-agent: handler <h>` or
//! `# shim-agent: default runtime kept for handler <h>`. Dotted keys and inline tables carry
//! the same marker lines before their own lines ([`super::forms`], [`super::inline`]).

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table};

use super::error::ConfigError;
use super::forms::{self, Style};
use super::inline;
use super::marks::{self, HANDLER_MARK, IMPORT_MARK, KEPT_MARK, Mark};
use super::schema::{self, Version};

/// Who added handler `name` of a document, whatever its form.
pub fn handler_mark(doc: &DocumentMut, version: Version, name: &str) -> Mark {
    forms::handler_mark(doc, version, name)
}

/// The `runtimes` table item of a document, if any.
pub fn runtimes_item(doc: &DocumentMut, version: Version) -> Option<&Item> {
    schema::get_path(doc.as_table(), &schema::runtimes_path(version))
}

/// A handler's item (any form: header, dotted, inline).
pub fn handler_item<'a>(doc: &'a DocumentMut, version: Version, handler: &str) -> Option<&'a Item> {
    runtimes_item(doc, version)?.as_table_like()?.get(handler)
}

/// Handler names in the runtimes table.
pub fn handler_names(doc: &DocumentMut, version: Version) -> Vec<String> {
    runtimes_item(doc, version)
        .and_then(Item::as_table_like)
        .map(|t| t.iter().map(|(k, _)| k.to_string()).collect())
        .unwrap_or_default()
}

/// The position new tables get: right after the last table of the runtimes subtree, else of
/// the `containerd` table, else of the CRI plugin, else at the end of the document.
fn anchor_position(doc: &DocumentMut, version: Version) -> isize {
    let path = schema::runtimes_path(version);
    for depth in (2..=4).rev() {
        if let Some(p) = schema::get_path(doc.as_table(), &path[..depth])
            .and_then(Item::as_table)
            .and_then(max_position)
        {
            return p;
        }
    }
    max_position(doc.as_table()).map_or(0, |p| p + 1)
}

fn max_position(t: &Table) -> Option<isize> {
    let children = t.iter().filter_map(|(_, it)| match it {
        Item::Table(c) => max_position(c),
        Item::ArrayOfTables(a) => a.iter().filter_map(max_position).max(),
        _ => None,
    });
    t.position().into_iter().chain(children).max()
}

/// The runtimes table for writing in the header form, creating missing parents as implicit
/// tables ([`forms::style`] has checked that every existing segment is a table).
fn runtimes_table_mut<'a>(
    doc: &'a mut DocumentMut,
    version: Version,
    path: &Path,
) -> Result<&'a mut Table, ConfigError> {
    let mut cur = doc.as_table_mut();
    for seg in schema::runtimes_path(version) {
        if !cur.contains_key(seg) {
            let mut t = Table::new();
            t.set_implicit(true);
            cur.insert(seg, Item::Table(t));
        }
        cur = match cur.get_mut(seg) {
            Some(Item::Table(t)) => t,
            _ => return Err(unexpected_layout(path)),
        };
    }
    Ok(cur)
}

fn unexpected_layout(path: &Path) -> ConfigError {
    ConfigError::UnsupportedLayout {
        path: path.to_path_buf(),
        detail: "the runtimes table could not be edited in the form it is written in \
                 (unexpected layout); nothing was written, please report this file"
            .into(),
    }
}

/// A header table ready to insert, with its marker and position (options sub-table too).
fn marked_table(mut t: Table, marker: &str, pos: isize) -> Table {
    t.decor_mut().set_prefix(format!("\n{marker}\n"));
    t.set_position(Some(pos));
    for (_, child) in t.iter_mut() {
        if let Item::Table(c) = child {
            c.set_position(Some(pos));
        }
    }
    t
}

/// Add (or replace in place) handler `name` with `table`, plus an explicit default runtime
/// `(name, table)` when `kept` is given, in the form the file uses ([`forms::style`]).
pub fn insert_handler(
    doc: &mut DocumentMut,
    version: Version,
    path: &Path,
    name: &str,
    table: Table,
    kept: Option<(&str, Table)>,
) -> Result<(), ConfigError> {
    let style = forms::style(doc, version, path)?;
    let marker = format!("{HANDLER_MARK}{name}");
    let existing = handler_item(doc, version, name);
    let header_handler = matches!(existing, Some(Item::Table(t)) if !t.is_dotted());
    if existing.is_some() && !header_handler {
        return forms::replace(doc, version, name, table).ok_or_else(|| unexpected_layout(path));
    }
    if style != Style::Header && !header_handler {
        let mut entries = Vec::new();
        if let Some((kept_name, kept_table)) = kept {
            entries.push((kept_name, kept_table, format!("{KEPT_MARK}{name}")));
        }
        entries.push((name, table, marker));
        return forms::insert(doc, version, style, entries).ok_or_else(|| unexpected_layout(path));
    }
    let pos = anchor_position(doc, version);
    let runtimes = runtimes_table_mut(doc, version, path)?;
    if let Some((kept_name, kept_table)) = kept {
        let marker = format!("{KEPT_MARK}{name}");
        runtimes.insert(
            kept_name,
            Item::Table(marked_table(kept_table, &marker, pos)),
        );
    }
    match runtimes.get(name) {
        // Replace a header table where it stands, keeping its comments.
        Some(Item::Table(old)) => {
            let old_prefix = marks::prefix_str(old.decor()).to_string();
            let old_pos = old.position().unwrap_or(pos);
            let mut t = marked_table(table, &marker, old_pos);
            if !old_prefix.contains(&marker) {
                t.decor_mut()
                    .set_prefix(format!("{}{marker}\n", old_prefix.trim_end_matches(' ')));
            } else {
                t.decor_mut().set_prefix(old_prefix);
            }
            runtimes.insert(name, Item::Table(t));
        }
        _ => {
            runtimes.insert(name, Item::Table(marked_table(table, &marker, pos)));
        }
    }
    Ok(())
}

/// Remove handler `name` (which the caller checked is marked) and, when no other handler is
/// left, the default runtimes the agent kept; then prune the parents the agent created
/// (implicit or dotted tables left empty; dotted inline tables in [`inline::remove`]).
pub fn remove_handler(
    doc: &mut DocumentMut,
    version: Version,
    path: &Path,
    name: &str,
) -> Result<(), ConfigError> {
    let keys = schema::runtimes_path(version);
    if let Some(line) = inline::first_inline(doc.as_table(), &keys) {
        return inline::remove(doc.as_table_mut(), &keys, line, name)
            .ok_or_else(|| unexpected_layout(path));
    }
    let kept: Vec<String> = handler_names(doc, version)
        .into_iter()
        .filter(|n| n != name && matches!(handler_mark(doc, version, n), Mark::Kept(_)))
        .collect();
    {
        let Some(Item::Table(runtimes)) = get_path_mut(doc.as_table_mut(), &keys) else {
            return Err(unexpected_layout(path));
        };
        runtimes.remove(name);
        if runtimes.iter().all(|(k, _)| kept.iter().any(|n| n == k)) {
            runtimes.retain(|k, _| !kept.iter().any(|n| n == k));
        }
    }
    prune_implicit(doc.as_table_mut(), &keys);
    Ok(())
}

/// Remove empty implicit tables along `path`, deepest first.
fn prune_implicit(root: &mut Table, path: &[&str]) {
    for depth in (1..=path.len()).rev() {
        let (parent_path, last) = path[..depth].split_at(depth - 1);
        let parent = if parent_path.is_empty() {
            Some(&mut *root)
        } else {
            match get_path_mut(root, parent_path) {
                Some(Item::Table(t)) => Some(t),
                _ => None,
            }
        };
        let Some(parent) = parent else { continue };
        let empty_implicit = matches!(parent.get(last[0]),
            Some(Item::Table(t)) if t.is_implicit() && t.is_empty());
        if empty_implicit {
            parent.remove(last[0]);
        }
    }
}

fn get_path_mut<'a>(root: &'a mut Table, path: &[&str]) -> Option<&'a mut Item> {
    let (first, rest) = path.split_first()?;
    let item = root.get_mut(first)?;
    if rest.is_empty() {
        return Some(item);
    }
    match item {
        Item::Table(t) => get_path_mut(t, rest),
        _ => None,
    }
}

/// Append `import` to the root `imports` array (creating it, marked, when missing).
pub fn add_import(doc: &mut DocumentMut, import: &str, path: &Path) -> Result<(), ConfigError> {
    let root = doc.as_table_mut();
    match root.get_mut("imports") {
        None => {
            let a: toml_edit::Array = std::iter::once(import).collect();
            root.insert("imports", toml_edit::value(a));
            if let Some(mut k) = root.key_mut("imports") {
                k.leaf_decor_mut().set_prefix(format!("{IMPORT_MARK}\n"));
            }
            Ok(())
        }
        Some(item) => match item.as_array_mut() {
            Some(a) => {
                a.push(import);
                Ok(())
            }
            None => Err(ConfigError::UnsupportedLayout {
                path: path.to_path_buf(),
                detail: "`imports` is not an array of paths".into(),
            }),
        },
    }
}

/// Remove `import` from `imports`; drop the key when it is empty and the agent created it.
pub fn remove_import(doc: &mut DocumentMut, import: &str) -> bool {
    let root = doc.as_table_mut();
    let Some(a) = root.get_mut("imports").and_then(Item::as_array_mut) else {
        return false;
    };
    let before = a.len();
    a.retain(|v| v.as_str() != Some(import));
    let removed = a.len() != before;
    let ours = root
        .key("imports")
        .and_then(|k| k.leaf_decor().prefix())
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(IMPORT_MARK));
    if removed
        && ours
        && root
            .get("imports")
            .and_then(Item::as_array)
            .is_some_and(|a| a.is_empty())
    {
        root.remove("imports");
    }
    removed
}
