//! The forms a table on the path to `runtimes` may take, which form a new handler is written
//! in, and where the agent's marker comment stands in each form.
//!
//! Each of `plugins`, the plugin ID, `containerd` and `runtimes` may be a `[header]` table, a
//! dotted key in the body of a table (`containerd.runtimes.runc.runtime_type = ...`) or an
//! inline table (`containerd = { runtimes = { ... } }`). A new handler is written in the form of
//! the deepest of them that exists ([`Style`]): TOML forbids extending an inline table from
//! outside it, and a dotted group gets its new keys next to the existing ones.
//!
//! Markers (who added a handler) per form:
//! - header table: a comment line in its header decor (`edit.rs`);
//! - dotted keys: a comment line before the handler's first line;
//! - `<h> = { ... }` line of a table: a comment line before that line;
//! - entry inside an inline table (a TOML 1.0 inline table is one line, no comment fits in
//!   it): one comment line per handler (and per kept default runtime) before the line of the
//!   outermost inline table, e.g. `# shim-agent: handler spin` above
//!   `containerd = { runtimes = { runc = {...}, spin = {...} } }` ([`shared_mark`](super::marks::shared_mark)).
//!
//! Dotted and `<h> = { ... }` forms are edited here; entries inside inline tables in
//! [`super::inline`].

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table, TableLike, Value};

use super::error::ConfigError;
use super::inline;
use super::marks::{
    Entry, HANDLER_MARK, Mark, add_marker_line, first_mark, prefix_str, shared_mark,
};
use super::schema::{self, Version};

/// How a new handler is written, decided by the deepest table of the path that exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `[...runtimes.<h>]` header tables; missing parents are created implicit.
    Header,
    /// Dotted keys (`containerd.runtimes.<h>.runtime_type = ...`) next to the existing ones;
    /// missing parents are created as dotted tables.
    Dotted,
    /// A `<h> = { ... }` line in the runtimes table, whose handlers are all written so.
    Line,
    /// An entry of an inline table; `line` is the index in the path of the outermost inline
    /// table, whose line carries the markers.
    Inline { line: usize },
}

/// The style a new handler gets. Refuses a path segment that is not a table (containerd
/// would not read the file either).
pub fn style(doc: &DocumentMut, version: Version, file: &Path) -> Result<Style, ConfigError> {
    let path = schema::runtimes_path(version);
    let mut cur: &dyn TableLike = doc.as_table();
    let mut deepest: Option<&Table> = None;
    let mut depth = 0;
    let mut inline = None;
    for (i, seg) in path.iter().enumerate() {
        let Some(item) = cur.get(seg) else { break };
        cur = match item {
            Item::Table(t) => {
                deepest = Some(t);
                t
            }
            Item::Value(Value::InlineTable(t)) => {
                inline.get_or_insert(i);
                t
            }
            other => return Err(not_a_table(file, &path[..=i], &path, other)),
        };
        depth = i + 1;
    }
    if let Some(line) = inline {
        return Ok(Style::Inline { line });
    }
    let Some(t) = deepest else {
        return Ok(Style::Header);
    };
    if depth == path.len() && !t.is_empty() {
        let items = || t.iter().map(|(_, it)| it);
        if items().all(|it| matches!(it, Item::Value(Value::InlineTable(_)))) {
            return Ok(Style::Line);
        }
        if items().all(|it| matches!(it, Item::Table(h) if h.is_dotted())) {
            return Ok(Style::Dotted);
        }
    }
    Ok(if t.is_dotted() {
        Style::Dotted
    } else {
        Style::Header
    })
}

