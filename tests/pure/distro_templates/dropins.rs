//! k3s and rke2 drop-in directories (`src/containerd/template.rs`, "Drop-ins first"): where the
//! rendered config imports `config-v3.toml.d/*.toml` beside it, the handler goes there as a
//! drop-in; elsewhere into the template, as before.
//!
//! Golden cases live in `tests/fixtures/dropins/<case>/`: `case.toml` (the action), `input/`
//! (the host files under the root) and `expected/` (the host files afterwards; absent for a
//! refusal, which writes nothing). A directory holding only `.fixture-empty` stands for an
//! empty directory. The whole tree is compared, directories included. Every add is removed
//! again and must give back the input tree: the same bytes, and a directory the agent created
//! gone. `UPDATE_GOLDEN=1` rewrites the expected trees (review them).
//!
//! What k3s renders is simulated: no k3s binary can be had here. The rendered `config.toml`
//! files follow k3s's `ContainerdConfigTemplateV3` (`pkg/agent/templates/templates.go`) with
//! the values of `k3s-v1.29-config-v2-rendered.toml` in the shared corpus moved to config
//! version 3, as containerd 2.x names its plugins. The `imports` line is the one k3s-io/k3s
//! PR 13680 added to the base templates, `imports = ["{{ .NodeConfig.Containerd.Template
//! }}/config-v3.toml.d/*.toml"]` (`config.toml.d` for version 2), right after `version`, as
//! rendered files posted from k3s v1.35/v1.36 nodes show it; rke2 renders the same template
//! with its own paths. A real containerd reads the results in
//! `k3s_rendered_configs_with_dropins_are_read_by_real_containerd`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use shim_agent::containerd::template::{BASE_LINE, DIR_MARK};
use shim_agent::containerd::{self, Current, Layout, Plan, RuntimeSpec};
use shim_agent::hostroot::HostRoot;

use super::spec;

/// Stands for an empty directory in a fixture tree (git keeps no empty directories).
const EMPTY: &str = ".fixture-empty";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    action: String,
    handler: String,
    #[serde(default = "default_distro")]
    distro: String,
    #[serde(default)]
    replace: bool,
    /// Another `runtime_type` than the test spec's (an upgrade).
    #[serde(default)]
    runtime_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

fn default_distro() -> String {
    "k3s".into()
}

/// A tree as compared: relative paths of directories (`None`) and files (their bytes).
type Tree = BTreeMap<PathBuf, Option<Vec<u8>>>;

