//! Byte-preserving edits of one TOML document with `toml_edit`.
//!
//! Guarantees: a document is only edited when rendering it unchanged gives back the exact input
//! bytes (checked on parse); CRLF files are edited as LF and written back as CRLF; a missing final
//! newline stays missing. New tables are plain `[header]` tables placed right after the existing
//! runtime handlers (or the CRI plugin's tables), parents that do not exist are created
//! *implicit* (no header is written for them, and none is ever added for an existing table), and
//! every table the agent adds carries a marker comment in its header decor:
//! `# shim-agent: handler <h>` or `# shim-agent: default runtime kept for handler <h>`.

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table};

use super::error::ConfigError;
use super::schema::{self, Version};

/// Marker line prefix of a handler table added by the agent.
pub const HANDLER_MARK: &str = "# shim-agent: handler ";
/// Marker line prefix of a default runtime the agent made explicit.
pub const KEPT_MARK: &str = "# shim-agent: default runtime kept for handler ";
/// Marker line prefix of an `imports` key the agent created.
pub const IMPORT_MARK: &str = "# shim-agent: imports added for drop-ins";

/// A parsed config file plus what is needed to render it back byte for byte.
#[derive(Debug, Clone)]
pub struct Doc {
    /// The document (line endings normalised to LF).
    pub doc: DocumentMut,
    /// The LF-normalised text it was parsed from.
    pub text: String,
    /// `toml_edit`'s rendering of the unedited document, when it differs from `text` (it
    /// normalises the quoting of a key written two ways, as EKS does). Edits are then spliced
    /// into `text` line by line, so those lines keep their original bytes.
    base: Option<String>,
    crlf: bool,
    eof_newline: bool,
}

impl Doc {
    /// Parse bytes; refuse non-UTF-8, invalid TOML, and files that would not round-trip.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Doc, ConfigError> {
        let raw = std::str::from_utf8(bytes).map_err(|e| {
            let (line, column) = line_col(&String::from_utf8_lossy(bytes), e.valid_up_to());
            ConfigError::ParseError {
                path: path.to_path_buf(),
                line,
                column,
                message: "not valid UTF-8".into(),
            }
        })?;
        Self::parse_str(path, raw)
    }

    /// Parse text (templates must have been refused before).
    pub fn parse_str(path: &Path, raw: &str) -> Result<Doc, ConfigError> {
        let n_lf = raw.matches('\n').count();
        let crlf = n_lf > 0 && raw.matches("\r\n").count() == n_lf;
        let text = if crlf {
            raw.replace("\r\n", "\n")
        } else {
            raw.to_string()
        };
        let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
            let (line, column) = line_col(&text, e.span().map(|s| s.start).unwrap_or(0));
            ConfigError::ParseError {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_string(),
            }
        })?;
        let eof_newline = raw.is_empty() || raw.ends_with('\n');
        let rendered = doc.to_string();
        let full = if eof_newline {
            text.clone()
        } else {
            format!("{text}\n")
        };
        let base = (rendered != full && text.lines().count() == rendered.lines().count())
            .then_some(rendered);
        let d = Doc {
            doc,
            crlf,
            eof_newline,
            text,
            base,
        };
        if d.render() != raw.as_bytes() {
            return Err(ConfigError::UnsupportedLayout {
                path: path.to_path_buf(),
                detail: "the file cannot be edited without changing bytes outside the runtime \
                         handler; please report this file"
                    .into(),
            });
        }
        Ok(d)
    }

    /// A new, empty document rendered with LF and a final newline.
    pub fn new_empty() -> Doc {
        Doc {
            doc: DocumentMut::new(),
            text: String::new(),
            base: None,
            crlf: false,
            eof_newline: true,
        }
    }

    /// Render with the original line endings and final-newline state.
    pub fn render(&self) -> Vec<u8> {
        let mut s = self.doc.to_string();
        if let Some(base) = &self.base {
            s = splice(&self.text, base, &s);
        }
        if !self.eof_newline {
            while s.ends_with('\n') {
                s.pop();
            }
        }
        if self.crlf {
            s = s.replace('\n', "\r\n");
        }
        s.into_bytes()
    }
}

