//! k3s and rke2 config templates (`src/containerd/template.rs`): the handler goes into
//! `config.toml.tmpl` / `config-v3.toml.tmpl`, never into the rendered `config.toml`.
//!
//! Golden cases live in `tests/fixtures/templates/<case>/`: `case.toml` (the action),
//! `rendered.toml` (what the distro rendered last), optional `template.tmpl` (an existing
//! template) and `expected.tmpl` (the template afterwards; absent: deleted or not created).
//! `UPDATE_GOLDEN=1` rewrites the expected files (review them). Every add is removed again
//! and must give back the template's bytes (or no file). Properties cover any template text.
//!
//! What k3s renders is simulated the only way that matters here: the base template is the
//! rendered file itself, and the agent's blocks are plain TOML without template actions, so
//! they render as they are. A real containerd reads that result in
//! `k3s_rendered_configs_are_read_by_real_containerd` (ignored by default; scripts/test runs
//! it with the containerd builds of the versions k3s ships).

mod dropins;

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use serde::Deserialize;
use shim_agent::containerd::template::{self, BASE_LINE, CREATED_MARK, TemplateSet};
use shim_agent::containerd::{ConfigFile, Current, Layout, RuntimeSpec};
use shim_agent::hostroot::HostRoot;

use crate::support::containerd::test_spec;

const K3S_DIR: &str = "/var/lib/rancher/k3s/agent/etc/containerd";
const CORPUS: &str = "../shared/containerd-configs";

fn corpus(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(CORPUS)
            .join(name),
    )
    .expect("shared corpus next to the repo")
}

fn set(rendered: &[u8], template: Option<&[u8]>, base: bool, tmpl_name: &str) -> TemplateSet {
    TemplateSet {
        rendered: ConfigFile {
            host_path: PathBuf::from(format!("{K3S_DIR}/config.toml")),
            bytes: rendered.to_vec(),
        },
        template: (
            PathBuf::from(format!("{K3S_DIR}/{tmpl_name}")),
            template.map(<[u8]>::to_vec),
        ),
        base,
        by: "k3s".into(),
        dropins: None,
    }
}

fn spec(handler: &str) -> RuntimeSpec {
    let mut s = test_spec(handler);
    s.runtime_type = format!("/opt/shim-agent/shims/{handler}/abc/containerd-shim-{handler}-v2");
    s.runtime_path = None;
    s
}

/// The template after a plan (None: no file).
fn after(t: &TemplateSet, plan: &shim_agent::containerd::Plan) -> Option<Vec<u8>> {
    let mut t = t.clone();
    t.update(plan);
    t.template.1
}

/// What k3s renders from `template` over the base it rendered before (`base_rendered`).
fn render(base_rendered: &[u8], template: Option<&[u8]>) -> Vec<u8> {
    let Some(t) = template else {
        return base_rendered.to_vec();
    };
    let t = String::from_utf8_lossy(t);
    assert!(
        t.contains(BASE_LINE),
        "only base templates are rendered here"
    );
    t.replace(BASE_LINE, &String::from_utf8_lossy(base_rendered))
        .into_bytes()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    action: String,
    handler: String,
    #[serde(default)]
    base: Option<bool>,
    #[serde(default)]
    replace: bool,
    #[serde(default = "default_tmpl")]
    template_name: String,
    #[serde(default)]
    error: Option<String>,
}

fn default_tmpl() -> String {
    "config.toml.tmpl".into()
}

