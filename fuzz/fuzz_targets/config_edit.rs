//! Fuzz target `config_edit`: arbitrary bytes as containerd's main config (and, after a
//! `\n#---\n` separator, a drop-in) through `inspect`, `plan_add`, `plan_remove`.
//!
//! Asserts: no panic; when an add (without `replace`) plans a change, the result parses, a
//! second add is a no-op and removing the handler gives back the original bytes.
//!
//! The engine's sources are included with `#[path]` so that the fuzz build does not compile
//! the whole agent (kube, k8s-openapi) with sanitizers. `load`/`apply` (file I/O through
//! `HostRoot`) are not fuzzed; they only read and write the bytes planned here.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../src/containerd/mod.rs"]
mod containerd;
#[allow(dead_code)]
#[path = "../../src/fsutil.rs"]
mod fsutil;
#[allow(dead_code)]
#[path = "../../src/hostroot.rs"]
mod hostroot;

use containerd::{AddOptions, ConfigFile, ConfigSet, DropinPolicy, RuntimeSpec};
use libfuzzer_sys::fuzz_target;

const SEP: &[u8] = b"\n#---\n";

fn split(data: &[u8]) -> ConfigSet {
    let pos = data.windows(SEP.len()).position(|w| w == SEP);
    let (main, dropins) = match pos {
        Some(p) => (
            &data[..p],
            vec![ConfigFile {
                host_path: "/etc/containerd/conf.d/10-user.toml".into(),
                bytes: data[p + SEP.len()..].to_vec(),
            }],
        ),
        None => (data, vec![]),
    };
    ConfigSet {
        main: ConfigFile {
            host_path: "/etc/containerd/config.toml".into(),
            bytes: main.to_vec(),
        },
        dropins,
    }
}

fn apply_mem(set: &ConfigSet, plan: &containerd::Plan) -> ConfigSet {
    let mut out = set.clone();
    for c in &plan.changes {
        if c.host_path == out.main.host_path {
            out.main.bytes = c.after.clone().expect("main never deleted");
        } else if let Some(i) = out.dropins.iter().position(|d| d.host_path == c.host_path) {
            match &c.after {
                Some(b) => out.dropins[i].bytes = b.clone(),
                None => {
                    out.dropins.remove(i);
                }
            }
        } else {
            let bytes = c.after.clone().expect("deleting a missing file");
            out.dropins.push(ConfigFile {
                host_path: c.host_path.clone(),
                bytes,
            });
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let set = split(data);
    let _ = containerd::inspect(&set);
    let mut spec = RuntimeSpec::from_binary("spin", "/opt/shims/containerd-shim-spin-v2");
    spec.options
        .insert("SystemdCgroup".into(), serde_json::Value::Bool(true));
    let policy = match data.first().map(|b| b % 3) {
        Some(0) => DropinPolicy::Never,
        Some(1) => DropinPolicy::Dir("/etc/containerd/shim.d".into()),
        _ => DropinPolicy::Auto,
    };
    let opts = AddOptions {
        replace: false,
        dropin: policy,
    };
    let _ = containerd::plan_remove(&set, "spin");
    let _ = containerd::plan_add(
        &set,
        &spec,
        &AddOptions {
            replace: true,
            dropin: opts.dropin.clone(),
        },
    );
    if let Ok(plan) = containerd::plan_add(&set, &spec, &opts) {
        if plan.is_empty() {
            return;
        }
        let added = apply_mem(&set, &plan);
        for c in &plan.changes {
            if let Some(b) = &c.after {
                let text = std::str::from_utf8(b).expect("output is UTF-8");
                assert!(
                    text.parse::<toml_edit::DocumentMut>().is_ok(),
                    "output does not parse"
                );
            }
        }
        let again = containerd::plan_add(&added, &spec, &opts).expect("second add");
        assert!(again.is_empty(), "second add is not a no-op");
        let removed = apply_mem(
            &added,
            &containerd::plan_remove(&added, "spin").expect("remove"),
        );
        assert!(
            removed.main.bytes == set.main.bytes,
            "remove did not restore the main file"
        );
        assert!(
            removed.dropins == set.dropins,
            "remove did not restore the drop-ins"
        );
    }
});
