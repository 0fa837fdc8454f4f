//! The shape of `src/`, checked against the module map of docs/design.md §11:
//!
//! - every module imports only the modules its row names, and only from layers below its own
//!   (the `crate::`, `super::` and `self::` paths of its code, comments and strings left out);
//! - no modules of one folder import each other in a circle;
//! - every module of `src/lib.rs` (and of `cluster/`) has its row;
//! - no function is longer than 80 lines, except those the map lists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const MAX_FN_LINES: usize = 80;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `src` with comments and the contents of string and char literals blanked, newlines kept
/// (so line numbers stay and no path inside a comment or a string counts).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, part: &[u8]| {
        out.extend(part.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let end = if rest.starts_with(b"//") {
            i + rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len())
        } else if rest.starts_with(b"/*") {
            i + 2 + find(&rest[2..], b"*/").map_or(rest.len() - 2, |p| p + 2)
        } else if let Some(open) = raw_string_open(rest).filter(|_| !word_before) {
            let hashes = open - rest[..open].iter().position(|&c| c == b'"').unwrap_or(0) - 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            i + open + find(&rest[open..], &close).map_or(rest.len() - open, |p| p + close.len())
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            i + (j + 1).min(rest.len())
        } else if let Some(n) = char_literal(rest) {
            i + n
        } else {
            out.push(b[i]);
            i += 1;
            continue;
        };
        blank(&mut out, &b[i..end]);
        i = end;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `r"`, `r#"`, `br##"`…: the length of the opening.
fn raw_string_open(rest: &[u8]) -> Option<usize> {
    let s = rest.strip_prefix(b"b").unwrap_or(rest);
    let s = s.strip_prefix(b"r")?;
    let hashes = s.iter().take_while(|&&c| c == b'#').count();
    (s.get(hashes) == Some(&b'"')).then(|| rest.len() - s.len() + hashes + 1)
}

/// `'x'`, `'\n'`, `'\u{1F600}'`, `'é'`: its length (a lifetime is not one).
fn char_literal(rest: &[u8]) -> Option<usize> {
    if rest.first() != Some(&b'\'') {
        return None;
    }
    if rest.get(1) == Some(&b'\\') {
        let close = rest[2..].iter().position(|&c| c == b'\'')?;
        return (close <= 10).then_some(close + 3);
    }
    let text = std::str::from_utf8(&rest[1..rest.len().min(6)])
        .ok()
        .or_else(|| {
            (2..6)
                .rev()
                .find_map(|n| std::str::from_utf8(rest.get(1..n)?).ok())
        })?;
    let c = text.chars().next()?;
    (rest.get(1 + c.len_utf8()) == Some(&b'\'')).then_some(c.len_utf8() + 2)
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's files (not the binary's `main.rs`) with their module paths.
fn modules() -> Vec<(PathBuf, Vec<String>)> {
    let src = root().join("src");
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "main.rs"))
        .map(|f| {
            let rel = f.strip_prefix(&src).unwrap().with_extension("");
            let mut m: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                m.pop();
            }
            (f, m)
        })
        .collect()
}

fn ident_len(s: &[u8]) -> usize {
    s.iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count()
}

/// The module paths `code` names through `crate::`, `super::` and `self::` (each `use`
/// group's items too), resolved from `module`.
fn references(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| !word_before && b[i..].starts_with(h.as_bytes()));
        let Some(head) = head else {
            i += 1;
            continue;
        };
        let mut path: Vec<String> = match head {
            "crate::" => Vec::new(),
            "self::" => module.to_vec(),
            _ => module[..module.len().saturating_sub(1)].to_vec(),
        };
        i += head.len();
        let mut group = false;
        loop {
            if b[i..].starts_with(b"super::") {
                path.pop();
                i += 7;
                continue;
            }
            if b.get(i) == Some(&b'{') {
                for item in group_items(&b[i + 1..]) {
                    let mut p = path.clone();
                    if item != "self" {
                        p.push(item);
                    }
                    out.push(p);
                }
                group = true;
                break;
            }
            let n = ident_len(&b[i..]);
            if n == 0 {
                break;
            }
            path.push(String::from_utf8_lossy(&b[i..i + n]).into_owned());
            i += n;
            if !b[i..].starts_with(b"::") {
                break;
            }
            i += 2;
        }
        if !group {
            out.push(path);
        }
    }
    out
}