/// The tree under `dir`; a fixture's `.fixture-empty` files only mark their directory.
fn read_tree(dir: &Path) -> Tree {
    fn walk(base: &Path, dir: &Path, out: &mut Tree) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(base).unwrap().to_path_buf();
            if p.is_dir() {
                out.insert(rel, None);
                walk(base, &p, out);
            } else if p.file_name().is_some_and(|n| n != EMPTY) {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Tree::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out
}

fn write_tree(dir: &Path, tree: &Tree) {
    for (rel, content) in tree {
        let p = dir.join(rel);
        match content {
            None => std::fs::create_dir_all(&p).unwrap(),
            Some(b) => {
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(&p, b).unwrap();
            }
        }
    }
}

/// Rewrite `dir` as `tree`, marking empty directories for git.
fn save_tree(dir: &Path, tree: &Tree) {
    let _ = std::fs::remove_dir_all(dir);
    write_tree(dir, tree);
    for (rel, content) in tree {
        let p = dir.join(rel);
        if content.is_none() && std::fs::read_dir(&p).unwrap().next().is_none() {
            std::fs::write(p.join(EMPTY), b"").unwrap();
        }
    }
}

fn show(tree: &Tree) -> String {
    tree.iter()
        .map(|(p, c)| match c {
            None => format!("{}/\n", p.display()),
            Some(b) => format!("{}:\n{}\n", p.display(), String::from_utf8_lossy(b)),
        })
        .collect()
}

fn layout(distro: &str) -> Layout {
    Layout::GoTemplate {
        rendered: PathBuf::from(format!(
            "/var/lib/rancher/{distro}/agent/etc/containerd/config.toml"
        )),
        base: true,
    }
}

fn plan(root: &HostRoot, case: &Case, s: &RuntimeSpec) -> Result<Plan, containerd::ConfigError> {
    let current = layout(&case.distro).load(root)?;
    match case.action.as_str() {
        "add" => current.plan_add(
            s,
            &containerd::AddOptions {
                replace: case.replace,
                ..Default::default()
            },
        ),
        "remove" => current.plan_remove(&case.handler),
        other => panic!("unknown action {other}"),
    }
}

fn run_case(dir: &Path) -> Result<(), String> {
    let case: Case = toml_edit::de::from_slice(&std::fs::read(dir.join("case.toml")).unwrap())
        .map_err(|e| format!("case.toml: {e}"))?;
    let input = read_tree(&dir.join("input"));
    let d = tempfile::tempdir().unwrap();
    write_tree(d.path(), &input);
    let root = HostRoot::new(d.path()).unwrap();
    let mut s = spec(&case.handler);
    if let Some(t) = &case.runtime_type {
        s.runtime_type = t.clone();
    }
    let p = plan(&root, &case, &s);
    if let Some(reason) = &case.error {
        return match p {
            Ok(p) => Err(format!("expected {reason}, got {p:?}")),
            Err(e) if e.reason() == reason => {
                let m = e.to_string();
                (m.contains("/var/lib/rancher/") && m.contains(&case.handler))
                    .then_some(())
                    .ok_or(format!("the error names neither file nor handler: {m}"))
            }
            Err(e) => Err(format!("expected {reason}, got {}: {e}", e.reason())),
        };
    }
    let p = p.map_err(|e| e.to_string())?;
    containerd::apply(&root, &p).map_err(|e| e.to_string())?;
    let got = read_tree(d.path());
    let expected_dir = dir.join("expected");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        save_tree(&expected_dir, &got);
    }
    let expected = read_tree(&expected_dir);
    if got != expected {
        return Err(format!(
            "tree differs:\n--- got\n{}\n--- expected\n{}",
            show(&got),
            show(&expected)
        ));
    }
    let rendered = |t: &Tree| {
        t.iter()
            .find(|(p, _)| p.ends_with("containerd/config.toml"))
            .and_then(|(_, b)| b.clone())
    };
    if rendered(&got) != rendered(&input) {
        return Err("the rendered config.toml was changed".into());
    }
    if case.action == "add" && !case.replace {
        let again = plan(&root, &case, &s).map_err(|e| e.to_string())?;
        if !again.is_empty() {
            return Err(format!("a second add changes files again: {again:?}"));
        }
        let current = layout(&case.distro)
            .load(&root)
            .map_err(|e| e.to_string())?;
        if !current.handlers().unwrap().contains(&case.handler) {
            return Err("the handler is not among those containerd will serve".into());
        }
        let back = current
            .plan_remove(&case.handler)
            .map_err(|e| e.to_string())?;
        containerd::apply(&root, &back).map_err(|e| e.to_string())?;
        let after_remove = read_tree(d.path());
        if after_remove != input {
            return Err(format!(
                "removing the handler does not give back the input tree:\n{}",
                show(&after_remove)
            ));
        }
    }
    Ok(())
}

