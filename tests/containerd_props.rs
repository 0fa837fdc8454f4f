//! Property tests on generated configs of every version, quoting, form (header, dotted,
//! inline), with comments, blank lines, CRLF, and existing handlers:
//! add∘add = add, remove∘add = identity (bytes), and interleaved add/remove of two handlers
//! gives back the original bytes.

mod containerd_common;

use containerd_common::*;
use proptest::prelude::*;
use shim_agent::containerd::{AddOptions, ConfigFile, ConfigSet, plan_add, plan_remove};

#[derive(Debug, Clone)]
struct Gen {
    version: Option<i64>,
    version_last: bool,
    single_quotes: bool,
    explicit_plugins: bool,
    cri_table_after: bool,
    form: u8,
    handlers: Vec<(String, u8)>,
    comments: Vec<bool>,
    blank_lines: usize,
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

impl Gen {
    fn render(&self) -> String {
        let c = |i: usize, text: &str| {
            if self.comments.get(i).copied().unwrap_or(false) {
                format!("# {text}\n")
            } else {
                String::new()
            }
        };
        let blank = "\n".repeat(self.blank_lines);
        let p = format!("plugins.{}", plugin_key(self.version, self.single_quotes));
        let mut s = c(0, "generated config");
        let version_line = self
            .version
            .map(|v| format!("version = {v}\n"))
            .unwrap_or_default();
        if !self.version_last {
            s += &version_line;
        }
        s += "root = \"/var/lib/containerd\"\n";
        if self.version_last {
            s += &version_line;
        }
        s += &blank;
        for t in &self.extra_tables {
            s += &match t % 3 {
                0 => format!(
                    "{}[grpc]\n  address = \"/run/containerd/containerd.sock\"\n{blank}",
                    c(1, "grpc")
                ),
                1 => format!("[debug]\nlevel = \"info\" # trailing comment\n{blank}"),
                _ => "[metrics]\n    address = \"\"\n\n".to_string(),
            };
        }
        if self.explicit_plugins {
            s += "[plugins]\n\n";
        }
        let cri_table = format!(
            "[{p}]\n  sandbox_image = 'registry.k8s.io/pause:3.10'\n{}{blank}",
            c(2, "sandbox")
        );
        if !self.cri_table_after {
            s += &cri_table;
        }
        match self.form % 4 {
            // header tables
            0 => {
                s += &format!("[{p}.containerd]\n  default_runtime_name = \"runc\"\n{blank}");
                for (name, q) in &self.handlers {
                    s += &c(3, "a handler");
                    s += &format!(
                        "  [{p}.containerd.runtimes.{}]\n    runtime_type = \"io.containerd.runc.v2\"\n",
                        quote_name(name, *q)
                    );
                    s += &format!(
                        "  [{p}.containerd.runtimes.{}.options]\n    SystemdCgroup = true\n{blank}",
                        quote_name(name, *q)
                    );
                }
            }
            // dotted keys in the containerd table
            1 => {
                s += &format!("[{p}.containerd]\n");
                for (name, q) in &self.handlers {
                    s += &format!(
                        "runtimes.{}.runtime_type = \"io.containerd.runc.v2\"\n",
                        quote_name(name, *q)
                    );
                }
                s += &blank;
            }
            // inline handlers in a runtimes header
            2 => {
                s += &format!("[{p}.containerd.runtimes]\n");
                for (name, q) in &self.handlers {
                    s += &format!(
                        "{} = {{ runtime_type = \"io.containerd.runc.v2\", options = {{ SystemdCgroup = true }} }}\n",
                        quote_name(name, *q)
                    );
                }
                s += &blank;
            }
            // no runtimes at all
            _ => s += &format!("[{p}.cni]\nbin_dir = \"/opt/cni/bin\"\n"),
        }
        if self.cri_table_after {
            s += &cri_table;
        }
        s += &c(4, "end");
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
            0u8..4,
            proptest::sample::subsequence(vec!["runc", "nvidia", "test-handler", "kata"], 0..4),
            proptest::collection::vec(0u8..3, 4),
        ),
        (
            proptest::collection::vec(any::<bool>(), 5),
            0usize..3,
            proptest::collection::vec(0u8..3, 0..3),
            any::<bool>(),
            any::<bool>(),
        ),
    )
        .prop_map(
            |(
                (version, version_last, single_quotes, explicit_plugins, cri_table_after),
                (form, names, quotes),
                (comments, blank_lines, extra_tables, crlf, final_newline),
            )| Gen {
                version,
                version_last,
                single_quotes: single_quotes && version.is_some(),
                explicit_plugins,
                cri_table_after,
                form,
                handlers: names
                    .into_iter()
                    .zip(quotes)
                    .map(|(n, q)| (n.to_string(), q))
                    .collect(),
                comments,
                blank_lines,
                extra_tables,
                crlf,
                final_newline,
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
        let had_runtimes = g.form % 4 != 3 && !g.handlers.is_empty();
        if version_of(&j1) <= 2 && !had_runtimes {
            prop_assert!(get(&j1, &[&path[..], &["runc"]].concat()).is_some(), "runc dropped too early");
        }
        let back = remove(&one, second);
        prop_assert_eq!(String::from_utf8_lossy(&back.main.bytes), text);
    }
}
