//! The shape of `src/`, checked against the module map of docs/design.md §11:
//!
//! - every module imports only the modules its row names, and only from layers below its own
//!   (the paths of its code through `crate::`, `super::`, `self::` and its child modules,
//!   re-exports followed to the module that defines the item; comments and strings left out);
//! - the files of each folder import only the files below them in the folder's order, and no
//!   two import each other in a circle; a method a file calls on `self` that a sibling file
//!   defines (one type's `impl` spread over files) counts as an import of that sibling;
//! - a folder's `mod.rs` is a file of its folder above all the others: it may use them, none
//!   of them uses what it defines (but the files the map lists as not there yet); inline test
//!   modules are tests, out of the order;
//! - every module of `src/lib.rs` (and of `cluster/`) has its row, and every folder its order;
//! - no function is longer than 80 lines, except those the map lists.

#[path = "shape_scan.rs"]
mod scan;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use scan::*;

const MAX_FN_LINES: usize = 80;

/// Each folder's files, bottom up, by folder (`cluster::agent`).
type Orders = BTreeMap<String, Vec<String>>;

/// The files of each folder that still use what its `mod.rs` defines, as the map lists them
/// (folder → files).
type UsersOfMod = BTreeMap<String, BTreeSet<String>>;

/// A row of the module map.
struct Row {
    layer: u32,
    may_import: BTreeSet<String>,
}

/// The module map's rows, by module (`cluster::agent` for the inner table), and the long
/// functions it allows (`module::…::function`).
fn read_map() -> (BTreeMap<String, Row>, BTreeSet<String>) {
    let (rows, long, _, _) = read_map_and_orders();
    (rows, long)
}

/// [`read_map`], each folder's files, bottom up (`folder` → files), and the files listed as
/// still using their folder's `mod.rs`.
fn read_map_and_orders() -> (BTreeMap<String, Row>, BTreeSet<String>, Orders, UsersOfMod) {
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
    let mut orders = BTreeMap::new();
    let mut users_of_mod = BTreeMap::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let [_, folder, files, _] = cells[..]
            && let Some(folder) = ticked(folder).pop()
        {
            orders.insert(folder, ticked(files));
        } else if let [_, folder, files, _, _] = cells[..]
            && let Some(folder) = ticked(folder).pop()
        {
            users_of_mod.insert(folder, ticked(files).into_iter().collect());
        } else if let [_, layer, module, _, may, _] = cells[..]
            && let Ok(layer) = layer.parse()
        {
            let module = ticked(module).pop().expect("a module in backticks");
            let may_import = ticked(may).into_iter().collect();
            rows.insert(module, Row { layer, may_import });
        } else if let Some(item) = line.strip_prefix("- `") {
            long.insert(item.split('`').next().unwrap_or_default().to_string());
        }
    }
    (rows, long, orders, users_of_mod)
}

/// The rows `path` lies in, outermost first (`cluster::agent::gate` → cluster, cluster::agent).
fn units_of(rows: &BTreeMap<String, Row>, path: &[String]) -> Vec<String> {
    (1..=path.len())
        .map(|n| path[..n].join("::"))
        .filter(|u| rows.contains_key(u))
        .collect()
}

/// One import: the file, its module, and the module it imports.
struct Edge {
    file: PathBuf,
    from: Vec<String>,
    to: Vec<String>,
    /// Made in an inline test module (`mod tests { … }`): a test, not in the folder's order.
    in_tests: bool,
}

/// Every import of the library's files: the paths their code names, re-exports followed, and
/// the methods they call on `self` that a sibling file defines.
fn edges() -> Vec<Edge> {
    let mods: Vec<(PathBuf, Vec<String>, String)> = modules()
        .into_iter()
        .map(|(f, m)| {
            let code = code_only(&std::fs::read_to_string(&f).unwrap());
            (f, m, inline_mods_lifted(&code))
        })
        .collect();
    let known: BTreeSet<Vec<String>> = mods.iter().map(|(_, m, _)| m.clone()).collect();
    let reexports = Reexports::of(&mods);
    let mut out = Vec::new();
    let mut mains = Vec::new();
    for (file, module, code) in &mods {
        let children = child_mods(code);
        let (main, tests) = split_inline_tests(code);
        for (text, in_tests) in [(&main, false), (&tests, true)] {
            for to in references(text, module, &children) {
                out.push(Edge {
                    file: file.clone(),
                    from: module.clone(),
                    to: reexports.resolve(to, &known),
                    in_tests,
                });
            }
        }
        mains.push((file.clone(), module.clone(), main));
    }
    out.extend(method_edges(&mains));
    out
}

