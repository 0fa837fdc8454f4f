//! Property tests on generated configs of every version and quoting, with each table on the
//! path to the runtimes (`plugins`, the plugin ID, `containerd`, `runtimes`) and each handler
//! and its options written as a header, dotted keys or an inline table (dotted keys inside
//! inline tables too), with comments, blank lines, indentation, CRLF, and existing handlers:
//! add∘add = add, remove∘add = identity (bytes), and interleaved add/remove of two handlers
//! gives back the original bytes.

use proptest::prelude::*;
use shim_agent::containerd::{AddOptions, ConfigFile, ConfigSet, plan_add, plan_remove};

use crate::support::containerd::*;

/// How a table is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// `[a.b]` header (no header line when it has no body and is not explicit).
    Header,
    /// Dotted keys `b.c = ...` in the body of its parent (or inside its parent's braces).
    Dotted,
    /// `b = { ... }` on one line.
    Inline,
}

fn form_of(n: u8) -> Form {
    match n % 3 {
        0 => Form::Header,
        1 => Form::Dotted,
        _ => Form::Inline,
    }
}

/// A generated table: its form and its entries (key as written, value).
#[derive(Debug, Clone)]
struct Tbl {
    form: Form,
    entries: Vec<(String, Node)>,
    /// A comment before its header, its first dotted line or its line.
    comment: Option<String>,
    /// `[plugins]` written even with an empty body.
    explicit: bool,
    /// Its header section comes after those of its sub-tables (kind's CRI table).
    after_children: bool,
}

#[derive(Debug, Clone)]
enum Node {
    Leaf(String),
    Table(Tbl),
}

impl Tbl {
    fn new(form: Form, entries: Vec<(String, Node)>) -> Tbl {
        Tbl {
            form,
            entries,
            comment: None,
            explicit: false,
            after_children: false,
        }
    }
}

fn leaf(k: &str, v: &str) -> (String, Node) {
    (k.to_string(), Node::Leaf(v.to_string()))
}

/// Renders a tree of tables as TOML, each table in its own form.
struct Writer {
    indent: String,
    blank: String,
    compact: bool,
    inline_comment: bool,
}

impl Writer {
    /// A header table and the header tables under it.
    fn header(&self, path: &[String], t: &Tbl, out: &mut String) {
        let mut body = String::new();
        let mut deferred = Vec::new();
        self.body(path, &[], t, &mut body, &mut deferred, &mut None);
        let mut section = String::new();
        if !path.is_empty() && (t.explicit || !body.is_empty()) {
            if let Some(c) = &t.comment {
                section += &format!("# {c}\n");
            }
            section += &format!("[{}]\n{body}{}", path.join("."), self.blank);
        } else {
            section += &body;
            if !body.is_empty() {
                section += &self.blank;
            }
        }
        if !t.after_children {
            *out += &section;
        }
        for (p, c) in deferred {
            self.header(&p, c, out);
        }
        if t.after_children {
            *out += &section;
        }
    }

    /// The body lines of `t` (whose dotted keys start with `prefix`); header sub-tables are
    /// left in `deferred`.
    fn body<'t>(
        &self,
        path: &[String],
        prefix: &[String],
        t: &'t Tbl,
        out: &mut String,
        deferred: &mut Vec<(Vec<String>, &'t Tbl)>,
        pending: &mut Option<String>,
    ) {
        for (k, n) in &t.entries {
            let key = [prefix, std::slice::from_ref(k)].concat();
            let line = |v: String, out: &mut String, pending: &mut Option<String>| {
                if let Some(c) = pending.take() {
                    *out += &format!("{}# {c}\n", self.indent);
                }
                *out += &format!("{}{} = {v}\n", self.indent, key.join("."));
            };
            match n {
                Node::Leaf(v) => line(v.clone(), out, pending),
                Node::Table(c) => match c.form {
                    Form::Header => deferred.push(([path, &key[..]].concat(), c)),
                    Form::Dotted => {
                        if pending.is_none() {
                            *pending = c.comment.clone();
                        }
                        self.body(path, &key, c, out, deferred, pending);
                    }
                    Form::Inline => {
                        if pending.is_none() {
                            *pending = c.comment.clone();
                        }
                        let mut v = self.inline(c);
                        if self.inline_comment {
                            v += " # one line";
                        }
                        line(v, out, pending);
                    }
                },
            }
        }
    }

