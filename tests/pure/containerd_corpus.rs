//! Every real config of `shared/containerd-configs/`: add then remove gives back the original
//! bytes, the handler lands at the right path with the right fields, every other table keeps
//! its parsed value, and the files the engine must refuse are refused for the right reason.

use std::path::{Path, PathBuf};

use shim_agent::containerd::{
    AddOptions, ConfigFile, ConfigSet, DropinPolicy, plan_add, plan_remove,
};

use crate::support::containerd::*;

fn corpus_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/containerd-configs");
    assert!(
        d.is_dir(),
        "corpus directory {} is missing: check out `shared/` next to the repository",
        d.display()
    );
    d
}

pub(crate) fn corpus_files() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "md"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    assert!(
        v.len() >= 44,
        "expected the 44 corpus configs, found {}",
        v.len()
    );
    v
}

const MAIN: &str = "/etc/containerd/config.toml";

/// Files the engine must refuse, with the host path they are read at and the reason.
pub(crate) const REFUSED: &[(&str, &str, &str)] = &[
    (
        "aks-node-controller-containerd1.toml.gtpl",
        MAIN,
        "TemplateFile",
    ),
    (
        "aks-node-controller-containerd2.toml.gtpl",
        MAIN,
        "TemplateFile",
    ),
    ("bottlerocket-basic-v2.toml.hbs", MAIN, "TemplateFile"),
    ("bottlerocket-k8s-nvidia-v2.toml.hbs", MAIN, "TemplateFile"),
    ("bottlerocket-k8s-v2.toml.hbs", MAIN, "TemplateFile"),
    ("eks-al2023-nodeadm-v2.toml.tmpl", MAIN, "TemplateFile"),
    ("eks-al2023-nodeadm-v3.toml.tmpl", MAIN, "TemplateFile"),
    (
        "gce-cos-configure-helper-v2.toml.heredoc",
        MAIN,
        "TemplateFile",
    ),
    (
        "image-builder-capi-containerd-config.toml.j2",
        MAIN,
        "TemplateFile",
    ),
    (
        "k3s-v1.24-template-v1-noversion.toml.tmpl",
        MAIN,
        "TemplateFile",
    ),
    ("k3s-v1.29-base-template-v2.toml.tmpl", MAIN, "TemplateFile"),
    (
        "k8e-k3s-derivative-2026-template-v2.toml.tmpl",
        MAIN,
        "TemplateFile",
    ),
    ("microk8s-containerd-template-v2.toml", MAIN, "TemplateFile"),
    (
        "docker-containerd.io-package-default-v1.toml",
        MAIN,
        "CriDisabled",
    ),
    ("talos-system-containerd-v3.toml", MAIN, "CriDisabled"),
    (
        "talos-cri-containerd-v3.toml",
        "/etc/cri/containerd.toml",
        "ReadOnlyLayout",
    ),
    ("talos-cri-containerd-v3.toml", MAIN, "ReadOnlyLayout"),
    (
        "talos-cri-plugin-00-base-v3.part.toml",
        "/etc/cri/conf.d/00-base.part",
        "ReadOnlyLayout",
    ),
    (
        "talos-generated-cri-registry-v3-testdata.toml",
        "/etc/cri/conf.d/cri.toml",
        "ReadOnlyLayout",
    ),
    (
        "talos-generated-cri-registry-v3-testdata.toml",
        MAIN,
        "MixedSchema",
    ),
    (
        "flatcar-sysext-v2.toml",
        "/usr/share/containerd/config.toml",
        "ReadOnlyLayout",
    ),
    (
        "flatcar-sysext-cgroupfs-v2.toml",
        "/usr/share/containerd/config-cgroupfs.toml",
        "ReadOnlyLayout",
    ),
    ("k3s-v1.29-config-v2-rendered.toml", MAIN, "GeneratedFile"),
    (
        "k3s-v1.24-config-v1-noversion-rendered.toml",
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "GeneratedFile",
    ),
    (
        "microk8s-containerd-v2-rendered.toml",
        "/var/snap/microk8s/current/args/containerd.toml",
        "GeneratedFile",
    ),
];

