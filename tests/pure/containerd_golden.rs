//! Golden scenarios: `tests/fixtures/containerd/<case>/` holds `case.toml` (the action),
//! `input.toml` (the main file), optional `dropins/` (files of the drop-in dir), and the
//! expected `expected.toml` and `expected-dropins/`. Each case runs through the real shell
//! (`load`, `plan_*`, `apply`) on a temporary host root. `UPDATE_GOLDEN=1` rewrites the
//! expected files (review every one by eye: it must be what containerd needs).
//!
//! An `add` case is also removed again and must give back the input bytes exactly; a
//! `replace` case's handler must be removable (the rewrite marks it as the agent's); an error
//! case must leave every file untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use shim_agent::containerd::{
    AddOptions, DropinPolicy, RuntimeSpec, apply, load, plan_add, plan_remove,
};
use shim_agent::hostroot::HostRoot;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    /// "add" or "remove".
    action: String,
    handler: String,
    #[serde(default)]
    runtime_type: Option<String>,
    #[serde(default)]
    runtime_path: Option<String>,
    #[serde(default)]
    options: serde_json::Map<String, serde_json::Value>,
    #[serde(default)]
    pod_annotations: Vec<String>,
    #[serde(default)]
    privileged_without_host_devices: bool,
    #[serde(default)]
    replace: bool,
    /// "auto" (default), "never", or a directory.
    #[serde(default)]
    dropin: Option<String>,
    /// Host path of the main file.
    #[serde(default = "default_main")]
    main: String,
    /// Host directory the files of `dropins/` are placed in.
    #[serde(default = "default_dropin_dir")]
    dropin_dir: String,
    /// Expected error reason.
    #[serde(default)]
    error: Option<String>,
    /// Skip the remove-after-add check (e.g. `replace` of a user handler).
    #[serde(default)]
    no_round_trip: bool,
}

fn default_main() -> String {
    "/etc/containerd/config.toml".into()
}
fn default_dropin_dir() -> String {
    "/etc/containerd/conf.d".into()
}

fn read_tree(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut m = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd {
            let e = e.unwrap();
            m.insert(
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            );
        }
    }
    m
}

fn write_tree(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    let _ = std::fs::remove_dir_all(dir);
    if !files.is_empty() {
        std::fs::create_dir_all(dir).unwrap();
        for (n, b) in files {
            std::fs::write(dir.join(n), b).unwrap();
        }
    }
}

fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_case(dir: &Path) -> Result<(), String> {
    let case: Case = toml_edit::de::from_slice(&std::fs::read(dir.join("case.toml")).unwrap())
        .map_err(|e| format!("case.toml: {e}"))?;
    let input = std::fs::read(dir.join("input.toml")).unwrap();
    let dropins_in = read_tree(&dir.join("dropins"));
    let tmp = tempfile::tempdir().unwrap();
    let root = HostRoot::new(tmp.path()).unwrap();
    let main_local = root.resolve(&case.main).unwrap();
    std::fs::create_dir_all(main_local.parent().unwrap()).unwrap();
    std::fs::write(&main_local, &input).unwrap();
    let dd_local = root.resolve(&case.dropin_dir).unwrap();
    write_tree(&dd_local, &dropins_in);
    let policy = match case.dropin.as_deref() {
        None | Some("auto") => DropinPolicy::Auto,
        Some("never") => DropinPolicy::Never,
        Some(d) => DropinPolicy::Dir(PathBuf::from(d)),
    };
    let extra_dir = match &policy {
        DropinPolicy::Dir(d) => Some(d.clone()),
        _ => None,
    };
    let extra = extra_dir.as_deref();
    let main = Path::new(&case.main);
    let set = load(&root, main, extra).map_err(|e| e.to_string())?;
    let spec = RuntimeSpec {
        handler: case.handler.clone(),
        runtime_type: case.runtime_type.clone().unwrap_or_default(),
        runtime_path: case.runtime_path.clone(),
        options: case.options.clone(),
        pod_annotations: case.pod_annotations.clone(),
        privileged_without_host_devices: case.privileged_without_host_devices,
    };
    let opts = AddOptions {
        replace: case.replace,
        dropin: policy,
    };
    let plan = match case.action.as_str() {
        "add" => plan_add(&set, &spec, &opts),
        "remove" => plan_remove(&set, &case.handler),
        other => return Err(format!("unknown action {other}")),
    };
    if let Some(reason) = &case.error {
        let e = match plan {
            Ok(p) => return Err(format!("expected {reason}, got a plan: {p:?}")),
            Err(e) => e,
        };
        if e.reason() != reason {
            return Err(format!("expected {reason}, got {}: {e}", e.reason()));
        }
        let msg = e.to_string();
        let names_file = msg.contains(&case.main) || msg.contains(&case.dropin_dir);
        if !names_file && e.reason() != "InvalidHandlerName" {
            return Err(format!("message does not name the file: {e}"));
        }
        if std::fs::read(&main_local).unwrap() != input || read_tree(&dd_local) != dropins_in {
            return Err("a refused change modified files".into());
        }
        return Ok(());
    }
    let plan = plan.map_err(|e| format!("{}: {e}", e.reason()))?;
    let changed_something = !plan.is_empty();
    apply(&root, &plan).map_err(|e| e.to_string())?;
    let got_main = std::fs::read(&main_local).unwrap();
    let got_dropins = read_tree(&dd_local);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(dir.join("expected.toml"), &got_main).unwrap();
        write_tree(&dir.join("expected-dropins"), &got_dropins);
    }
    let want_main =
        std::fs::read(dir.join("expected.toml")).map_err(|e| format!("expected.toml: {e}"))?;
    if got_main != want_main {
        return Err(format!(
            "main differs; got:\n{}\nwant:\n{}",
            show(&got_main),
            show(&want_main)
        ));
    }
    if got_dropins != read_tree(&dir.join("expected-dropins")) {
        return Err(format!("drop-ins differ; got {:?}", got_dropins.keys()));
    }
    if case.action == "add" && case.replace {
        // a replaced handler is the agent's: removal takes it out
        let set = load(&root, main, extra).map_err(|e| e.to_string())?;
        let plan = plan_remove(&set, &case.handler).map_err(|e| format!("after replace: {e}"))?;
        let after = plan.changes.first().and_then(|c| c.after.clone());
        let after = after.ok_or("after replace: removal planned nothing")?;
        let text = String::from_utf8_lossy(&after);
        let doc: toml_edit::DocumentMut = text.parse().map_err(|e| format!("{e}"))?;
        let still = [
            "cri",
            "io.containerd.grpc.v1.cri",
            "io.containerd.cri.v1.runtime",
        ]
        .iter()
        .any(|id| {
            doc.get("plugins")
                .and_then(|p| p.get(id))
                .and_then(|p| p.get("containerd"))
                .and_then(|c| c.get("runtimes"))
                .and_then(|r| r.get(&case.handler))
                .is_some()
        });
        if still {
            return Err(format!("after replace, removal left the handler:\n{text}"));
        }
    }
    if case.action == "add" && changed_something && !case.no_round_trip {
        let set = load(&root, main, extra).map_err(|e| e.to_string())?;
        let again = plan_add(&set, &spec, &opts).map_err(|e| e.to_string())?;
        if !again.is_empty() {
            return Err(format!("second add is not a no-op: {again:?}"));
        }
        let plan = plan_remove(&set, &case.handler).map_err(|e| e.to_string())?;
        apply(&root, &plan).map_err(|e| e.to_string())?;
        if std::fs::read(&main_local).unwrap() != input {
            return Err(format!(
                "remove did not restore the input; got:\n{}",
                show(&std::fs::read(&main_local).unwrap())
            ));
        }
        if read_tree(&dd_local) != dropins_in {
            return Err("remove did not restore the drop-in dir".into());
        }
    }
    Ok(())
}

#[test]
fn golden_scenarios() {
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/containerd");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.toml").exists())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 20,
        "expected the golden cases in {}",
        base.display()
    );
    let failures: Vec<String> = dirs
        .iter()
        .filter_map(|d| run_case(d).err().map(|e| format!("{}: {e}", d.display())))
        .collect();
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
