//! Against a real containerd binary: every editable version 1/2 corpus file, after `plan_add`,
//! must still give containerd's *merged* view (`containerd --config F config dump`) every
//! handler it had, unchanged, plus the new one, and the same default runtime. This is the
//! 1.x "a runtimes table replaces the default map" trap checked by containerd itself.
//!
//! Needs a containerd 1.x binary, so it is ignored by default:
//! `SHIM_AGENT_CONTAINERD_BIN=/path/to/containerd cargo test --test pure containerd_real:: -- --ignored`
//! (Debian bookworm: `apt-get download containerd && dpkg-deb -x containerd_*.deb x`, then
//! `x/usr/bin/containerd`, version 1.6.20).
//!
//! Likewise every editable version 3/4 corpus file with containerd 2.x builds (each reads the
//! versions it supports: 2.2 up to 3, 2.3 up to 4): `SHIM_AGENT_CONTAINERD2_BINS=BIN:BIN cargo
//! test --test pure containerd_real::containerd_2x -- --ignored` (scripts/test does both).
//!
//! The same binaries also read every golden add output of `tests/fixtures/containerd/` (each
//! form of each table on the path: header, dotted keys, inline tables, their mixes): every
//! handler of the input unchanged, the new one with its runtime type, path, options and pod
//! annotations (1.x: versions 1 and 2, e.g. containerd 1.7.34; 2.x: versions 2 and up).

use std::path::Path;
use std::process::Command;

use serde_json::Value as Json;
use shim_agent::containerd::{AddOptions, ConfigFile, ConfigSet, DropinPolicy, plan_add};

use crate::support::containerd::*;