/// The first identifier of each item of a `use` group (`{a::b, c, self}` → a, c, self).
fn group_items(b: &[u8]) -> Vec<String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, true);
    for (k, &c) in b.iter().enumerate() {
        match c {
            b'{' => depth += 1,
            b'}' if depth == 0 => break,
            b'}' => depth -= 1,
            b',' if depth == 0 => start = true,
            c if start && (c.is_ascii_alphabetic() || c == b'_') => {
                start = false;
                if depth == 0 {
                    items.push(String::from_utf8_lossy(&b[k..k + ident_len(&b[k..])]).into_owned());
                }
            }
            _ => {}
        }
    }
    items
}

/// A row of the module map.
struct Row {
    layer: u32,
    may_import: BTreeSet<String>,
}

/// The module map's rows, by module (`cluster::agent` for the inner table), and the long
/// functions it allows (`module::…::function`).
fn read_map() -> (BTreeMap<String, Row>, BTreeSet<String>) {
    let design = std::fs::read_to_string(root().join("docs/design.md")).unwrap();
    let section = design
        .split("\n## ")
        .find(|s| s.starts_with("11. Module map"))
        .expect("docs/design.md has a §11. Module map");
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let mut rows = BTreeMap::new();
    let mut long = BTreeSet::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, layer, module, _, may, _] = cells[..]
            && let Ok(layer) = layer.parse()
        {
            let module = ticked(module).pop().expect("a module in backticks");
            let may_import = ticked(may).into_iter().collect();
            rows.insert(module, Row { layer, may_import });
        } else if let Some(item) = line.strip_prefix("- `") {
            long.insert(item.split('`').next().unwrap_or_default().to_string());
        }
    }
    (rows, long)
}

/// The rows `path` lies in, outermost first (`cluster::agent::gate` → cluster, cluster::agent).
fn units_of(rows: &BTreeMap<String, Row>, path: &[String]) -> Vec<String> {
    (1..=path.len())
        .map(|n| path[..n].join("::"))
        .filter(|u| rows.contains_key(u))
        .collect()
}