fn run_case(dir: &Path) -> Result<(), String> {
    let case: Case = toml_edit::de::from_slice(&std::fs::read(dir.join("case.toml")).unwrap())
        .map_err(|e| format!("case.toml: {e}"))?;
    let rendered = std::fs::read(dir.join("rendered.toml")).unwrap();
    let existing = std::fs::read(dir.join("template.tmpl")).ok();
    let t = set(
        &rendered,
        existing.as_deref(),
        case.base.unwrap_or(true),
        &case.template_name,
    );
    let s = spec(&case.handler);
    let plan = match case.action.as_str() {
        "add" => t.plan_add(&s, case.replace),
        "remove" => t.plan_remove(&case.handler),
        other => return Err(format!("unknown action {other}")),
    };
    if let Some(reason) = &case.error {
        return match plan {
            Ok(p) => Err(format!("expected {reason}, got {p:?}")),
            Err(e) if e.reason() == reason => {
                let m = e.to_string();
                (m.contains(K3S_DIR) && m.contains(&case.handler))
                    .then_some(())
                    .ok_or(format!("the error names neither file nor handler: {m}"))
            }
            Err(e) => Err(format!("expected {reason}, got {}: {e}", e.reason())),
        };
    }
    let plan = plan.map_err(|e| e.to_string())?;
    let got = after(&t, &plan);
    let expected_path = dir.join("expected.tmpl");
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        match &got {
            Some(b) => std::fs::write(&expected_path, b).unwrap(),
            None => {
                let _ = std::fs::remove_file(&expected_path);
            }
        }
    }
    let expected = std::fs::read(&expected_path).ok();
    if got != expected {
        return Err(format!(
            "template differs:\n--- got\n{}\n--- expected\n{}",
            String::from_utf8_lossy(got.as_deref().unwrap_or(b"(none)")),
            String::from_utf8_lossy(expected.as_deref().unwrap_or(b"(none)"))
        ));
    }
    if case.action == "add" && !case.replace {
        let mut t2 = t.clone();
        t2.update(&plan);
        let again = t2.plan_add(&s, false).map_err(|e| e.to_string())?;
        if !again.is_empty() {
            return Err("a second add changes the template again".into());
        }
        let back = after(
            &t2,
            &t2.plan_remove(&case.handler).map_err(|e| e.to_string())?,
        );
        if back != existing {
            return Err("removing the handler does not give back the template".into());
        }
    }
    Ok(())
}

#[test]
fn golden_template_cases() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/templates");
    let mut failures = Vec::new();
    let mut n = 0;
    for e in std::fs::read_dir(&root).unwrap() {
        let dir = e.unwrap().path();
        n += 1;
        if let Err(msg) = run_case(&dir) {
            failures.push(format!("{}: {msg}", dir.display()));
        }
    }
    assert!(n >= 6, "only {n} cases");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn a_new_template_starts_from_the_base_and_goes_with_its_last_handler() {
    let rendered = corpus("k3s-v1.29-config-v2-rendered.toml");
    let t = set(&rendered, None, true, "config.toml.tmpl");
    let a = spec("wasmtime-demo");
    let b = spec("slight-demo");
    let p1 = t.plan_add(&a, false).unwrap();
    assert_eq!(p1.changes[0].before, None, "created");
    let mut t1 = t.clone();
    t1.update(&p1);
    let text = String::from_utf8(t1.template.1.clone().unwrap()).unwrap();
    assert!(
        text.starts_with(&format!("{CREATED_MARK}\n{BASE_LINE}\n")),
        "{text}"
    );
    assert!(
        !text.contains("runc"),
        "the base stays the distro's: {text}"
    );

    // k3s renders it; a second handler goes beside the first
    t1.rendered.bytes = render(&rendered, t1.template.1.as_deref());
    let p2 = t1.plan_add(&b, false).unwrap();
    let mut t2 = t1.clone();
    t2.update(&p2);
    assert_eq!(
        t2.handlers()
            .unwrap()
            .into_iter()
            .filter(|h| h.ends_with("-demo"))
            .count(),
        2
    );
    // removing both, in any order, deletes the file the agent created
    let mut t3 = t2.clone();
    t3.update(&t2.plan_remove("wasmtime-demo").unwrap());
    assert!(t3.template.1.is_some());
    let last = t3.plan_remove("slight-demo").unwrap();
    assert_eq!(last.changes[0].after, None, "deleted with its last handler");
}

#[test]
fn a_handler_the_distro_already_defines_is_a_conflict_not_a_duplicate() {
    // k3s found containerd-shim-spin-v2 on its PATH and rendered a `spin` runtime itself
    let rendered = corpus("k3s-v1.29-config-v2-rendered.toml");
    let t = set(&rendered, None, true, "config.toml.tmpl");
    let e = t.plan_add(&spec("spin"), false).unwrap_err();
    assert_eq!(e.reason(), "HandlerConflict", "{e}");
    assert!(e.to_string().contains("config.toml"), "{e}");
    // and it is never removed as ours
    let e = t.plan_remove("spin").unwrap_err();
    assert_eq!(e.reason(), "NotOwned", "{e}");
}