#[test]
fn golden_dropin_cases() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dropins");
    let mut failures = Vec::new();
    let mut n = 0;
    for e in std::fs::read_dir(&root).unwrap() {
        let dir = e.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        n += 1;
        if let Err(msg) = run_case(&dir) {
            failures.push(format!("{}: {msg}", dir.display()));
        }
    }
    assert!(n >= 10, "only {n} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// A root holding the input tree of the golden case `name`.
fn case_root(name: &str) -> (tempfile::TempDir, HostRoot) {
    let input = read_tree(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/dropins")
            .join(name)
            .join("input"),
    );
    let d = tempfile::tempdir().unwrap();
    write_tree(d.path(), &input);
    let root = HostRoot::new(d.path()).unwrap();
    (d, root)
}

const K3S_DIR: &str = "/var/lib/rancher/k3s/agent/etc/containerd";

#[test]
fn the_directory_the_agent_made_goes_with_its_last_dropin_in_any_order() {
    let (d, root) = case_root("k3s-imports-new-dir-gets-a-dropin");
    let before = read_tree(d.path());
    let opts = containerd::AddOptions::default();
    let mut current = layout("k3s").load(&root).unwrap();
    // two handlers in one transaction: one view moved on by each plan, as the engine does
    let mut plans = Vec::new();
    for h in ["a-demo", "b-demo"] {
        let p = current.plan_add(&spec(h), &opts).unwrap();
        current.update(&p);
        plans.push(p);
    }
    for p in &plans {
        containerd::apply(&root, p).unwrap();
    }
    let dir = root.resolve(format!("{K3S_DIR}/config-v3.toml.d")).unwrap();
    for h in ["a-demo", "b-demo"] {
        let text = std::fs::read_to_string(dir.join(format!("shim-agent-{h}.toml"))).unwrap();
        assert!(text.starts_with(DIR_MARK), "{h}: {text}");
    }
    // the first one removed leaves the directory to the second
    let current = layout("k3s").load(&root).unwrap();
    let p = current.plan_remove("b-demo").unwrap();
    containerd::apply(&root, &p).unwrap();
    assert!(dir.is_dir());
    let current = layout("k3s").load(&root).unwrap();
    let p = current.plan_remove("a-demo").unwrap();
    assert_eq!(
        p.remove_empty_dirs,
        [PathBuf::from(format!("{K3S_DIR}/config-v3.toml.d"))]
    );
    containerd::apply(&root, &p).unwrap();
    assert_eq!(read_tree(d.path()), before);
}

#[test]
fn a_file_the_owner_put_in_the_agents_directory_keeps_it() {
    let (d, root) = case_root("k3s-imports-new-dir-gets-a-dropin");
    let current = layout("k3s").load(&root).unwrap();
    let p = current
        .plan_add(&spec("wasm-demo"), &Default::default())
        .unwrap();
    containerd::apply(&root, &p).unwrap();
    let dir = root.resolve(format!("{K3S_DIR}/config-v3.toml.d")).unwrap();
    std::fs::write(dir.join("20-debug.toml"), "[debug]\n  level = \"debug\"\n").unwrap();
    let current = layout("k3s").load(&root).unwrap();
    let p = current.plan_remove("wasm-demo").unwrap();
    containerd::apply(&root, &p).unwrap();
    let left: Vec<_> = read_tree(d.path())
        .into_keys()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("config-v3.toml.d")))
        .collect();
    assert_eq!(
        left,
        [PathBuf::from(
            "var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.d/20-debug.toml"
        )]
    );
}

#[test]
fn removing_and_adding_in_one_batch_keeps_the_directory_the_agent_owns() {
    let (d, root) = case_root("k3s-imports-new-dir-gets-a-dropin");
    let opts = containerd::AddOptions::default();
    let current = layout("k3s").load(&root).unwrap();
    containerd::apply(&root, &current.plan_add(&spec("a-demo"), &opts).unwrap()).unwrap();
    // one transaction: a-demo goes, b-demo comes; b-demo's drop-in takes over the mark
    let mut current = layout("k3s").load(&root).unwrap();
    let p1 = current.plan_remove("a-demo").unwrap();
    current.update(&p1);
    let p2 = current.plan_add(&spec("b-demo"), &opts).unwrap();
    // applied as the engine combines a batch: every file change, then the directories
    let batch = Plan {
        changes: p1.changes.iter().chain(&p2.changes).cloned().collect(),
        remove_empty_dirs: p1.remove_empty_dirs.clone(),
    };
    assert!(!batch.remove_empty_dirs.is_empty());
    containerd::apply(&root, &batch).unwrap();
    let dir = root.resolve(format!("{K3S_DIR}/config-v3.toml.d")).unwrap();
    let text = std::fs::read_to_string(dir.join("shim-agent-b-demo.toml")).unwrap();
    assert!(text.starts_with(DIR_MARK), "{text}");
    let current = layout("k3s").load(&root).unwrap();
    containerd::apply(&root, &current.plan_remove("b-demo").unwrap()).unwrap();
    assert!(!dir.exists());
    assert!(d.path().join(&K3S_DIR[1..]).join("config.toml").exists());
}

#[test]
fn an_import_is_recognised_however_it_is_written() {
    let dir = "/var/lib/rancher/k3s/agent/etc/containerd";
    for imports in [
        format!("imports = ['{dir}/config-v3.toml.d/*.toml']"),
        "imports = [\"config-v3.toml.d/*.toml\"]".to_string(),
        format!("imports = [\"/etc/containerd/conf.d/*.toml\", \"{dir}/config-v3.toml.d/*\"]"),
        format!("imports = [\"{dir}/config.toml.d/*.toml\"]"),
    ] {
        let rendered = containerd::ConfigFile {
            host_path: PathBuf::from(format!("{dir}/config.toml")),
            bytes: format!("version = 3\n{imports}\n").into_bytes(),
        };
        let got = containerd::template::imported_dropin_dir(&rendered).unwrap();
        assert!(
            got.as_ref()
                .is_some_and(|d| d.parent() == Some(Path::new(dir))),
            "{imports}: {got:?}"
        );
    }
    for (version, imports) in [
        // another directory, a single file, no glob, version 2
        (
            3,
            "imports = [\"/etc/containerd/conf.d/*.toml\"]".to_string(),
        ),
        (
            3,
            format!("imports = [\"{dir}/config-v3.toml.d/extra.toml\"]"),
        ),
        (3, String::new()),
        (2, format!("imports = [\"{dir}/config.toml.d/*.toml\"]")),
    ] {
        let rendered = containerd::ConfigFile {
            host_path: PathBuf::from(format!("{dir}/config.toml")),
            bytes: format!("version = {version}\n{imports}\n").into_bytes(),
        };
        assert_eq!(
            containerd::template::imported_dropin_dir(&rendered).unwrap(),
            None,
            "version {version}, {imports}"
        );
    }
}