#[test]
fn every_module_imports_only_what_the_map_allows_from_below() {
    let (rows, _) = read_map();
    let known: BTreeSet<Vec<String>> = modules().into_iter().map(|(_, m)| m).collect();
    let mut wrong = BTreeSet::new();
    for (file, module) in modules() {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let from = units_of(&rows, &module);
        for mut to in references(&code, &module) {
            while !to.is_empty() && !known.contains(&to) {
                to.pop();
            }
            let to = units_of(&rows, &to);
            // compare where the two paths part: a module and its own parts are one
            let Some(at) = (0..from.len().min(to.len())).find(|&k| from[k] != to[k]) else {
                continue;
            };
            let (a, b) = (&rows[&from[at]], &rows[&to[at]]);
            if !a.may_import.contains(&to[at]) || b.layer >= a.layer {
                wrong.insert(format!(
                    "{} (layer {}) imports {} (layer {}) in {}",
                    from[at],
                    a.layer,
                    to[at],
                    b.layer,
                    file.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports the module map of docs/design.md §11 does not allow:\n{}",
        wrong.into_iter().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_map_names_every_module_and_only_real_ones() {
    let (rows, _) = read_map();
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).unwrap();
    let declared = |text: &str, prefix: &str| -> BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix("pub mod "))
            .map(|m| format!("{prefix}{}", m.trim_end_matches(';')))
            .collect()
    };
    let cluster = std::fs::read_to_string(root().join("src/cluster/mod.rs")).unwrap();
    let mut wanted = declared(&lib, "");
    wanted.extend(declared(&cluster, "cluster::"));
    let listed: BTreeSet<String> = rows.keys().cloned().collect();
    assert_eq!(
        listed, wanted,
        "docs/design.md §11 against src/lib.rs and src/cluster/mod.rs"
    );
    for (name, row) in &rows {
        for m in &row.may_import {
            assert!(
                rows.contains_key(m),
                "{name} may import {m}, which has no row"
            );
        }
    }
}

#[test]
fn no_modules_of_one_folder_import_each_other_in_a_circle() {
    let mods = modules();
    let known: BTreeSet<Vec<String>> = mods.iter().map(|(_, m)| m.clone()).collect();
    // parent → (child → children it imports)
    let mut graph: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (file, module) in &mods {
        let code = code_only(&std::fs::read_to_string(file).unwrap());
        for mut to in references(&code, module) {
            while !to.is_empty() && !known.contains(&to) {
                to.pop();
            }
            let at = (0..module.len().min(to.len())).find(|&k| module[k] != to[k]);
            if let Some(at) = at {
                graph
                    .entry(module[..at].to_vec())
                    .or_default()
                    .entry(module[at].clone())
                    .or_default()
                    .insert(to[at].clone());
            }
        }
    }
    let mut circles = Vec::new();
    for (parent, edges) in &graph {
        for start in edges.keys() {
            if let Some(path) = circle_through(edges, start) {
                circles.push(format!("in {}: {}", parent.join("::"), path.join(" → ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "modules that import each other:\n{}",
        circles.join("\n")
    );
}

/// A path from `start` back to it, if there is one.
fn circle_through(edges: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last()?;
        for next in edges.get(last).into_iter().flatten() {
            if next == start {
                let mut done = path.clone();
                done.push(next.clone());
                return Some(done);
            }
            if seen.insert(next.clone()) {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    None
}

/// Every function with a body: (module path, name, first line, lines).
fn functions() -> Vec<(String, String, usize, usize)> {
    let mut out = Vec::new();
    for (file, module) in modules() {
        let code = code_only(&std::fs::read_to_string(&file).unwrap());
        let b = code.as_bytes();
        let mut i = 0;
        while let Some(p) = find(&b[i..], b"fn ") {
            let at = i + p;
            i = at + 3;
            if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
                continue;
            }
            let name = String::from_utf8_lossy(&b[i..i + ident_len(&b[i..])]).into_owned();
            let Some(open) = b[i..].iter().position(|&c| c == b'{' || c == b';') else {
                break;
            };
            if b[i + open] == b';' {
                continue; // a declaration without a body
            }
            let mut depth = 0;
            let mut end = i + open;
            for (k, &c) in b[i + open..].iter().enumerate() {
                depth += i32::from(c == b'{') - i32::from(c == b'}');
                if depth == 0 {
                    end = i + open + k;
                    break;
                }
            }
            let line = |pos: usize| b[..pos].iter().filter(|&&c| c == b'\n').count() + 1;
            out.push((module.join("::"), name, line(at), line(end) - line(at) + 1));
        }
    }
    out
}

#[test]
fn no_function_is_longer_than_80_lines_but_the_listed_ones() {
    let (_, allowed) = read_map();
    let fns = functions();
    assert!(
        fns.len() > 500,
        "the scan finds the functions ({} found)",
        fns.len()
    );
    let mut long = Vec::new();
    let mut used = BTreeSet::new();
    for (module, name, line, lines) in fns {
        if lines <= MAX_FN_LINES {
            continue;
        }
        let listed = allowed
            .iter()
            .find(|a| a.starts_with(&format!("{module}::")) && a.ends_with(&format!("::{name}")));
        match listed {
            Some(a) => {
                used.insert(a.clone());
            }
            None => long.push(format!("{module}::{name} (line {line}): {lines} lines")),
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines that docs/design.md §11 does not list:\n{}",
        long.join("\n")
    );
    let stale: Vec<_> = allowed.difference(&used).collect();
    assert!(
        stale.is_empty(),
        "listed as long but no longer are: {stale:?}"
    );
}

#[test]
fn the_scanner_sees_code_and_not_comments_or_strings() {
    let code = code_only(
        "use crate::a; // crate::b\nlet s = \"crate::c\"; let r = r#\"crate::d\"#;\n\
         let c = '\"'; fn f<'x>(y: &'x str) { super::e::f() }\n/* crate::g */ use self::{h, i::j};",
    );
    let m = vec!["p".to_string(), "q".to_string()];
    let refs: Vec<String> = references(&code, &m).iter().map(|r| r.join("::")).collect();
    assert_eq!(refs, ["a", "p::e::f", "p::q::h", "p::q::i"]);
    assert_eq!(code.lines().count(), 4, "lines are kept");
}