/// Files edited through a drop-in (version ≥ 3 with a glob import): the drop-in path.
const DROPIN: &[(&str, &str)] = &[
    (
        "containerd-2.2.7-config-default.toml",
        "/etc/containerd/conf.d/shim-agent-wasmtest.toml",
    ),
    (
        "containerd-2.3.4-config-default.toml",
        "/etc/containerd/conf.d/shim-agent-wasmtest.toml",
    ),
    (
        "eks-al2-v3.toml",
        "/etc/containerd/config.d/shim-agent-wasmtest.toml",
    ),
    (
        "image-builder-capi-containerd2-spin-v3-rendered.toml",
        "/etc/containerd/conf.d/shim-agent-wasmtest.toml",
    ),
    (
        "k0s-managed-containerd-v3-rendered.toml",
        "/etc/k0s/containerd.d/shim-agent-wasmtest.toml",
    ),
];

/// Every corpus config the engine edits (not one of [`REFUSED`]), as its file at the path it
/// has on a node.
pub(crate) fn editable_corpus_sets() -> Vec<(String, ConfigSet)> {
    corpus_files()
        .into_iter()
        .filter_map(|(name, bytes)| {
            let main_path = main_path_for(&name);
            let refused = REFUSED
                .iter()
                .any(|(n, h, _)| *n == name && *h == main_path);
            let set = ConfigSet {
                main: ConfigFile {
                    host_path: main_path.into(),
                    bytes,
                },
                dropins: vec![],
            };
            (!refused).then_some((name, set))
        })
        .collect()
}

pub(crate) fn main_path_for(name: &str) -> &'static str {
    if name.starts_with("k0s-") {
        "/etc/k0s/containerd.toml"
    } else {
        MAIN
    }
}

#[test]
fn refused_files_are_refused_for_their_reason_naming_the_file() {
    let files = corpus_files();
    for (name, host, reason) in REFUSED {
        let (_, bytes) = files.iter().find(|(n, _)| n == name).expect(name);
        let set = ConfigSet {
            main: ConfigFile {
                host_path: host.into(),
                bytes: bytes.clone(),
            },
            dropins: vec![],
        };
        let e = plan_add(&set, &test_spec("wasmtest"), &AddOptions::default())
            .expect_err(&format!("{name} at {host} must be refused"));
        assert_eq!(e.reason(), *reason, "{name} at {host}: {e}");
        assert!(
            e.to_string().contains(host),
            "{name}: message names the file: {e}"
        );
        let e = plan_remove(&set, "wasmtest").expect_err(name);
        assert_eq!(e.reason(), *reason, "remove {name}: {e}");
    }
}

#[test]
fn every_other_corpus_file_round_trips_add_then_remove() {
    let mut checked = 0;
    for (name, set) in editable_corpus_sets() {
        let dropin = DROPIN.iter().find(|(n, _)| *n == name).map(|(_, d)| *d);
        check_add_remove_round_trip(&name, &set, &test_spec("wasmtest"), dropin);
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} corpus files were editable");
}

#[test]
fn k0s_managed_file_is_never_edited_in_place() {
    let (_, bytes) = corpus_files()
        .into_iter()
        .find(|(n, _)| n.starts_with("k0s-"))
        .unwrap();
    let set = ConfigSet {
        main: ConfigFile {
            host_path: "/etc/k0s/containerd.toml".into(),
            bytes,
        },
        dropins: vec![],
    };
    let opts = AddOptions {
        replace: false,
        dropin: DropinPolicy::Never,
    };
    let e = plan_add(&set, &test_spec("wasmtest"), &opts).unwrap_err();
    assert_eq!(e.reason(), "GeneratedFile", "{e}");
    let plan = plan_add(&set, &test_spec("wasmtest"), &AddOptions::default()).unwrap();
    assert!(
        plan.changes
            .iter()
            .all(|c| c.host_path != Path::new("/etc/k0s/containerd.toml"))
    );
}