#[test]
fn with_the_import_a_dropin_is_written_and_no_template() {
    let (_d, root) = case_root("k3s-imports-new-dir-gets-a-dropin");
    let Current::GoTemplate(t) = layout("k3s").load(&root).unwrap() else {
        panic!("a template layout")
    };
    let d = t
        .dropins
        .as_ref()
        .expect("the rendered file imports the directory");
    assert!(d.dir.ends_with("config-v3.toml.d") && !d.dir_exists);
    let p = t.plan_add(&spec("wasm-demo"), false).unwrap();
    assert_eq!(p.changes.len(), 1);
    assert_eq!(p.changes[0].before, None);
    assert!(
        p.changes[0]
            .host_path
            .ends_with("config-v3.toml.d/shim-agent-wasm-demo.toml")
    );
    let text = String::from_utf8(p.changes[0].after.clone().unwrap()).unwrap();
    assert!(
        text.contains("version = 3\n") && !text.contains(BASE_LINE),
        "{text}"
    );
}

/// `BIN --config F config dump` of a root's rendered file succeeds and lists `handler` with
/// `want` as its runtime_type, and runc as k3s rendered it.
fn containerd_reads(bin: &str, root: &Path, rendered: &str, handler: &str, want: &str) {
    // the rendered file names its drop-in directory by host path: point it into the root
    let f = root.join(rendered.trim_start_matches('/'));
    let text = std::fs::read_to_string(&f).unwrap();
    let moved = text.replace(
        "\"/var/lib/rancher/",
        &format!("\"{}/var/lib/rancher/", root.display()),
    );
    let g = f.with_file_name("config-for-dump.toml");
    std::fs::write(&g, moved).unwrap();
    let out = std::process::Command::new(bin)
        .arg("--config")
        .arg(&g)
        .args(["config", "dump"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{bin}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: toml_edit::DocumentMut = stdout.parse().unwrap();
    let runtimes = &doc["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"];
    let rt = runtimes[handler]["runtime_type"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(rt, want, "{bin} reads handler {handler}:\n{stdout}");
    assert_eq!(
        runtimes["runc"]["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "{bin}: runc as k3s rendered it, deep-merged"
    );
    std::fs::remove_file(&g).unwrap();
}

#[test]
#[ignore = "needs containerd builds: SHIM_AGENT_CONTAINERD_BUILDS=DIR (scripts/test sets it)"]
fn k3s_rendered_configs_with_dropins_are_read_by_real_containerd() {
    let bins = std::env::var("SHIM_AGENT_CONTAINERD_BUILDS")
        .expect("SHIM_AGENT_CONTAINERD_BUILDS: directory of containerd-vX.Y.Z binaries");
    for (case, distro) in [
        ("k3s-imports-new-dir-gets-a-dropin", "k3s"),
        ("k3s-imports-dropin-beside-the-owners", "k3s"),
        ("k3s-imports-owners-base-template-untouched", "k3s"),
        ("rke2-imports-new-dir-gets-a-dropin", "rke2"),
    ] {
        let (d, root) = case_root(case);
        let s = spec("wasm-demo");
        let current = layout(distro).load(&root).unwrap();
        let p = current.plan_add(&s, &Default::default()).unwrap();
        assert!(
            p.changes
                .iter()
                .all(|c| c.host_path.to_string_lossy().contains(".toml.d/")),
            "{case}: only a drop-in is written: {p:?}"
        );
        containerd::apply(&root, &p).unwrap();
        let rendered = format!("/var/lib/rancher/{distro}/agent/etc/containerd/config.toml");
        for v in ["2.2.7", "2.3.4"] {
            containerd_reads(
                &format!("{bins}/containerd-v{v}"),
                d.path(),
                &rendered,
                "wasm-demo",
                &s.runtime_type,
            );
        }
    }
}