#[test]
fn the_template_file_follows_the_containerd_version_k3s_renders() {
    let rendered = Path::new("/var/lib/rancher/k3s/agent/etc/containerd/config.toml");
    let none = |_: &Path| false;
    let v2 = shim_agent_version(2);
    let v3 = shim_agent_version(3);
    assert!(template::template_path(rendered, v2, none).ends_with("config.toml.tmpl"));
    assert!(template::template_path(rendered, v3, none).ends_with("config-v3.toml.tmpl"));
    // containerd 2.x k3s reads an existing config.toml.tmpl when there is no v3 one
    let only_v2 = |p: &Path| p.ends_with("config.toml.tmpl");
    assert!(template::template_path(rendered, v3, only_v2).ends_with("config.toml.tmpl"));
    let both = |_: &Path| true;
    assert!(template::template_path(rendered, v3, both).ends_with("config-v3.toml.tmpl"));
}

/// The config version of a rendered file with `version = n`.
fn shim_agent_version(n: i64) -> shim_agent::containerd::template::Version {
    let f = ConfigFile {
        host_path: PathBuf::from("/x/config.toml"),
        bytes: format!("version = {n}\n").into_bytes(),
    };
    template::rendered_version(&f).unwrap()
}

#[test]
fn layouts_load_what_the_distro_has_and_refuse_what_is_not_theirs() {
    let d = tempfile::tempdir().unwrap();
    let root = HostRoot::new(d.path()).unwrap();
    let layout = Layout::GoTemplate {
        rendered: PathBuf::from(format!("{K3S_DIR}/config.toml")),
        base: true,
    };
    // k3s never started: nothing to know the version from
    let e = layout.load(&root).unwrap_err();
    assert_eq!(e.reason(), "NotRendered");
    assert!(e.to_string().contains("start k3s once"), "{e}");

    let dir = root.resolve(K3S_DIR).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("config.toml"),
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
    )
    .unwrap();
    let Current::GoTemplate(t) = layout.load(&root).unwrap() else {
        panic!("a template layout")
    };
    assert!(t.template.0.ends_with("config-v3.toml.tmpl"));
    assert_eq!(t.template.1, None);
    let p = t.plan_add(&spec("spin"), false).unwrap();
    let text = String::from_utf8(p.changes[0].after.clone().unwrap()).unwrap();
    assert!(
        text.contains("[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.spin]"),
        "{text}"
    );

    let unsupported = Layout::Unsupported {
        profile: "containerd".into(),
        why: "Talos: …".into(),
    };
    let e = unsupported.load(&root).unwrap_err();
    assert_eq!(e.reason(), "UnsupportedSystem");
    assert!(e.to_string().contains("unsupported") && e.to_string().contains("Talos"));
}

#[test]
fn a_value_the_go_template_would_read_as_an_action_is_refused() {
    let rendered = corpus("k3s-v1.29-config-v2-rendered.toml");
    let t = set(&rendered, None, true, "config.toml.tmpl");
    let mut s = spec("demo");
    s.options
        .insert("ConfigPath".into(), serde_json::json!("{{ .NodeName }}"));
    let e = t.plan_add(&s, false).unwrap_err();
    assert_eq!(e.reason(), "InvalidRuntimeSpec");
    assert!(e.to_string().contains("Go template"), "{e}");
}

