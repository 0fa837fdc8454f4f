//! Handlers inside an inline table on the path to `runtimes`, e.g.
//! `containerd = { default_runtime_name = "runc", runtimes = { runc = { ... } } }`.
//!
//! TOML forbids adding to an inline table from outside it, so the handler becomes one more
//! entry of the same inline table (one line: containerd reads TOML 1.0). A missing parent inside
//! the inline table is written as a dotted key (`runtimes.spin = { ... }`): an empty dotted
//! inline table does not exist in TOML, so it goes away with its last entry, while a table the
//! user wrote (`runtimes = {}`) stays. No comment fits inside a one-line inline table: the
//! markers are comment lines before the line of the outermost inline table, one per handler
//! and one for a kept default runtime ([`super::marks::shared_mark`]).
//!
//! Removal is byte-exact: the entry goes with its separator, the spacing before `}` (held by
//! the last entry) goes back to the entry that is last again, dotted inline tables left empty
//! are pruned, and the marker lines are dropped.

use toml_edit::{InlineTable, Item, Table, Value};

use super::marks::{
    Entry, HANDLER_MARK, KEPT_MARK, KEPT_RUNTIME, Mark, add_marker_line, drop_marker_lines,
    prefix_str, shared_mark,
};

/// Index in `path` of the first segment that is an inline table (every earlier one is a table).
pub fn first_inline(root: &Table, path: &[&str]) -> Option<usize> {
    let mut cur = root;
    for (i, seg) in path.iter().enumerate() {
        match cur.get(seg)? {
            Item::Table(t) => cur = t,
            Item::Value(Value::InlineTable(_)) => return Some(i),
            _ => return None,
        }
    }
    None
}

/// The existing tables along `keys`.
fn holder_mut<'a>(root: &'a mut Table, keys: &[&str]) -> Option<&'a mut Table> {
    keys.iter()
        .try_fold(root, |cur, seg| cur.get_mut(seg)?.as_table_mut())
}

/// The inline tables along `keys` under `t`; missing ones are created dotted when `create`.
fn inline_at_mut<'a>(
    t: &'a mut InlineTable,
    keys: &[&str],
    create: bool,
) -> Option<&'a mut InlineTable> {
    let mut cur = t;
    for k in keys {
        if create && !cur.contains_key(k) {
            let mut n = InlineTable::new();
            n.set_dotted(true);
            cur.insert(*k, Value::InlineTable(n));
        }
        cur = cur.get_mut(k)?.as_inline_table_mut()?;
    }
    Some(cur)
}

/// Index of the deepest inline table along `path` (from the outermost one, at `line`) that is
/// not dotted: its braces enclose every entry added or removed below it.
fn brace_owner(outer: &InlineTable, path: &[&str], line: usize) -> usize {
    let mut owner = line;
    let mut cur = outer;
    for (j, seg) in path.iter().enumerate().skip(line + 1) {
        match cur.get(seg).and_then(Value::as_inline_table) {
            Some(t) => {
                if !t.is_dotted() {
                    owner = j;
                }
                cur = t;
            }
            None => break,
        }
    }
    owner
}

/// Key path and decor suffix of the last value an inline table renders (dotted entries
/// flattened): the suffix is the spacing before its `}`.
fn last_value(t: &InlineTable) -> Option<(Vec<String>, String)> {
    let values = t.get_values();
    let (keys, v) = values.last()?;
    let suffix = v.decor().suffix().and_then(|s| s.as_str()).unwrap_or("");
    Some((
        keys.iter().map(|k| k.get().to_string()).collect(),
        suffix.to_string(),
    ))
}

