//! The scanner behind the shape test (tests/pure/shape.rs): source text with comments and
//! literals blanked, the module paths a file names (through `crate::`, `super::`, `self::` and
//! its own child modules), re-exports followed to the module that defines an item, and the
//! inherent methods a file defines and calls on `self`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// `src` with comments and the contents of string and char literals blanked, newlines kept
/// (so line numbers stay and no path inside a comment or a string counts).
pub fn code_only(src: &str) -> String {
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

pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `r"`, `r#"`, `br##"`…: the length of the opening.
pub fn raw_string_open(rest: &[u8]) -> Option<usize> {
    let s = rest.strip_prefix(b"b").unwrap_or(rest);
    let s = s.strip_prefix(b"r")?;
    let hashes = s.iter().take_while(|&&c| c == b'#').count();
    (s.get(hashes) == Some(&b'"')).then(|| rest.len() - s.len() + hashes + 1)
}

/// `'x'`, `'\n'`, `'\u{1F600}'`, `'é'`: its length (a lifetime is not one).
pub fn char_literal(rest: &[u8]) -> Option<usize> {
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

pub fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
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
pub fn modules() -> Vec<(PathBuf, Vec<String>)> {
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

pub fn ident_len(s: &[u8]) -> usize {
    s.iter()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_')
        .count()
}

/// The module paths `code` names through `crate::`, `super::` and `self::`, and through the
/// names of its own child modules (`children`, declared by `mod x;`) at the start of a path
/// (each `use` group's items too), resolved from `module`.
pub fn references(code: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let path_before = i > 1 && &b[i - 2..i] == b"::";
        let head = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|h| !word_before && b[i..].starts_with(h.as_bytes()));
        let n = ident_len(&b[i..]);
        let child = !word_before
            && !path_before
            && n > 0
            && b[i + n..].starts_with(b"::")
            && children.contains(&String::from_utf8_lossy(&b[i..i + n]).into_owned());
        let mut path: Vec<String> = match head {
            Some("crate::") => Vec::new(),
            Some("self::") => module.to_vec(),
            Some(_) => module[..module.len().saturating_sub(1)].to_vec(),
            None if child => module.to_vec(),
            None => {
                i += n.max(1);
                continue;
            }
        };
        i += head.map_or(0, str::len);
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
pub fn group_items(b: &[u8]) -> Vec<String> {
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

/// Every function with a body: (module path, name, first line, lines).
pub fn functions() -> Vec<(String, String, usize, usize)> {
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

/// The child modules a file declares with `mod x;` (its own files).
pub fn child_mods(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|l| {
            let line = l.trim();
            let l = line
                .strip_prefix("pub ")
                .or_else(|| {
                    line.strip_prefix("pub(")
                        .and_then(|r| Some(r[r.find(')')? + 1..].trim_start()))
                })
                .unwrap_or(line);
            let name = l.strip_prefix("mod ")?.strip_suffix(';')?;
            Some(name.trim().to_string())
        })
        .collect()
}

/// The names of the items a file declares public (`pub struct X`, `pub fn x`, ...).
pub fn public_items(code: &str) -> BTreeSet<String> {
    let kinds = [
        "struct ", "enum ", "fn ", "const ", "static ", "type ", "trait ", "mod ",
    ];
    code.lines()
        .filter_map(|l| {
            let l = l.trim().strip_prefix("pub")?;
            let l = match l.strip_prefix('(') {
                Some(r) => r[r.find(')')? + 1..].trim_start(),
                None => l.strip_prefix(' ')?,
            };
            let l = l.strip_prefix("async ").unwrap_or(l);
            let rest = kinds.iter().find_map(|k| l.strip_prefix(k))?;
            let n = ident_len(rest.as_bytes());
            (n > 0).then(|| rest[..n].to_string())
        })
        .collect()
}

/// Re-exports: (module, name) → the path it re-exports; and each module's glob re-exports.
#[derive(Default)]
pub struct Reexports {
    named: BTreeMap<(Vec<String>, String), Vec<String>>,
    globs: BTreeMap<Vec<String>, Vec<Vec<String>>>,
    items: BTreeMap<Vec<String>, BTreeSet<String>>,
}

impl Reexports {
    /// Read the `pub use` items (any visibility) of every module.
    pub fn of(mods: &[(PathBuf, Vec<String>, String)]) -> Self {
        let mut r = Reexports::default();
        for (_, module, code) in mods {
            r.items.insert(module.clone(), public_items(code));
            let children = child_mods(code);
            for stmt in pub_uses(code) {
                let glob = stmt.trim_end().ends_with("::*");
                for path in references(&stmt, module, &children) {
                    if glob {
                        r.globs.entry(module.clone()).or_default().push(path);
                    } else if let Some(name) = stmt
                        .split(" as ")
                        .nth(1)
                        .map(|n| n.trim().to_string())
                        .or_else(|| path.last().cloned())
                    {
                        r.named.insert((module.clone(), name), path);
                    }
                }
            }
        }
        r
    }

    /// The module `to` names, re-exports followed to the module that defines the item.
    pub fn resolve(&self, mut to: Vec<String>, known: &BTreeSet<Vec<String>>) -> Vec<String> {
        for _ in 0..8 {
            let mut k = to.len();
            while k > 0 && !known.contains(&to[..k]) {
                k -= 1;
            }
            let Some(name) = to.get(k).cloned() else {
                return to;
            };
            let module = to[..k].to_vec();
            let through_glob = || {
                self.globs.get(&module)?.iter().find_map(|g| {
                    let defines = self.items.get(g)?.contains(&name);
                    defines.then(|| [g.clone(), vec![name.clone()]].concat())
                })
            };
            match self
                .named
                .get(&(module.clone(), name.clone()))
                .cloned()
                .or_else(through_glob)
            {
                Some(target) if target != to[..=k] => to = [target, to[k + 1..].to_vec()].concat(),
                _ => {
                    to.truncate(k);
                    return to;
                }
            }
        }
        to
    }
}

/// The text of each `pub use` statement (`pub`, `pub(crate)`, `pub(super)`, ...), up to its `;`.
fn pub_uses(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(p) = rest.find("pub") {
        let after = &rest[p + 3..];
        let after = match after.strip_prefix('(') {
            Some(r) => r.find(')').map_or("", |c| &r[c + 1..]),
            None => after,
        };
        let before_ok = p == 0 || !rest.as_bytes()[p - 1].is_ascii_alphanumeric();
        if before_ok && let Some(stmt) = after.trim_start().strip_prefix("use ") {
            let end = stmt.find(';').unwrap_or(stmt.len());
            out.push(stmt[..end].to_string());
        }
        rest = &rest[p + 3..];
    }
    out
}

/// The inherent methods a file defines, by type (`impl<..> Type<..> { fn m ... }`, not
/// `impl Trait for Type`).
pub fn inherent_methods(code: &str) -> BTreeMap<String, BTreeSet<String>> {
    let b = code.as_bytes();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut i = 0;
    while let Some(p) = find(&b[i..], b"impl") {
        let at = i + p;
        i = at + 4;
        let word = |k: usize| b[k].is_ascii_alphanumeric() || b[k] == b'_';
        if (at > 0 && word(at - 1)) || b.get(at + 4).is_none_or(|_| word(at + 4)) {
            continue;
        }
        let Some(open) = b[i..].iter().position(|&c| c == b'{' || c == b';') else {
            break;
        };
        let head = String::from_utf8_lossy(&b[i..i + open]).into_owned();
        if b[i + open] == b';' || head.contains(" for ") {
            continue;
        }
        // the type: the last path segment's name, generics dropped
        let head = strip_generics(&head);
        let head = head.split(" where ").next().unwrap_or_default().trim();
        let ty = head
            .rsplit("::")
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let body = block_at(b, i + open);
        let methods = out.entry(ty).or_default();
        let (mut depth, mut k) = (0, i + open);
        while k < body {
            match b[k] {
                b'{' => depth += 1,
                b'}' => depth -= 1,
                b'f' if depth == 1 && b[k..].starts_with(b"fn ") && !word(k - 1) => {
                    let n = ident_len(&b[k + 3..]);
                    methods.insert(String::from_utf8_lossy(&b[k + 3..k + 3 + n]).into_owned());
                }
                _ => {}
            }
            k += 1;
        }
        i = body;
    }
    out
}

/// `text` without its `<...>` parts.
fn strip_generics(text: &str) -> String {
    let mut depth = 0;
    text.chars()
        .filter(|&c| {
            match c {
                '<' => depth += 1,
                '>' => depth -= 1,
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// The end of the block that opens at `open` (a `{`).
fn block_at(b: &[u8], open: usize) -> usize {
    let mut depth = 0;
    for (k, &c) in b[open..].iter().enumerate() {
        depth += i32::from(c == b'{') - i32::from(c == b'}');
        if depth == 0 {
            return open + k;
        }
    }
    b.len()
}

/// The methods a file calls on `self` or `Self` (`self.m(`, `Self::m(`).
pub fn self_calls(code: &str) -> BTreeSet<String> {
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    for head in [&b"self."[..], &b"Self::"[..]] {
        let mut i = 0;
        while let Some(p) = find(&b[i..], head) {
            let at = i + p;
            i = at + head.len();
            if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
                continue;
            }
            let n = ident_len(&b[i..]);
            let call = b[i + n..].starts_with(b"(") || b[i + n..].starts_with(b"::<");
            if n > 0 && call {
                out.insert(String::from_utf8_lossy(&b[i..i + n]).into_owned());
            }
        }
    }
    out
}