    /// `{ ... }`; sub-tables in header form cannot occur inside (they are dotted or inline).
    fn inline(&self, t: &Tbl) -> String {
        let mut parts = Vec::new();
        self.inline_entries(&[], t, &mut parts);
        let (sp, eq) = if self.compact {
            ("", "=")
        } else {
            (" ", " = ")
        };
        if parts.is_empty() {
            return "{}".into();
        }
        let parts: Vec<String> = parts.iter().map(|(k, v)| format!("{k}{eq}{v}")).collect();
        format!("{{{sp}{}{sp}}}", parts.join(&format!(",{sp}")))
    }

    fn inline_entries(&self, prefix: &[String], t: &Tbl, out: &mut Vec<(String, String)>) {
        for (k, n) in &t.entries {
            let key = [prefix, std::slice::from_ref(k)].concat();
            match n {
                Node::Leaf(v) => out.push((key.join("."), v.clone())),
                Node::Table(c) if c.form == Form::Dotted => self.inline_entries(&key, c, out),
                Node::Table(c) => out.push((key.join("."), self.inline(c))),
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Gen {
    version: Option<i64>,
    version_last: bool,
    single_quotes: bool,
    explicit_plugins: bool,
    cri_table_after: bool,
    /// Forms of `plugins`, the plugin ID, `containerd`, `runtimes` (a header never under a
    /// dotted or inline table; dotted under inline means dotted keys inside the braces).
    forms: [Form; 4],
    /// 2: the CRI table only (with `cni`), 3: `containerd` without runtimes, 4: runtimes.
    depth: u8,
    /// Handlers: name, quoting, form of the handler and of its options.
    handlers: Vec<(String, u8, Form, Form)>,
    comments: Vec<bool>,
    blank_lines: usize,
    indent: u8,
    compact: bool,
    inline_comment: bool,
    extra_tables: Vec<u8>,
    crlf: bool,
    final_newline: bool,
}

fn plugin_key(version: Option<i64>, single: bool) -> String {
    let id = match version {
        None => return "cri".into(),
        Some(2) => "io.containerd.grpc.v1.cri",
        Some(_) => "io.containerd.cri.v1.runtime",
    };
    if single {
        format!("'{id}'")
    } else {
        format!("\"{id}\"")
    }
}

fn quote_name(name: &str, q: u8) -> String {
    match q % 3 {
        0 => name.to_string(),
        1 => format!("\"{name}\""),
        _ => format!("'{name}'"),
    }
}

/// `child` may not be a header under a table that is not one.
fn under(parent: Form, child: Form) -> Form {
    if parent != Form::Header && child == Form::Header {
        Form::Dotted
    } else {
        child
    }
}

impl Gen {
    fn comment(&self, i: usize, text: &str) -> Option<String> {
        self.comments
            .get(i)
            .copied()
            .unwrap_or(false)
            .then(|| text.to_string())
    }

    fn tree(&self) -> Tbl {
        let [fp, fi, fc, fr] = self.forms;
        let handlers = self
            .handlers
            .iter()
            .map(|(name, q, hf, of)| {
                let hf = under(fr, *hf);
                let options = Tbl::new(under(hf, *of), vec![leaf("SystemdCgroup", "true")]);
                let mut h = Tbl::new(
                    hf,
                    vec![
                        leaf("runtime_type", "\"io.containerd.runc.v2\""),
                        ("options".into(), Node::Table(options)),
                    ],
                );
                h.comment = self.comment(3, "a handler");
                (quote_name(name, *q), Node::Table(h))
            })
            .collect();
        let runtimes = Tbl::new(fr, handlers);
        let mut containerd = Tbl::new(fc, vec![leaf("default_runtime_name", "\"runc\"")]);
        if self.depth >= 4 {
            containerd
                .entries
                .push(("runtimes".into(), Node::Table(runtimes)));
        }
        let mut cri = Tbl::new(
            fi,
            vec![leaf("sandbox_image", "'registry.k8s.io/pause:3.10'")],
        );
        cri.comment = self.comment(2, "the CRI plugin");
        cri.after_children = self.cri_table_after;
        if self.depth >= 3 {
            cri.entries
                .push(("containerd".into(), Node::Table(containerd)));
        } else {
            let cni = Tbl::new(fc, vec![leaf("bin_dir", "\"/opt/cni/bin\"")]);
            cri.entries.push(("cni".into(), Node::Table(cni)));
        }
        let mut plugins = Tbl::new(
            fp,
            vec![(
                plugin_key(self.version, self.single_quotes),
                Node::Table(cri),
            )],
        );
        plugins.explicit = self.explicit_plugins;
        let mut root = Tbl::new(Form::Header, Vec::new());
        let version = self.version.map(|v| leaf("version", &v.to_string()));
        if !self.version_last {
            root.entries.extend(version.clone());
        }
        root.entries.push(leaf("root", "\"/var/lib/containerd\""));
        if self.version_last {
            root.entries.extend(version);
        }
        for t in &self.extra_tables {
            let mut extra = match t % 3 {
                0 => Tbl::new(
                    Form::Header,
                    vec![leaf("address", "\"/run/containerd/containerd.sock\"")],
                ),
                1 => Tbl::new(
                    Form::Header,
                    vec![leaf("level", "\"info\" # trailing comment")],
                ),
                _ => Tbl::new(Form::Header, vec![leaf("address", "\"\"")]),
            };
            extra.comment = self.comment(1, "an extra table");
            let name = ["grpc", "debug", "metrics"][usize::from(t % 3)];
            if !root.entries.iter().any(|(k, _)| k == name) {
                root.entries.push((name.into(), Node::Table(extra)));
            }
        }
        root.entries.push(("plugins".into(), Node::Table(plugins)));
        root
    }

    /// True when the deepest table on the path is dotted or inline, or the runtimes table's
    /// handlers are all inline or all dotted: a new handler is then written in that form, and
    /// no `[header]` is added.
    fn keeps_out_of_headers(&self) -> bool {
        let runtimes =
            self.depth >= 4 && (!self.handlers.is_empty() || self.forms[3] == Form::Inline);
        let deepest = if runtimes {
            3
        } else {
            usize::from(self.depth.min(3)) - 1
        };
        if self.forms[deepest] != Form::Header {
            return true;
        }
        let all = |f: Form| self.handlers.iter().all(|(_, _, h, _)| *h == f);
        runtimes && (all(Form::Inline) || all(Form::Dotted))
    }

    fn render(&self) -> String {
        let w = Writer {
            indent: ["", "  ", "\t"][usize::from(self.indent % 3)].to_string(),
            blank: "\n".repeat(self.blank_lines),
            compact: self.compact,
            inline_comment: self.inline_comment,
        };
        let mut s = self
            .comment(0, "generated config")
            .map(|c| format!("# {c}\n"))
            .unwrap_or_default();
        w.header(&[], &self.tree(), &mut s);
        if let Some(c) = self.comment(4, "end") {
            s += &format!("# {c}\n");
        }
        if !self.final_newline {
            while s.ends_with('\n') {
                s.pop();
            }
        }
        if self.crlf {
            s.replace('\n', "\r\n")
        } else {
            s
        }
    }
}

fn gen_config() -> impl Strategy<Value = Gen> {
    (
        (
            prop_oneof![Just(None), Just(Some(2)), Just(Some(3)), Just(Some(4))],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        ),
        (
            (0usize..5, proptest::collection::vec(any::<bool>(), 4)),
            2u8..5,
            proptest::sample::subsequence(vec!["runc", "nvidia", "test-handler", "kata"], 0..4),
            proptest::collection::vec((0u8..3, 0u8..3, 0u8..3), 4),
        ),
        (
            proptest::collection::vec(any::<bool>(), 5),
            0usize..3,
            0u8..3,
            any::<bool>(),
            any::<bool>(),
            proptest::collection::vec(0u8..3, 0..3),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (version, version_last, single_quotes, explicit_plugins, cri_table_after),
                ((headers, inline), depth, names, handler_forms),
                (
                    comments,
                    blank_lines,
                    indent,
                    compact,
                    inline_comment,
                    extra_tables,
                    crlf,
                    final_newline,
                ),
            )| {
                // as many leading headers as drawn, then dotted keys or inline tables
                let mut f = [Form::Header; 4];
                for (i, inl) in inline.iter().enumerate().skip(headers) {
                    f[i] = if *inl { Form::Inline } else { Form::Dotted };
                }
                Gen {
                    version,
                    version_last,
                    single_quotes: single_quotes && version.is_some(),
                    explicit_plugins: explicit_plugins && f[0] == Form::Header,
                    cri_table_after,
                    forms: f,
                    depth,
                    handlers: names
                        .into_iter()
                        .zip(handler_forms)
                        .map(|(n, (q, h, o))| (n.to_string(), q, form_of(h), form_of(o)))
                        .collect(),
                    comments,
                    blank_lines,
                    indent,
                    compact,
                    inline_comment,
                    extra_tables,
                    crlf,
                    final_newline,
                }
            },
        )
}

fn set_of(text: &str) -> ConfigSet {
    ConfigSet {
        main: ConfigFile {
            host_path: "/etc/containerd/config.toml".into(),
            bytes: text.as_bytes().to_vec(),
        },
        dropins: vec![],
    }
}

fn add(set: &ConfigSet, h: &str) -> ConfigSet {
    let plan = plan_add(set, &test_spec(h), &AddOptions::default())
        .unwrap_or_else(|e| panic!("add {h}: {e}\n{}", String::from_utf8_lossy(&set.main.bytes)));
    apply_mem(set, &plan)
}

fn remove(set: &ConfigSet, h: &str) -> ConfigSet {
    let plan = plan_remove(set, h).unwrap_or_else(|e| panic!("remove {h}: {e}"));
    apply_mem(set, &plan)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn add_is_idempotent_and_remove_restores_the_bytes(g in gen_config()) {
        let text = g.render();
        prop_assume!(toml_edit::de::from_str::<serde_json::Value>(&text).is_ok());
        let set = set_of(&text);
        let spec = test_spec("spin");
        let added = add(&set, "spin");
        check_add_remove_round_trip(&format!("{g:?}\n{text}"), &set, &spec, None);
        prop_assert!(plan_add(&added, &spec, &AddOptions::default()).unwrap().is_empty());
        prop_assert_eq!(&remove(&added, "spin").main.bytes, &set.main.bytes);
        let headers = |b: &[u8]| String::from_utf8_lossy(b).lines().filter(|l| l.trim_start().starts_with('[')).count();
        if g.keeps_out_of_headers() {
            prop_assert_eq!(headers(&added.main.bytes), headers(&set.main.bytes), "a header was added:\n{}", String::from_utf8_lossy(&added.main.bytes));
        } else {
            prop_assert!(headers(&added.main.bytes) > headers(&set.main.bytes), "no header was added");
        }
    }

    #[test]
    fn two_handlers_added_and_removed_in_any_order_give_back_the_bytes(g in gen_config(), rev in any::<bool>()) {
        let text = g.render();
        prop_assume!(toml_edit::de::from_str::<serde_json::Value>(&text).is_ok());
        let set = set_of(&text);
        let both = add(&add(&set, "spin"), "wasm");
        let j = parse_json(&both.main.bytes);
        let path = runtimes_path(version_of(&j));
        prop_assert!(get(&j, &[&path[..], &["spin"]].concat()).is_some());
        prop_assert!(get(&j, &[&path[..], &["wasm"]].concat()).is_some());
        let (first, second) = if rev { ("wasm", "spin") } else { ("spin", "wasm") };
        let one = remove(&both, first);
        // while one agent handler is left, a kept default runtime stays
        let j1 = parse_json(&one.main.bytes);
        let had_runtimes = get(&parse_json(text.as_bytes()), &path)
            .and_then(serde_json::Value::as_object)
            .is_some_and(|o| !o.is_empty());
        if version_of(&j1) <= 2 && !had_runtimes {
            prop_assert!(get(&j1, &[&path[..], &["runc"]].concat()).is_some(), "runc dropped too early");
        }
        let back = remove(&one, second);
        prop_assert_eq!(String::from_utf8_lossy(&back.main.bytes), text);
    }
}