/// containerd's merged view of a config: (default runtime, handlers).
fn dump(
    bin: &str,
    dir: &Path,
    bytes: &[u8],
) -> Result<(Json, serde_json::Map<String, Json>), String> {
    let f = dir.join("config.toml");
    std::fs::write(&f, bytes).unwrap();
    let out = Command::new(bin)
        .arg("--config")
        .arg(&f)
        .args(["config", "dump"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let j = parse_json(&out.stdout);
    let c = get(&j, &["plugins", "io.containerd.grpc.v1.cri", "containerd"])
        .cloned()
        .unwrap_or_default();
    let runtimes = c
        .get("runtimes")
        .and_then(Json::as_object)
        .cloned()
        .unwrap_or_default();
    Ok((
        c.get("default_runtime_name").cloned().unwrap_or(Json::Null),
        runtimes,
    ))
}

/// A handler as the CRI plugin uses it. Runtime options are decoded by the shim into a struct:
/// a zero value (false, 0, "", []) is the same as no value. containerd's built-in runc lists
/// its zero-valued options; the explicit runc the engine keeps leaves them unset. And an
/// empty `sandbox_mode` (1.7) or `sandboxer` (2.x) is set to `podsandbox` when the plugin
/// validates its config (`ValidatePluginConfig`), which `config dump` does not run: 1.7's
/// built-in runc dumps `podsandbox`, an explicit runc without the key dumps "".
fn zero_options_unset(handler: &Json) -> Json {
    let mut h = handler.clone();
    for k in ["sandbox_mode", "sandboxer"] {
        if let Some(v) = h.get_mut(k).filter(|v| v.as_str() == Some("")) {
            *v = Json::from("podsandbox");
        }
    }
    if let Some(o) = h.get_mut("options").and_then(Json::as_object_mut) {
        o.retain(|_, v| {
            !(v == &Json::Bool(false)
                || v.as_i64() == Some(0)
                || v.as_str() == Some("")
                || v.as_array().is_some_and(|a| a.is_empty()))
        });
    }
    h
}

#[test]
#[ignore = "needs a containerd 1.x binary in SHIM_AGENT_CONTAINERD_BIN"]
fn containerd_1x_keeps_every_handler_and_gets_the_new_one() {
    let bin = std::env::var("SHIM_AGENT_CONTAINERD_BIN").expect("set SHIM_AGENT_CONTAINERD_BIN");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/containerd-configs");
    let tmp = tempfile::tempdir().unwrap();
    let spec = test_spec("wasmtest");
    let mut checked = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        let bytes = std::fs::read(&p).unwrap();
        let set = ConfigSet {
            main: ConfigFile {
                host_path: "/etc/containerd/config.toml".into(),
                bytes: bytes.clone(),
            },
            dropins: vec![],
        };
        // containerd 1.x does not read version 3/4 files (they belong to 2.x).
        let Ok(parsed) = toml_edit::de::from_slice::<Json>(&bytes) else {
            continue;
        };
        if version_of(&parsed) > 2 {
            continue;
        }
        let opts = AddOptions {
            replace: false,
            dropin: DropinPolicy::Never,
        };
        let Ok(plan) = plan_add(&set, &spec, &opts) else {
            continue;
        };
        let Ok((default_before, before)) = dump(&bin, tmp.path(), &bytes) else {
            continue;
        };
        let after_bytes = plan.changes[0].after.clone().unwrap();
        let (default_after, after) = dump(&bin, tmp.path(), &after_bytes)
            .unwrap_or_else(|e| panic!("{name}: containerd refuses the edited file: {e}"));
        assert_eq!(default_before, default_after, "{name}: default runtime");
        for (h, v) in &before {
            assert_eq!(
                after.get(h).map(zero_options_unset),
                Some(zero_options_unset(v)),
                "{name}: handler {h} changed or vanished"
            );
        }
        let new = after
            .get("wasmtest")
            .unwrap_or_else(|| panic!("{name}: no new handler: {after:?}"));
        assert_eq!(
            new.get("runtime_type"),
            Some(&Json::from(spec.runtime_type.clone())),
            "{name}"
        );
        assert_eq!(
            new.get("runtime_path").and_then(Json::as_str),
            spec.runtime_path.as_deref(),
            "{name}"
        );
        assert_eq!(
            new.get("options"),
            Some(&Json::Object(spec.options.clone())),
            "{name}"
        );
        let default = default_after.as_str().unwrap_or("runc");
        assert!(
            after.contains_key(default),
            "{name}: default runtime {default} missing"
        );
        checked.push(name);
    }
    eprintln!("checked with {bin}: {checked:#?}");
    assert!(checked.len() >= 15, "only {} files checked", checked.len());
}

/// containerd 2.x's merged view of a version 3/4 config: its runtime handlers.
fn dump_2x(bin: &str, dir: &Path, bytes: &[u8]) -> Result<serde_json::Map<String, Json>, String> {
    let f = dir.join("config.toml");
    std::fs::write(&f, bytes).unwrap();
    let out = Command::new(bin)
        .arg("--config")
        .arg(&f)
        .args(["config", "dump"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let j = parse_json(&out.stdout);
    Ok(get(&j, &runtimes_path(3))
        .and_then(Json::as_object)
        .cloned()
        .unwrap_or_default())
}

#[test]
#[ignore = "needs containerd 2.x binaries in SHIM_AGENT_CONTAINERD2_BINS"]
fn containerd_2x_reads_every_edited_version_3_and_4_config() {
    // e.g. /var/tmp/containerd-bins/containerd-v2.2.7:/var/tmp/containerd-bins/containerd-v2.3.4
    let bins =
        std::env::var("SHIM_AGENT_CONTAINERD2_BINS").expect("set SHIM_AGENT_CONTAINERD2_BINS");
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/containerd-configs");
    let tmp = tempfile::tempdir().unwrap();
    let spec = test_spec("wasmtest");
    let mut entries: Vec<_> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    let mut checked = Vec::new();
    for bin in bins.split(':') {
        for p in &entries {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(p).unwrap();
            let Ok(parsed) = toml_edit::de::from_slice::<Json>(&bytes) else {
                continue;
            };
            if version_of(&parsed) < 3 {
                continue;
            }
            // a version this binary refuses (2.2 and version 4) is not its to read
            let Ok(before) = dump_2x(bin, tmp.path(), &bytes) else {
                continue;
            };
            let set = ConfigSet {
                main: ConfigFile {
                    host_path: "/etc/containerd/config.toml".into(),
                    bytes: bytes.clone(),
                },
                dropins: vec![],
            };
            let opts = AddOptions {
                replace: false,
                dropin: DropinPolicy::Never,
            };
            let Ok(plan) = plan_add(&set, &spec, &opts) else {
                continue;
            };
            let after_bytes = plan.changes[0].after.clone().unwrap();
            let after = dump_2x(bin, tmp.path(), &after_bytes)
                .unwrap_or_else(|e| panic!("{name}: {bin} refuses the edited file: {e}"));
            for (h, v) in &before {
                assert_eq!(
                    after.get(h).map(zero_options_unset),
                    Some(zero_options_unset(v)),
                    "{name} ({bin}): handler {h} changed or vanished"
                );
            }
            let new = after
                .get("wasmtest")
                .unwrap_or_else(|| panic!("{name} ({bin}): no new handler: {after:?}"));
            assert_eq!(
                new.get("runtime_type"),
                Some(&Json::from(spec.runtime_type.clone())),
                "{name} ({bin})"
            );
            checked.push(format!(
                "{name} ({})",
                bin.rsplit('/').next().unwrap_or(bin)
            ));
        }
    }
    eprintln!("checked: {checked:#?}");
    assert!(
        checked.len() >= 6,
        "only {} file/binary pairs checked",
        checked.len()
    );
}

/// One golden add case of `tests/fixtures/containerd/` edited in place (no drop-ins): its
/// name, input and expected bytes, and the handler it adds as containerd must dump it.
struct GoldenAdd {
    name: String,
    input: Vec<u8>,
    expected: Vec<u8>,
    handler: String,
    want: Json,
}

/// What microk8s renders from its containerd template (the substitutions of its
/// `run-containerd-with-args` wrapper, as the corpus's SOURCES.md records them).
fn render_microk8s(bytes: &[u8]) -> Vec<u8> {
    let mut t = String::from_utf8_lossy(bytes).into_owned();
    for (var, value) in [
        ("${SNAP_DATA}", "/var/snap/microk8s/current"),
        ("${SNAPSHOTTER}", "overlayfs"),
        ("${RUNTIME_TYPE}", "io.containerd.runc.v2"),
        ("${RUNTIME}", "runc"),
    ] {
        t = t.replace(var, value);
    }
    assert!(!t.contains("${"), "a placeholder is left: {t}");
    t.into_bytes()
}

/// Every golden add case that writes the main file, so every form of every table on the path
/// to the runtimes (header, dotted keys, inline tables, their mixes) and the runc kept for 1.x.
fn golden_adds() -> Vec<GoldenAdd> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/containerd");
    let mut dirs: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dirs.sort();
    let mut out = Vec::new();
    for d in dirs {
        let Ok(case) = std::fs::read(d.join("case.toml")) else {
            continue;
        };
        let case = parse_json(&case);
        let is_add = case["action"] == "add" && case.get("error").is_none();
        if !is_add || d.join("dropins").exists() || d.join("expected-dropins").exists() {
            continue;
        }
        let mut input = std::fs::read(d.join("input.toml")).unwrap();
        let mut expected = std::fs::read(d.join("expected.toml")).unwrap();
        if input == expected {
            continue;
        }
        // microk8s's template: containerd reads what the snap renders from it with sed
        if case["main"]
            .as_str()
            .is_some_and(|m| m.ends_with("args/containerd-template.toml"))
        {
            input = render_microk8s(&input);
            expected = render_microk8s(&expected);
        }
        let mut want = serde_json::Map::new();
        for k in ["runtime_type", "runtime_path", "options", "pod_annotations"] {
            if let Some(v) = case.get(k) {
                want.insert(k.into(), v.clone());
            }
        }
        out.push(GoldenAdd {
            name: d.file_name().unwrap().to_string_lossy().into_owned(),
            input,
            expected,
            handler: case["handler"].as_str().unwrap().to_string(),
            want: Json::Object(want),
        });
    }
    assert!(out.len() >= 40, "only {} golden add cases", out.len());
    out
}

/// containerd's view of the golden output: every handler of the input unchanged, and the new
/// handler with the case's runtime type, path, options and pod annotations.
fn check_golden_readback(
    g: &GoldenAdd,
    bin: &str,
    before: &serde_json::Map<String, Json>,
    after: &serde_json::Map<String, Json>,
) {
    let name = &g.name;
    // (a `replace` case rewrites the handler itself)
    for (h, v) in before.iter().filter(|(h, _)| **h != g.handler) {
        assert_eq!(
            after.get(h).map(zero_options_unset),
            Some(zero_options_unset(v)),
            "{name} ({bin}): handler {h} changed or vanished"
        );
    }
    let new = after
        .get(&g.handler)
        .unwrap_or_else(|| panic!("{name} ({bin}): no handler {}: {after:?}", g.handler));
    for (k, v) in g.want.as_object().into_iter().flatten() {
        assert_eq!(new.get(k), Some(v), "{name} ({bin}): {k} of {}", g.handler);
    }
}

#[test]
#[ignore = "needs a containerd 1.x binary in SHIM_AGENT_CONTAINERD_BIN"]
fn containerd_1x_reads_every_golden_output_of_version_1_and_2() {
    let bin = std::env::var("SHIM_AGENT_CONTAINERD_BIN").expect("set SHIM_AGENT_CONTAINERD_BIN");
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for g in golden_adds() {
        if version_of(&parse_json(&g.input)) > 2 {
            continue;
        }
        let (default_before, before) = dump(&bin, tmp.path(), &g.input)
            .unwrap_or_else(|e| panic!("{}: {bin} refuses the input: {e}", g.name));
        let (default_after, after) = dump(&bin, tmp.path(), &g.expected)
            .unwrap_or_else(|e| panic!("{}: {bin} refuses the output: {e}", g.name));
        assert_eq!(default_before, default_after, "{}: default runtime", g.name);
        check_golden_readback(&g, &bin, &before, &after);
        let default = default_after.as_str().unwrap_or("runc");
        assert!(
            after.contains_key(default),
            "{}: default runtime {default} missing: {after:?}",
            g.name
        );
        checked.push(g.name);
    }
    eprintln!("checked with {bin}: {checked:#?}");
    assert!(checked.len() >= 25, "only {} files checked", checked.len());
}

#[test]
#[ignore = "needs containerd 2.x binaries in SHIM_AGENT_CONTAINERD2_BINS"]
fn containerd_2x_reads_every_golden_output() {
    let bins =
        std::env::var("SHIM_AGENT_CONTAINERD2_BINS").expect("set SHIM_AGENT_CONTAINERD2_BINS");
    let tmp = tempfile::tempdir().unwrap();
    let mut checked = Vec::new();
    for bin in bins.split(':') {
        // containerd 2.x ignores the `plugins.cri` section of a version 1 file, whatever its
        // form ("Ignoring unknown key in TOML for plugin"): not its to read
        for g in golden_adds()
            .into_iter()
            .filter(|g| version_of(&parse_json(&g.input)) >= 2)
        {
            // a version this binary refuses (2.2 and version 4) is not its to read
            let Ok(before) = dump_2x(bin, tmp.path(), &g.input) else {
                assert!(
                    version_of(&parse_json(&g.input)) >= 4,
                    "{}: {bin} refuses the input",
                    g.name
                );
                continue;
            };
            let after = dump_2x(bin, tmp.path(), &g.expected)
                .unwrap_or_else(|e| panic!("{}: {bin} refuses the output: {e}", g.name));
            check_golden_readback(&g, bin, &before, &after);
            checked.push(format!(
                "{} ({})",
                g.name,
                bin.rsplit('/').next().unwrap_or(bin)
            ));
        }
    }
    eprintln!("checked: {checked:#?}");
    assert!(checked.len() >= 40, "only {} checked", checked.len());
}