/// Templates as a node owner may have them: none, the base alone, k3s's own full template,
/// a derivative's, and any of them without a final newline.
fn any_template() -> impl Strategy<Value = Option<Vec<u8>>> {
    let full = corpus("k3s-v1.29-base-template-v2.toml.tmpl");
    let k8e = corpus("k8e-k3s-derivative-2026-template-v2.toml.tmpl");
    (
        prop_oneof![
            Just(None),
            Just(Some(format!("{BASE_LINE}\n").into_bytes())),
            Just(Some(format!("{BASE_LINE}\n# mine\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/x\"\n").into_bytes())),
            Just(Some(full)),
            Just(Some(k8e)),
        ],
        any::<bool>(),
    )
        .prop_map(|(t, strip_newline)| {
            t.map(|mut b| {
                if strip_newline {
                    while b.last() == Some(&b'\n') {
                        b.pop();
                    }
                }
                b
            })
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn add_is_idempotent_and_removal_gives_back_the_template(
        tmpl in any_template(),
        h1 in "[a-z][a-z0-9-]{0,10}-x",
        h2 in "[a-z][a-z0-9-]{0,10}-y",
        reverse in any::<bool>(),
        base in any::<bool>(),
    ) {
        let rendered = corpus("k3s-v1.29-config-v2-rendered.toml");
        let t0 = set(&rendered, tmpl.as_deref(), base, "config.toml.tmpl");
        let mut t = t0.clone();
        for h in [&h1, &h2] {
            let p = t.plan_add(&spec(h), false).unwrap();
            t.update(&p);
            prop_assert!(t.plan_add(&spec(h), false).unwrap().is_empty());
        }
        let order = if reverse { [&h2, &h1] } else { [&h1, &h2] };
        for h in order {
            let p = t.plan_remove(h).unwrap();
            t.update(&p);
        }
        prop_assert_eq!(t.template.1, t0.template.1);
    }
}

/// `BIN --config F config dump` succeeds and lists `handler` with its runtime_type.
fn containerd_reads(bin: &str, bytes: &[u8], plugin: &str, handler: &str, want: &str) {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("config.toml");
    std::fs::write(&f, bytes).unwrap();
    let out = std::process::Command::new(bin)
        .arg("--config")
        .arg(&f)
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
    let runtimes = &doc["plugins"][plugin]["containerd"]["runtimes"];
    let rt = runtimes[handler]["runtime_type"]
        .as_str()
        .unwrap_or_default();
    assert_eq!(rt, want, "{bin} reads handler {handler}");
    assert!(
        runtimes["runc"]["runtime_type"].as_str().is_some(),
        "{bin}: runc kept"
    );
}

#[test]
#[ignore = "needs containerd builds: SHIM_AGENT_CONTAINERD_BUILDS=DIR (scripts/test sets it)"]
fn k3s_rendered_configs_are_read_by_real_containerd() {
    let dir = std::env::var("SHIM_AGENT_CONTAINERD_BUILDS")
        .expect("SHIM_AGENT_CONTAINERD_BUILDS: directory of containerd-vX.Y.Z binaries");
    // k3s v1.29 ships containerd 1.7 and renders config version 2
    let rendered = corpus("k3s-v1.29-config-v2-rendered.toml");
    for tmpl in [None, Some(corpus("k3s-v1.29-base-template-v2.toml.tmpl"))] {
        let t = set(&rendered, tmpl.as_deref(), true, "config.toml.tmpl");
        let s = spec("wasmtime-demo");
        let p = t.plan_add(&s, false).unwrap();
        let new = after(&t, &p).unwrap();
        // the base template renders to what k3s rendered; a full template is rendered by
        // taking the rendered file and adding the blocks, as k3s would
        let out = if tmpl.is_none() {
            render(&rendered, Some(&new))
        } else {
            let mut r = rendered.clone();
            let tail = &new[tmpl.as_ref().map_or(0, Vec::len)..];
            r.extend_from_slice(tail);
            r
        };
        containerd_reads(
            &format!("{dir}/containerd-v1.7.34"),
            &out,
            "io.containerd.grpc.v1.cri",
            "wasmtime-demo",
            &s.runtime_type,
        );
    }
    // k3s with containerd 2.x renders version 3 into config-v3.toml.tmpl's output
    let rendered = corpus("containerd-2.2.7-config-default.toml");
    let t = set(&rendered, None, true, "config-v3.toml.tmpl");
    let s = spec("wasmtime-demo");
    let new = after(&t, &t.plan_add(&s, false).unwrap()).unwrap();
    for v in ["2.2.7", "2.3.4"] {
        containerd_reads(
            &format!("{dir}/containerd-v{v}"),
            &render(&rendered, Some(&new)),
            "io.containerd.cri.v1.runtime",
            "wasmtime-demo",
            &s.runtime_type,
        );
    }
}