fn set_suffix(t: &mut InlineTable, keys: &[String], suffix: &str) {
    let mut cur = t;
    let Some((last, parents)) = keys.split_last() else {
        return;
    };
    for k in parents {
        match cur.get_mut(k).and_then(Value::as_inline_table_mut) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(v) = cur.get_mut(last) {
        v.decor_mut().set_suffix(suffix);
    }
}

/// Add `entries` inside the inline table that starts at `path[line]`, marker lines before its
/// line.
pub fn insert(root: &mut Table, path: &[&str], line: usize, entries: Vec<Entry<'_>>) -> Option<()> {
    let holder = holder_mut(root, &path[..line])?;
    let mut key = holder.key_mut(path[line])?;
    let mut prefix = prefix_str(key.leaf_decor()).to_string();
    for (_, _, marker) in &entries {
        prefix = add_marker_line(&prefix, marker);
    }
    key.leaf_decor_mut().set_prefix(prefix);
    let outer = holder.get_mut(path[line])?.as_inline_table_mut()?;
    let b = brace_owner(outer, path, line);
    let owner = inline_at_mut(outer, &path[line + 1..=b], false)?;
    let before = last_value(owner);
    let runtimes = inline_at_mut(owner, &path[b + 1..], true)?;
    for (name, table, _) in entries {
        runtimes.insert(name, Value::InlineTable(table.into_inline_table()));
    }
    let (after, _) = last_value(owner)?;
    match before {
        Some((old, suffix)) if old != after => {
            set_suffix(owner, &old, "");
            set_suffix(owner, &after, &suffix);
        }
        Some(_) => {}
        // `{}` becomes `{ h = {...} }`; `{ }` keeps its space before `}`.
        None => {
            let spaced = owner.trailing().as_str().is_some_and(|t| !t.is_empty());
            set_suffix(owner, &after, if spaced { "" } else { " " });
        }
    }
    Some(())
}

/// Remove entry `name` (the agent's), and the kept default runtime when only it is left.
pub fn remove(root: &mut Table, path: &[&str], line: usize, name: &str) -> Option<()> {
    let holder = holder_mut(root, &path[..line])?;
    let prefix = holder
        .key(path[line])
        .map_or("", |k| prefix_str(k.leaf_decor()))
        .to_string();
    let has_kept = matches!(shared_mark(&prefix, KEPT_RUNTIME), Mark::Kept(_));
    let mut kept_removed = false;
    {
        let outer = holder.get_mut(path[line])?.as_inline_table_mut()?;
        let b = brace_owner(outer, path, line);
        let owner = inline_at_mut(outer, &path[line + 1..=b], false)?;
        let before = last_value(owner);
        let runtimes = inline_at_mut(owner, &path[b + 1..], false)?;
        runtimes.remove(name)?;
        if has_kept && runtimes.iter().all(|(k, _)| k == KEPT_RUNTIME) {
            kept_removed = runtimes.remove(KEPT_RUNTIME).is_some();
        }
        for depth in (b + 1..path.len()).rev() {
            let parent = inline_at_mut(owner, &path[b + 1..depth], false)?;
            let empty_dotted = parent
                .get(path[depth])
                .and_then(Value::as_inline_table)
                .is_some_and(|t| t.is_dotted() && t.is_empty());
            if empty_dotted {
                parent.remove(path[depth]);
            }
        }
        if let (Some((old, suffix)), Some((new, _))) = (before, last_value(owner))
            && old != new
        {
            set_suffix(owner, &new, &suffix);
        }
    }
    let handler_line = format!("{HANDLER_MARK}{name}");
    let kept_line = KEPT_MARK.trim_end();
    let prefix = drop_marker_lines(&prefix, |l| {
        l == handler_line || (kept_removed && l.starts_with(kept_line))
    });
    holder
        .key_mut(path[line])?
        .leaf_decor_mut()
        .set_prefix(prefix);
    Some(())
}

/// Rewrite entry `name` where it stands, keeping its spacing, and mark it as the agent's.
pub fn replace(
    root: &mut Table,
    path: &[&str],
    line: usize,
    name: &str,
    table: Table,
    marker: &str,
) -> Option<()> {
    let holder = holder_mut(root, &path[..line])?;
    let mut key = holder.key_mut(path[line])?;
    let prefix = prefix_str(key.leaf_decor()).to_string();
    if shared_mark(&prefix, name) != Mark::Handler(name.to_string()) {
        key.leaf_decor_mut()
            .set_prefix(add_marker_line(&prefix, marker));
    }
    let outer = holder.get_mut(path[line])?.as_inline_table_mut()?;
    let old = inline_at_mut(outer, &path[line + 1..], false)?.get_mut(name)?;
    let mut new = Value::InlineTable(table.into_inline_table());
    *new.decor_mut() = old.decor().clone();
    *old = new;
    Some(())
}