/// `code` without its inline test modules (`mod tests { … }`, `mod *_tests { … }`), and those
/// modules alone: each the same length, the rest blanked, newlines kept.
fn split_inline_tests(code: &str) -> (String, String) {
    let b = code.as_bytes();
    let (mut main, mut tests) = (b.to_vec(), vec![b' '; b.len()]);
    let mut i = 0;
    while let Some(p) = code[i..].find("mod ") {
        let at = i + p;
        i = at + 4;
        let word_before = at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        let n = ident_len(&b[i..]);
        let name = &code[i..i + n];
        let gap = b[i + n..]
            .iter()
            .take_while(|c| c.is_ascii_whitespace())
            .count();
        let open = i + n + gap;
        if word_before || !is_test_file(name) || b.get(open) != Some(&b'{') {
            continue;
        }
        let end = block_end(b, open).min(b.len() - 1);
        for k in at..=end {
            tests[k] = b[k];
            if b[k] != b'\n' {
                main[k] = b' ';
            } else {
                tests[k] = b'\n';
            }
        }
        i = end + 1;
    }
    for (k, &c) in b.iter().enumerate() {
        if c == b'\n' {
            tests[k] = b'\n';
        }
    }
    let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    (text(main), text(tests))
}

/// `code` (comments and literals blanked) with each `super::` inside an inline module
/// (`mod tests { … }`) written as `self::`: there it names the file's own module, and the scanner
/// reads every path as said from the file (`super::super::` becomes `self::super::`, the parent).
fn inline_mods_lifted(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    // where the inline module the scan is in ends
    let mut inside_until = 0;
    let mut i = 0;
    while i < b.len() {
        let word_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        let path_before = i > 1 && &b[i - 2..i] == b"::";
        if !word_before && i >= inside_until && b[i..].starts_with(b"mod ") {
            let n = ident_len(&b[i + 4..]);
            let gap = b[i + 4 + n..]
                .iter()
                .take_while(|c| c.is_ascii_whitespace())
                .count();
            let open = i + 4 + n + gap;
            if n > 0 && b.get(open) == Some(&b'{') {
                inside_until = block_end(b, open);
            }
        }
        if i < inside_until && !word_before && !path_before && b[i..].starts_with(b"super::") {
            out.extend_from_slice(b"self::");
            i += "super::".len();
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The end of the block that opens at `open` (a `{`), or of `b`.
fn block_end(b: &[u8], open: usize) -> usize {
    let mut depth = 0i32;
    for (k, &c) in b[open..].iter().enumerate() {
        depth += i32::from(c == b'{') - i32::from(c == b'}');
        if depth == 0 {
            return open + k;
        }
    }
    b.len()
}

/// A file that calls on `self` a method of its type that another file of its folder defines
/// (a sibling, or the folder's `mod.rs`) imports that file (the `impl` of one type spread over
/// files).
fn method_edges(mods: &[(PathBuf, Vec<String>, String)]) -> Vec<Edge> {
    let methods: Vec<_> = mods
        .iter()
        .map(|(_, m, code)| (m, inherent_methods(code), self_calls(code)))
        .collect();
    let mut out = Vec::new();
    for (i, (g, g_types, calls)) in methods.iter().enumerate() {
        for (f, f_types, _) in &methods {
            if g.is_empty() || f.is_empty() || within_folder(g, f).is_none() {
                continue;
            }
            let called = g_types.iter().any(|(ty, own)| {
                let theirs = f_types.get(ty);
                calls
                    .iter()
                    .any(|c| !own.contains(c) && theirs.is_some_and(|t| t.contains(c)))
            });
            if called {
                out.push(Edge {
                    file: mods[i].0.clone(),
                    from: (*g).clone(),
                    to: (*f).clone(),
                    in_tests: false,
                });
            }
        }
    }
    out
}

#[test]
fn every_module_imports_only_what_the_map_allows_from_below() {
    let (rows, _) = read_map();
    let mut wrong = BTreeSet::new();
    for Edge { file, from, to, .. } in edges() {
        let from = units_of(&rows, &from);
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

/// The imports between the files of each folder: folder → (file → the files it imports), the
/// folder's own `mod.rs` among them ([`within_folder`]). Test files (`tests`, `*_tests`) import
/// their siblings but are not part of the folder's order.
fn folder_graph() -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (_, module) in modules() {
        if let Some((last, parent)) = module.split_last() {
            graph
                .entry(parent.to_vec())
                .or_default()
                .entry(last.clone())
                .or_default();
        }
    }
    for Edge { from, to, .. } in edges().into_iter().filter(|e| !e.in_tests) {
        if let Some((folder, file, imported)) = within_folder(&from, &to) {
            graph
                .entry(folder)
                .or_default()
                .entry(file)
                .or_default()
                .insert(imported);
        }
    }
    graph
}

/// The name a folder's own `mod.rs` takes among the folder's files.
const MOD_RS: &str = "mod.rs";

/// Where an import between modules `from` and `to` falls: the folder where their paths part,
/// and the file of that folder each lies in. A module that is the folder itself is its
/// `mod.rs` ([`MOD_RS`]): a file of a folder that uses what the folder's `mod.rs` defines
/// imports `mod.rs`, and `mod.rs` that uses a file's imports that file. `None` within one
/// module, and for `lib.rs` (a path that names no module resolves to it).
fn within_folder(from: &[String], to: &[String]) -> Option<(Vec<String>, String, String)> {
    if from == to || from.is_empty() || to.is_empty() {
        return None;
    }
    let common = from.len().min(to.len());
    let at = (0..common).find(|&k| from[k] != to[k]).unwrap_or(common);
    let file = |m: &[String]| m.get(at).cloned().unwrap_or_else(|| MOD_RS.to_string());
    Some((from[..at].to_vec(), file(from), file(to)))
}

fn is_test_file(name: &str) -> bool {
    name == "tests" || name.ends_with("_tests")
}

/// A file of a folder's order: neither a test file nor the folder's own mod.rs.
fn is_ordered_file(name: &str) -> bool {
    name != MOD_RS && !is_test_file(name)
}

#[test]
fn no_modules_of_one_folder_import_each_other_in_a_circle() {
    let (_, _, _, users_of_mod) = read_map_and_orders();
    let mut circles = Vec::new();
    for (parent, mut edges) in folder_graph() {
        // the files listed as still using their mod.rs: known, and checked below
        let listed = users_of_mod.get(&parent.join("::"));
        for (file, imports) in edges.iter_mut() {
            if listed.is_some_and(|l| l.contains(file)) {
                imports.remove(MOD_RS);
            }
        }
        let edges = &edges;
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

/// The top-level modules and `cluster`'s follow the layers of the map; every other folder
/// lists its files bottom up.
fn ordered_by_layers(folder: &[String]) -> bool {
    folder.is_empty() || folder == ["cluster"]
}

#[test]
fn the_files_of_each_folder_import_only_those_below_them() {
    let (_, _, orders, users_of_mod) = read_map_and_orders();
    let mut wrong = Vec::new();
    let mut folders = BTreeSet::new();
    let mut still_use_mod = UsersOfMod::new();
    for (folder, files) in folder_graph() {
        let name = folder.join("::");
        // a folder's mod.rs stands above every file of the folder, in any folder (but the
        // files the map lists as not there yet)
        let listed = users_of_mod.get(&name);
        for (file, imports) in files.iter().filter(|(f, _)| is_ordered_file(f)) {
            if !imports.contains(MOD_RS) {
                continue;
            }
            still_use_mod
                .entry(name.clone())
                .or_default()
                .insert(file.clone());
            if !listed.is_some_and(|l| l.contains(file)) {
                wrong.push(format!(
                    "{name}: `{file}` uses what the folder's mod.rs defines (a type, a function, \
                     a method it calls on `self`), but mod.rs stands above every file of its \
                     folder: move that into a file of the folder"
                ));
            }
        }
        if ordered_by_layers(&folder) {
            continue;
        }
        folders.insert(name.clone());
        let own: BTreeSet<&String> = files.keys().filter(|f| is_ordered_file(f)).collect();
        let Some(order) = orders.get(&name) else {
            wrong.push(format!(
                "{name} has no order; bottom up it is: {}",
                suggest(&files)
            ));
            continue;
        };
        let listed: BTreeSet<&String> = order.iter().collect();
        if listed != own {
            wrong.push(format!(
                "{name}: the order lists {listed:?}, the folder has {own:?}; bottom up it is: {}",
                suggest(&files)
            ));
            continue;
        }
        let pos = |f: &String| order.iter().position(|o| o == f);
        for (file, imports) in files.iter().filter(|(f, _)| is_ordered_file(f)) {
            let others = imports.iter().filter(|t| *t != MOD_RS);
            for to in others.filter(|t| pos(t) >= pos(file)) {
                wrong.push(format!(
                    "{name}: `{file}` imports `{to}`, which is not below it"
                ));
            }
        }
    }
    let stale: Vec<_> = orders.keys().filter(|f| !folders.contains(*f)).collect();
    assert!(
        stale.is_empty(),
        "orders of folders that do not exist: {stale:?}"
    );
    for (folder, files) in &users_of_mod {
        let now = still_use_mod.get(folder);
        for file in files
            .iter()
            .filter(|f| !now.is_some_and(|n| n.contains(*f)))
        {
            wrong.push(format!(
                "{folder}: `{file}` no longer uses the folder's mod.rs: take it off the list of \
                 docs/design.md §11"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "folders whose files are out of the order docs/design.md §11 gives them:\n{}",
        wrong.join("\n")
    );
}

/// A bottom-up order of a folder's files (those importing nothing first; ties by name), as
/// the table row it would take.
fn suggest(files: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut left: BTreeMap<&String, BTreeSet<&String>> = files
        .iter()
        .filter(|(f, _)| is_ordered_file(f))
        .map(|(f, i)| {
            (
                f,
                i.iter()
                    .filter(|t| *t != f && is_ordered_file(t) && files.contains_key(*t))
                    .collect(),
            )
        })
        .collect();
    let mut order = Vec::new();
    while !left.is_empty() {
        let next = left
            .iter()
            .find(|(_, i)| i.iter().all(|t| order.contains(t)))
            .or_else(|| left.iter().next())
            .map(|(f, _)| *f);
        let Some(next) = next else { break };
        left.remove(next);
        order.push(next);
    }
    let ticks: Vec<String> = order.iter().map(|f| format!("`{f}`")).collect();
    ticks.join(", ")
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
    let none = BTreeSet::new();
    let refs: Vec<String> = references(&code, &m, &none)
        .iter()
        .map(|r| r.join("::"))
        .collect();
    assert_eq!(refs, ["a", "p::e::f", "p::q::h", "p::q::i"]);
    assert_eq!(code.lines().count(), 4, "lines are kept");
}

#[test]
fn the_scanner_follows_child_paths_and_re_exports() {
    let m = |p: &str| -> Vec<String> { p.split("::").map(str::to_string).collect() };
    // a child module named at the start of a path is the file's own child
    let code = code_only("mod fetch;\nuse fetch::Limits;\nuse other::x; fn f() { fetch::go() }");
    let children = child_mods(&code);
    let refs: Vec<String> = references(&code, &m("artifact"), &children)
        .iter()
        .map(|r| r.join("::"))
        .collect();
    assert_eq!(refs, ["artifact::fetch::Limits", "artifact::fetch::go"]);
    // an item re-exported by the parent resolves to the file that defines it, also through
    // a glob
    let parent =
        code_only("mod fetch;\nmod model;\npub use fetch::{Fetcher, Limits};\npub use model::*;");
    let fetch = code_only("pub struct Limits;");
    let model = code_only("pub(crate) struct Working;\npub enum Phase {}");
    let mods = vec![
        (PathBuf::from("mod.rs"), m("artifact"), parent),
        (PathBuf::from("fetch.rs"), m("artifact::fetch"), fetch),
        (PathBuf::from("model.rs"), m("artifact::model"), model),
        (
            PathBuf::from("unpack.rs"),
            m("artifact::unpack"),
            String::new(),
        ),
    ];
    let known = mods.iter().map(|(_, m, _)| m.clone()).collect();
    let r = Reexports::of(&mods);
    assert_eq!(
        r.resolve(m("artifact::Limits"), &known),
        m("artifact::fetch")
    );
    assert_eq!(
        r.resolve(m("artifact::Phase::Applied"), &known),
        m("artifact::model")
    );
    assert_eq!(r.resolve(m("artifact::Unknown"), &known), m("artifact"));
    assert_eq!(
        r.resolve(m("artifact::unpack::f"), &known),
        m("artifact::unpack")
    );
}

#[test]
fn the_scanner_sees_one_types_methods_across_files() {
    let round = code_only(
        "impl<R: X> Agent<'_, R> {\n    fn round(&self) { self.report(); Self::plan(); self.own() }\n    fn own(&self) {}\n}\nimpl Drop for Agent { fn drop(&mut self) {} }",
    );
    let methods = inherent_methods(&round);
    assert_eq!(
        methods["Agent"],
        BTreeSet::from(["round".into(), "own".into()])
    );
    assert!(!methods.contains_key("Drop"));
    assert_eq!(
        self_calls(&round),
        BTreeSet::from(["report".into(), "plan".into(), "own".into()])
    );
}

#[test]
fn the_scanner_reads_super_in_an_inline_module_as_the_file_itself() {
    let m = |p: &str| -> Vec<String> { p.split("::").map(str::to_string).collect() };
    let code = inline_mods_lifted(&code_only(
        "use super::a::X;\nfn f() {}\n#[cfg(test)]\nmod tests {\n    use super::*;\n    \
         use super::super::b::Y;\n    fn g() { super::f() }\n}\nuse super::c;",
    ));
    let refs: Vec<String> = references(&code, &m("gate::batch"), &BTreeSet::new())
        .iter()
        .map(|r| r.join("::"))
        .collect();
    assert_eq!(
        refs,
        [
            "gate::a::X",
            "gate::batch",
            "gate::b::Y",
            "gate::batch::f",
            "gate::c"
        ]
    );
}