/// Apply the line changes `base → edited` to `orig`, which has the same lines as `base`
/// up to formatting: unchanged lines come from `orig`, changed ones from `edited`.
fn splice(orig: &str, base: &str, edited: &str) -> String {
    let o: Vec<&str> = orig.split_inclusive('\n').collect();
    let a: Vec<&str> = base.split_inclusive('\n').collect();
    let b: Vec<&str> = edited.split_inclusive('\n').collect();
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let max_suf = a.len().min(b.len()) - pre;
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(max_suf)
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    // LCS over the changed middle only (small: one or two tables).
    let mut l = vec![vec![0u32; bm.len() + 1]; am.len() + 1];
    for i in (0..am.len()).rev() {
        for j in (0..bm.len()).rev() {
            l[i][j] = if am[i] == bm[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let mut out = String::with_capacity(edited.len() + 1);
    // The original's last line may lack the newline `base` has: add it (render strips it).
    let push_orig = |out: &mut String, i: usize| {
        let line = o.get(i).copied().unwrap_or(a[i]);
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push('\n');
        }
    };
    (0..pre).for_each(|i| push_orig(&mut out, i));
    let (mut i, mut j) = (0, 0);
    while i < am.len() || j < bm.len() {
        if i < am.len() && j < bm.len() && am[i] == bm[j] {
            push_orig(&mut out, pre + i);
            i += 1;
            j += 1;
        } else if j < bm.len() && (i == am.len() || l[i][j + 1] >= l[i + 1][j]) {
            out.push_str(bm[j]);
            j += 1;
        } else {
            i += 1;
        }
    }
    (a.len() - suf..a.len()).for_each(|i| push_orig(&mut out, i));
    out
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let col_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[col_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

/// Who added a table, read from its header decor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Not marked: user-defined.
    None,
    /// `# shim-agent: handler <h>`.
    Handler(String),
    /// `# shim-agent: default runtime kept for handler <h>`.
    Kept(String),
}

/// The marker of a table item (only header tables can carry one).
pub fn mark_of(item: &Item) -> Mark {
    let Some(prefix) = item
        .as_table()
        .and_then(|t| t.decor().prefix())
        .and_then(|p| p.as_str())
    else {
        return Mark::None;
    };
    for line in prefix.lines() {
        let line = line.trim();
        if let Some(h) = line.strip_prefix(HANDLER_MARK) {
            return Mark::Handler(h.trim().to_string());
        }
        if let Some(h) = line.strip_prefix(KEPT_MARK) {
            return Mark::Kept(h.trim().to_string());
        }
    }
    Mark::None
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

/// The runtimes table for writing, creating missing parents as implicit tables.
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
            _ => {
                return Err(ConfigError::UnsupportedLayout {
                    path: path.to_path_buf(),
                    detail: format!(
                        "`{seg}` on the way to {} is an inline table or a value; rewrite it as \
                         [table] headers so a handler can be added without rewriting it",
                        schema::runtimes_path_display(version)
                    ),
                });
            }
        };
    }
    Ok(cur)
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
/// `(name, table)` when `kept` is given.
pub fn insert_handler(
    doc: &mut DocumentMut,
    version: Version,
    path: &Path,
    name: &str,
    table: Table,
    kept: Option<(&str, Table)>,
) -> Result<(), ConfigError> {
    let pos = anchor_position(doc, version);
    let runtimes = runtimes_table_mut(doc, version, path)?;
    if let Some((kept_name, kept_table)) = kept {
        let marker = format!("{KEPT_MARK}{name}");
        runtimes.insert(
            kept_name,
            Item::Table(marked_table(kept_table, &marker, pos)),
        );
    }
    let marker = format!("{HANDLER_MARK}{name}");
    match runtimes.get(name) {
        // Replace a header table where it stands, keeping its comments.
        Some(Item::Table(old)) if !old.is_dotted() => {
            let old_prefix = old
                .decor()
                .prefix()
                .and_then(|p| p.as_str())
                .unwrap_or("\n")
                .to_string();
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
            runtimes.remove(name);
            runtimes.insert(name, Item::Table(marked_table(table, &marker, pos)));
        }
    }
    Ok(())
}

/// Remove handler `name` (which the caller checked is marked) and, when no other handler is
/// left, the default runtimes the agent kept; then prune the empty implicit parents.
pub fn remove_handler(doc: &mut DocumentMut, version: Version, name: &str) {
    let path = schema::runtimes_path(version);
    {
        let Some(Item::Table(runtimes)) = get_path_mut(doc.as_table_mut(), &path) else {
            return;
        };
        runtimes.remove(name);
        let only_kept = runtimes
            .iter()
            .all(|(_, it)| matches!(mark_of(it), Mark::Kept(_)));
        if only_kept {
            runtimes.retain(|_, it| !matches!(mark_of(it), Mark::Kept(_)));
        }
    }
    prune_implicit(doc.as_table_mut(), &path);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn crlf_and_missing_final_newline_round_trip() {
        let p = Path::new("/x.toml");
        for s in [
            "a = 1\r\n[b]\r\nc = 2\r\n",
            "a = 1\n[b]\nc = 2",
            "",
            "a = 1\r\n[b]\r\nc = 2",
        ] {
            assert_eq!(
                Doc::parse_str(p, s).unwrap().render(),
                s.as_bytes(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn mixed_line_endings_are_kept_line_by_line() {
        let p = Path::new("/x.toml");
        let s = "a = 1\r\n[b]\nc = 2\r\n";
        let mut d = Doc::parse_str(p, s).unwrap();
        assert_eq!(d.render(), s.as_bytes());
        d.doc["b"]["e"] = toml_edit::value(3);
        assert_eq!(d.render(), b"a = 1\r\n[b]\nc = 2\r\ne = 3\n");
    }

    #[test]
    fn a_key_quoted_two_ways_keeps_both_quotings_when_edited() {
        let p = Path::new("/x.toml");
        let s = "[a.'b']\nx = 1\n\n[a.\"b\".c]\ny = 2";
        let mut d = Doc::parse_str(p, s).unwrap();
        assert_eq!(d.render(), s.as_bytes());
        d.doc["a"]["b"]["z"] = toml_edit::value(3);
        let out = String::from_utf8(d.render()).unwrap();
        assert_eq!(out, "[a.'b']\nx = 1\nz = 3\n\n[a.\"b\".c]\ny = 2");
    }

    #[test]
    fn parse_errors_report_line_and_column() {
        let e = Doc::parse_str(Path::new("/x.toml"), "a = 1\nb = = 2\n").unwrap_err();
        match e {
            ConfigError::ParseError { line, column, .. } => assert_eq!((line, column), (2, 5)),
            other => panic!("{other}"),
        }
        let e = Doc::parse(Path::new("/x.toml"), b"a = \"\xff\"\n").unwrap_err();
        assert_eq!(e.reason(), "ParseError");
    }
}