#[test]
fn handlers_already_in_the_corpus_are_recognised_whatever_their_quoting() {
    // image-builder already has `runtimes.spin` with only a runtime_type: identical = no-op.
    let files = corpus_files();
    let (_, ib) = files
        .iter()
        .find(|(n, _)| n.starts_with("image-builder-capi-containerd2"))
        .unwrap();
    let set = ConfigSet {
        main: ConfigFile {
            host_path: MAIN.into(),
            bytes: ib.clone(),
        },
        dropins: vec![],
    };
    let mut spin = test_spec("spin");
    spin.runtime_path = None;
    spin.options.clear();
    spin.pod_annotations.clear();
    spin.privileged_without_host_devices = false;
    spin.runtime_type = "io.containerd.spin.v2".into();
    assert!(
        plan_add(&set, &spin, &AddOptions::default())
            .unwrap()
            .is_empty()
    );
    // k3s v1.24 (version 1) has `runtimes."spin"` with a BinaryName option: a conflict naming it.
    let (_, k3s) = files
        .iter()
        .find(|(n, _)| n.starts_with("k3s-v1.24-config"))
        .unwrap();
    let set = ConfigSet {
        main: ConfigFile {
            host_path: MAIN.into(),
            bytes: k3s.clone(),
        },
        dropins: vec![],
    };
    let e = plan_add(&set, &spin, &AddOptions::default()).unwrap_err();
    assert_eq!(e.reason(), "HandlerConflict");
    assert!(e.to_string().contains("options.BinaryName"), "{e}");
    spin.options.insert(
        "BinaryName".into(),
        "/usr/local/bin/containerd-shim-spin-v1".into(),
    );
    assert!(
        plan_add(&set, &spin, &AddOptions::default())
            .unwrap()
            .is_empty()
    );
}

#[test]
fn inspect_reports_version_handlers_imports_and_dropin_mode() {
    use shim_agent::containerd::{HandlerForm, inspect};
    let files = corpus_files();
    let get = |prefix: &str| {
        files
            .iter()
            .find(|(n, _)| n.starts_with(prefix))
            .unwrap()
            .1
            .clone()
    };
    let set = |host: &str, bytes: Vec<u8>| ConfigSet {
        main: ConfigFile {
            host_path: host.into(),
            bytes,
        },
        dropins: vec![],
    };
    let kind = inspect(&set(MAIN, get("kind-node"))).unwrap();
    assert_eq!(kind.version, 2);
    assert_eq!(
        kind.plugin_path,
        "plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes"
    );
    let names: Vec<_> = kind
        .handlers
        .iter()
        .map(|h| (h.name.as_str(), h.owner, h.form))
        .collect();
    assert_eq!(
        names,
        [
            ("runc", "user", HandlerForm::Table),
            ("test-handler", "user", HandlerForm::Table)
        ]
    );
    assert_eq!(kind.dropin_dir, None);
    let k0s = inspect(&set("/etc/k0s/containerd.toml", get("k0s-managed"))).unwrap();
    assert_eq!(k0s.version, 3);
    assert_eq!(k0s.imports, ["/etc/k0s/containerd.d/*.toml"]);
    assert_eq!(
        k0s.dropin_dir.as_deref(),
        Some(Path::new("/etc/k0s/containerd.d"))
    );
    let v1 = inspect(&set(MAIN, get("k3s-v1.24-config"))).unwrap();
    assert_eq!(v1.version, 1);
    assert_eq!(v1.plugin_path, "plugins.cri.containerd.runtimes");
    let aks = inspect(&set(MAIN, get("aks-ubuntu"))).unwrap();
    assert_eq!(aks.default_runtime.as_deref(), Some("nvidia"));
    assert_eq!(aks.handlers.len(), 3);
    let e = inspect(&set(MAIN, get("bottlerocket-k8s-v2"))).unwrap_err();
    assert_eq!(e.reason(), "TemplateFile");
}