/// A key path as TOML writes it: `plugins."io.containerd.grpc.v1.cri".containerd`.
pub fn display_keys(keys: &[&str]) -> String {
    let bare = |k: &str| {
        !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    keys.iter()
        .map(|k| {
            if bare(k) {
                k.to_string()
            } else {
                format!("\"{k}\"")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

fn not_a_table(file: &Path, keys: &[&str], path: &[&str], item: &Item) -> ConfigError {
    let what = match item {
        Item::ArrayOfTables(_) => "an array of tables (`[[...]]`)".to_string(),
        Item::Value(v) => {
            let t = v.type_name();
            let article = if t.starts_with(['a', 'e', 'i', 'o', 'u']) {
                "an"
            } else {
                "a"
            };
            format!("{article} {t}")
        }
        _ => "not a value".to_string(),
    };
    ConfigError::UnsupportedLayout {
        path: file.to_path_buf(),
        detail: format!(
            "`{}` is {what}, not a table: containerd reads runtime handlers only from tables \
             along the path {}, so it would not read this file either; write `{}` as a table \
             (a [header], dotted keys or an inline table) first",
            display_keys(keys),
            display_keys(path),
            display_keys(keys),
        ),
    }
}

/// The whitespace that starts the line a prefix decorates.
fn indent_of(prefix: &str) -> &str {
    let tail = prefix.rsplit('\n').next().unwrap_or("");
    if tail.bytes().all(|b| b == b' ' || b == b'\t') {
        tail
    } else {
        ""
    }
}

/// Prefix of the first line a dotted table renders (its first value's key).
fn first_line_prefix(t: &Table) -> &str {
    t.get_values()
        .first()
        .and_then(|(keys, _)| keys.last())
        .map_or("", |k| prefix_str(k.leaf_decor()))
}

/// Who added handler `name`, whatever its form (see the module docs).
pub fn handler_mark(doc: &DocumentMut, version: Version, name: &str) -> Mark {
    let rt = schema::runtimes_path(version);
    let path = [rt[0], rt[1], rt[2], rt[3], name];
    let mut cur = doc.as_table();
    for (i, seg) in path.iter().enumerate() {
        let last = i + 1 == path.len();
        match cur.get(seg) {
            Some(Item::Table(t)) if !last => cur = t,
            Some(Item::Table(t)) if t.is_dotted() => return first_mark(first_line_prefix(t)),
            Some(Item::Table(t)) => return first_mark(prefix_str(t.decor())),
            Some(Item::Value(Value::InlineTable(_))) => {
                let prefix = cur.key(seg).map_or("", |k| prefix_str(k.leaf_decor()));
                return if last {
                    first_mark(prefix)
                } else {
                    shared_mark(prefix, name)
                };
            }
            _ => return Mark::None,
        }
    }
    Mark::None
}

/// The tables along `keys` for writing; missing ones are created as dotted tables.
fn tables_mut<'a>(root: &'a mut Table, keys: &[&str]) -> Option<&'a mut Table> {
    let mut cur = root;
    for seg in keys {
        if !cur.contains_key(seg) {
            let mut t = Table::new();
            t.set_dotted(true);
            t.set_implicit(true);
            cur.insert(seg, Item::Table(t));
        }
        cur = cur.get_mut(seg)?.as_table_mut()?;
    }
    Some(cur)
}

/// The indentation of the lines of the deepest table along `keys` that has any.
fn indent_along(root: &Table, keys: &[&str]) -> String {
    let mut tables = vec![root];
    for seg in keys {
        match tables
            .last()
            .and_then(|t| t.get(seg))
            .and_then(Item::as_table)
        {
            Some(t) => tables.push(t),
            None => break,
        }
    }
    tables
        .iter()
        .rev()
        .find_map(|t| {
            let values = t.get_values();
            let (keys, _) = values.last()?;
            Some(indent_of(prefix_str(keys.last()?.leaf_decor())).to_string())
        })
        .unwrap_or_default()
}

/// `t` as dotted keys: every line indented by `indent`, the first one decorated by `first`.
fn dotted(mut t: Table, indent: &str, first: String) -> Table {
    fn walk(t: &mut Table, indent: &str, first: &mut Option<String>) {
        t.set_dotted(true);
        t.set_implicit(true);
        let keys: Vec<String> = t.iter().map(|(k, _)| k.to_string()).collect();
        for k in keys {
            if let Some(Item::Table(c)) = t.get_mut(&k) {
                walk(c, indent, first);
            } else if let Some(mut key) = t.key_mut(&k) {
                let prefix = first.take().unwrap_or_else(|| indent.to_string());
                key.leaf_decor_mut().set_prefix(prefix);
            }
        }
    }
    walk(&mut t, indent, &mut Some(first));
    t
}

fn inline_item(t: Table) -> Item {
    Item::Value(Value::InlineTable(t.into_inline_table()))
}

/// Add `entries` (a kept default runtime first, then the handler) in a style other than
/// [`Style::Header`].
pub fn insert(
    doc: &mut DocumentMut,
    version: Version,
    style: Style,
    entries: Vec<Entry<'_>>,
) -> Option<()> {
    let path = schema::runtimes_path(version);
    if let Style::Inline { line } = style {
        return inline::insert(doc.as_table_mut(), &path, line, entries);
    }
    let indent = indent_along(doc.as_table(), &path);
    let runtimes = tables_mut(doc.as_table_mut(), &path)?;
    for (name, table, marker) in entries {
        let first = format!("{indent}{marker}\n{indent}");
        if style == Style::Line {
            runtimes.insert(name, inline_item(table));
            runtimes.key_mut(name)?.leaf_decor_mut().set_prefix(first);
        } else {
            runtimes.insert(name, Item::Table(dotted(table, &indent, first)));
        }
    }
    Some(())
}

/// Rewrite handler `name`, which is not a header table, where it stands and in its form,
/// marking it as the agent's (`--replace`).
pub fn replace(doc: &mut DocumentMut, version: Version, name: &str, table: Table) -> Option<()> {
    let path = schema::runtimes_path(version);
    let marker = format!("{HANDLER_MARK}{name}");
    let root = doc.as_table_mut();
    if let Some(line) = inline::first_inline(root, &path) {
        return inline::replace(root, &path, line, name, table, &marker);
    }
    let runtimes = tables_mut(root, &path)?;
    match runtimes.get_mut(name)? {
        Item::Value(old) => {
            let mut new = Value::InlineTable(table.into_inline_table());
            *new.decor_mut() = old.decor().clone();
            *old = new;
            let mut key = runtimes.key_mut(name)?;
            let prefix = prefix_str(key.leaf_decor()).to_string();
            if first_mark(&prefix) != Mark::Handler(name.to_string()) {
                key.leaf_decor_mut()
                    .set_prefix(add_marker_line(&prefix, &marker));
            }
        }
        Item::Table(old) => {
            let prefix = first_line_prefix(old).to_string();
            let first = if first_mark(&prefix) == Mark::Handler(name.to_string()) {
                prefix.clone()
            } else {
                add_marker_line(&prefix, &marker)
            };
            *old = dotted(table, indent_of(&prefix), first);
        }
        _ => return None,
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_read_where_each_form_keeps_it() {
        let v2 = Version(2);
        let doc = |s: &str| -> DocumentMut { s.parse().unwrap() };
        let h = |n: &str| Mark::Handler(n.into());
        let header = doc(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.spin]\n\
                          runtime_type = \"x\"\n",
        );
        assert_eq!(handler_mark(&header, v2, "spin"), Mark::None);
        let dotted = doc("[plugins.\"io.containerd.grpc.v1.cri\"]\n\
                          containerd.runtimes.runc.runtime_type = \"r\"\n\
                          # shim-agent: handler spin\n\
                          containerd.runtimes.spin.runtime_type = \"x\"\n");
        assert_eq!(handler_mark(&dotted, v2, "spin"), h("spin"));
        assert_eq!(handler_mark(&dotted, v2, "runc"), Mark::None);
        let line = doc(
            "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]\n\
                        runc = { runtime_type = \"r\" }\n\
                        # shim-agent: handler spin\n\
                        spin = { runtime_type = \"x\" }\n",
        );
        assert_eq!(handler_mark(&line, v2, "spin"), h("spin"));
        assert_eq!(handler_mark(&line, v2, "runc"), Mark::None);
        let inline = doc("[plugins.\"io.containerd.grpc.v1.cri\"]\n\
                          # shim-agent: default runtime kept for handler spin\n\
                          # shim-agent: handler spin\n\
                          containerd = { runtimes = { runc = { runtime_type = \"r\" }, \
                          spin = { runtime_type = \"x\" }, kata = { runtime_type = \"k\" } } }\n");
        assert_eq!(handler_mark(&inline, v2, "spin"), h("spin"));
        assert_eq!(handler_mark(&inline, v2, "runc"), Mark::Kept("spin".into()));
        assert_eq!(handler_mark(&inline, v2, "kata"), Mark::None);
        assert_eq!(
            style(&inline, v2, Path::new("/c")).ok(),
            Some(Style::Inline { line: 2 })
        );
        assert_eq!(style(&line, v2, Path::new("/c")).ok(), Some(Style::Line));
        assert_eq!(
            style(&dotted, v2, Path::new("/c")).ok(),
            Some(Style::Dotted)
        );
        assert_eq!(
            style(&header, v2, Path::new("/c")).ok(),
            Some(Style::Header)
        );
    }

    #[test]
    fn key_paths_are_quoted_where_toml_needs_it() {
        assert_eq!(
            display_keys(&["plugins", "io.containerd.grpc.v1.cri", "containerd"]),
            "plugins.\"io.containerd.grpc.v1.cri\".containerd"
        );
    }
}
