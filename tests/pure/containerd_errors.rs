//! Error paths through the real shell and the CLI: every refusal names the file and the
//! reason, and leaves the files on disk untouched; writes keep mode; stale plans are refused.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use clap::Parser;
use shim_agent::cli::containerd::{ContainerdCmd, run};
use shim_agent::containerd::{AddOptions, RuntimeSpec, apply, load, plan_add, plan_remove};
use shim_agent::hostroot::HostRoot;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: ContainerdCmd,
}

struct Host {
    _dir: tempfile::TempDir,
    root: HostRoot,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path()).unwrap();
        Host { _dir: dir, root }
    }
    fn write(&self, host: &str, bytes: &[u8]) {
        let p = self.root.resolve(host).unwrap();
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    fn read(&self, host: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.resolve(host).unwrap()).ok()
    }
    fn cli(&self, args: &[&str]) -> anyhow::Result<()> {
        let mut argv = vec!["containerd"];
        argv.extend_from_slice(args);
        run(Cli::try_parse_from(argv)?.cmd, &self.root)
    }
}

const MAIN: &str = "/etc/containerd/config.toml";

/// (case, host path, content, reason, words the message must contain)
const REFUSALS: &[(&str, &str, &str, &str, &str)] = &[
    (
        "go template",
        MAIN,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"{{.Image}}\"\n",
        "TemplateFile",
        "template",
    ),
    (
        "handlebars",
        MAIN,
        "[required-extensions]\nstd = \"v1\"\n+++\nversion = 2\n",
        "TemplateFile",
        "Handlebars",
    ),
    (
        "jinja",
        MAIN,
        "## template: jinja\nversion = {% if x %}3{% endif %}\n",
        "TemplateFile",
        "Jinja",
    ),
    (
        "shell",
        MAIN,
        "version = 2\n[debug]\n  level = \"${LOG_LEVEL}\"\n",
        "TemplateFile",
        "${VAR}",
    ),
    (
        "parse error",
        MAIN,
        "version = 2\n\n[plugins\nx = 1\n",
        "ParseError",
        "line 3, column",
    ),
    (
        "not utf-8",
        MAIN,
        "version = 2\n# \u{0}\n",
        "ParseError",
        "line",
    ),
    (
        "version 0",
        MAIN,
        "version = 0\n",
        "UnsupportedVersion",
        "version 0",
    ),
    (
        "version 5",
        MAIN,
        "version = 5\n",
        "UnsupportedVersion",
        "version 5",
    ),
    (
        "version string",
        MAIN,
        "version = \"3\"\n",
        "UnsupportedVersion",
        "\"3\"",
    ),
    (
        "flatcar usr",
        "/usr/share/containerd/config.toml",
        "version = 2\n",
        "ReadOnlyLayout",
        "read-only",
    ),
    (
        "talos path",
        "/etc/cri/containerd.toml",
        "version = 3\n",
        "ReadOnlyLayout",
        "Talos",
    ),
    (
        "talos content",
        MAIN,
        "version = 3\nimports = [\"/etc/cri/conf.d/cri.toml\"]\n",
        "ReadOnlyLayout",
        "Talos",
    ),
    (
        "bottlerocket",
        MAIN,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"shimpei\"\n",
        "ReadOnlyLayout",
        "Bottlerocket",
    ),
    (
        "cri disabled v1",
        MAIN,
        "disabled_plugins = [\"cri\"]\n",
        "CriDisabled",
        "CRI plugin is disabled in this config",
    ),
    (
        "cri disabled v3",
        MAIN,
        "version = 3\ndisabled_plugins = [\"io.containerd.cri.v1.runtime\"]\n",
        "CriDisabled",
        "CRI plugin is disabled in this config",
    ),
    (
        "k3s generated",
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "version = 2\n",
        "GeneratedFile",
        "config.toml.tmpl",
    ),
    (
        "k0s in place",
        MAIN,
        "# k0s_managed=true\nversion = 3\n",
        "GeneratedFile",
        "k0s",
    ),
    (
        "v1 with v2 ids",
        MAIN,
        "[plugins.\"io.containerd.grpc.v1.cri\"]\nx = 1\n",
        "MixedSchema",
        "no `version` key",
    ),
    (
        "v2 runtimes under v3 id",
        MAIN,
        "version = 2\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc]\nruntime_type = \"io.containerd.runc.v2\"\n",
        "MixedSchema",
        "io.containerd.cri.v1.runtime",
    ),
    (
        "missing import",
        MAIN,
        "version = 3\nimports = [\"/etc/containerd/extra.toml\"]\n",
        "MissingImport",
        "/etc/containerd/extra.toml",
    ),
    (
        "runtimes as an array of tables",
        MAIN,
        "version = 2\n[[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]]\nruntime_type = \"io.containerd.runc.v2\"\n",
        "UnsupportedLayout",
        "`plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes` is an array of tables",
    ),
    (
        "containerd as a string",
        MAIN,
        "version = 3\n[plugins.'io.containerd.cri.v1.runtime']\ncontainerd = \"runc\"\n",
        "UnsupportedLayout",
        "`plugins.\"io.containerd.cri.v1.runtime\".containerd` is a string, not a table",
    ),
    (
        "runtimes as an array inside an inline table",
        MAIN,
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\ncontainerd = { runtimes = [] }\n",
        "UnsupportedLayout",
        "write `plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes` as a table",
    ),
];

fn spin() -> RuntimeSpec {
    RuntimeSpec::from_binary(
        "spin",
        "/opt/shim-agent/shims/spin/1/containerd-shim-spin-v2",
    )
}

#[test]
fn every_refusal_names_the_file_and_the_reason_and_writes_nothing() {
    for (case, host, content, reason, words) in REFUSALS {
        let h = Host::new();
        h.write(host, content.as_bytes());
        let set = load(&h.root, Path::new(host), None).unwrap();
        let e = plan_add(&set, &spin(), &AddOptions::default()).unwrap_err();
        assert_eq!(e.reason(), *reason, "{case}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains(host),
            "{case}: message does not name the file: {msg}"
        );
        assert!(
            msg.contains(words),
            "{case}: message does not say `{words}`: {msg}"
        );
        // the CLI fails with the same message and leaves the file alone
        let err = h
            .cli(&[
                "add-runtime",
                "--config",
                host,
                "--handler",
                "spin",
                "--runtime-type",
                "io.containerd.spin.v2",
            ])
            .unwrap_err();
        assert!(format!("{err:#}").contains(host), "{case}: {err:#}");
        assert_eq!(
            h.read(host).unwrap(),
            content.as_bytes(),
            "{case}: file changed"
        );
    }
}

#[test]
fn a_missing_config_file_is_an_error_naming_it() {
    let h = Host::new();
    let e = load(&h.root, Path::new(MAIN), None).unwrap_err();
    assert_eq!(e.reason(), "IoError");
    assert!(e.to_string().contains(MAIN), "{e}");
    assert!(h.read(MAIN).is_none());
}

#[test]
fn user_handlers_are_never_removed() {
    let h = Host::new();
    let content = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.spin]\nruntime_type = \"io.containerd.spin.v2\"\n";
    h.write(MAIN, content.as_bytes());
    let err = h
        .cli(&["remove-runtime", "--config", MAIN, "--handler", "spin"])
        .unwrap_err();
    let msg = format!("{err:#}");
    assert!(
        msg.contains(MAIN) && msg.contains("not added by shim-agent"),
        "{msg}"
    );
    assert_eq!(h.read(MAIN).unwrap(), content.as_bytes());
}

#[test]
fn a_conflicting_handler_names_the_file_and_the_fields() {
    let h = Host::new();
    let content = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.spin]\nruntime_type = 'io.containerd.spin.v1'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.spin.options]\nDebug = true\n";
    h.write(MAIN, content.as_bytes());
    let set = load(&h.root, Path::new(MAIN), None).unwrap();
    let e = plan_add(&set, &spin(), &AddOptions::default()).unwrap_err();
    assert_eq!(e.reason(), "HandlerConflict");
    let msg = e.to_string();
    for w in [
        MAIN,
        "options.Debug",
        "runtime_path",
        "runtime_type",
        "--replace",
    ] {
        assert!(msg.contains(w), "`{w}` missing from: {msg}");
    }
    assert_eq!(h.read(MAIN).unwrap(), content.as_bytes());
}

#[test]
fn a_plan_made_from_old_bytes_is_not_applied() {
    let h = Host::new();
    h.write(MAIN, b"version = 2\n");
    let set = load(&h.root, Path::new(MAIN), None).unwrap();
    let plan = plan_add(&set, &spin(), &AddOptions::default()).unwrap();
    h.write(MAIN, b"version = 2\n# edited meanwhile\n");
    let e = apply(&h.root, &plan).unwrap_err();
    assert_eq!(e.reason(), "StaleFile");
    assert_eq!(h.read(MAIN).unwrap(), b"version = 2\n# edited meanwhile\n");
}

#[test]
fn writes_keep_the_file_mode_and_leave_no_temp_files() {
    let h = Host::new();
    h.write(MAIN, b"version = 2\n");
    let local = h.root.resolve(MAIN).unwrap();
    std::fs::set_permissions(&local, std::fs::Permissions::from_mode(0o600)).unwrap();
    h.cli(&[
        "add-runtime",
        "--config",
        MAIN,
        "--handler",
        "spin",
        "--runtime-path",
        "/opt/x/containerd-shim-spin-v2",
    ])
    .unwrap();
    assert_eq!(
        std::fs::metadata(&local).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let names: Vec<_> = std::fs::read_dir(local.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let text = String::from_utf8(h.read(MAIN).unwrap()).unwrap();
    assert!(
        text.contains("runtime_type = \"io.containerd.spin.v2\""),
        "{text}"
    );
    assert!(
        text.contains("runtime_path = \"/opt/x/containerd-shim-spin-v2\""),
        "{text}"
    );
    h.cli(&["remove-runtime", "--config", MAIN, "--handler", "spin"])
        .unwrap();
    assert_eq!(h.read(MAIN).unwrap(), b"version = 2\n");
    assert_eq!(
        std::fs::metadata(&local).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

#[test]
fn dry_run_and_diff_write_nothing() {
    let h = Host::new();
    h.write(MAIN, b"version = 2\n");
    for flag in ["--dry-run", "--diff"] {
        h.cli(&[
            "add-runtime",
            "--config",
            MAIN,
            "--handler",
            "spin",
            "--runtime-type",
            "io.containerd.spin.v2",
            flag,
        ])
        .unwrap();
        assert_eq!(h.read(MAIN).unwrap(), b"version = 2\n", "{flag}");
    }
    h.cli(&["show", "--config", MAIN]).unwrap();
}

#[test]
fn an_explicit_dropin_dir_is_imported_after_the_dropin_exists_and_removed_before_it() {
    let h = Host::new();
    h.write(MAIN, b"version = 3\n");
    let set = load(&h.root, Path::new(MAIN), None).unwrap();
    let opts = AddOptions {
        replace: false,
        dropin: shim_agent::containerd::DropinPolicy::Dir("/etc/containerd/shim.d".into()),
    };
    let plan = plan_add(&set, &spin(), &opts).unwrap();
    let order: Vec<_> = plan
        .changes
        .iter()
        .map(|c| c.host_path.to_string_lossy().into_owned())
        .collect();
    assert_eq!(order, ["/etc/containerd/shim.d/shim-agent-spin.toml", MAIN]);
    assert!(plan.changes[0].before.is_none());
    apply(&h.root, &plan).unwrap();
    let set = load(&h.root, Path::new(MAIN), None).unwrap();
    assert_eq!(set.dropins.len(), 1, "the import is loaded back");
    let plan = plan_remove(&set, "spin").unwrap();
    let order: Vec<_> = plan
        .changes
        .iter()
        .map(|c| {
            (
                c.host_path.to_string_lossy().into_owned(),
                c.after.is_some(),
            )
        })
        .collect();
    assert_eq!(
        order,
        [
            (MAIN.to_string(), true),
            (
                "/etc/containerd/shim.d/shim-agent-spin.toml".to_string(),
                false
            )
        ]
    );
    apply(&h.root, &plan).unwrap();
    assert_eq!(h.read(MAIN).unwrap(), b"version = 3\n");
    assert!(
        h.read("/etc/containerd/shim.d/shim-agent-spin.toml")
            .is_none()
    );
}

#[test]
fn a_leftover_dropin_that_is_not_imported_does_not_count_as_registered() {
    let h = Host::new();
    h.write(MAIN, b"version = 3\n");
    let dropin = "/etc/containerd/shim.d/shim-agent-spin.toml";
    let opts = AddOptions {
        replace: false,
        dropin: shim_agent::containerd::DropinPolicy::Dir("/etc/containerd/shim.d".into()),
    };
    let set = load(
        &h.root,
        Path::new(MAIN),
        Some(Path::new("/etc/containerd/shim.d")),
    )
    .unwrap();
    apply(&h.root, &plan_add(&set, &spin(), &opts).unwrap()).unwrap();
    // someone drops the import by hand; the file stays
    h.write(MAIN, b"version = 3\n");
    let set = load(
        &h.root,
        Path::new(MAIN),
        Some(Path::new("/etc/containerd/shim.d")),
    )
    .unwrap();
    let plan = plan_add(&set, &spin(), &opts).unwrap();
    assert_eq!(plan.changes.len(), 2, "{plan:?}");
    assert!(
        plan.changes[0].before.is_some(),
        "the existing file is the base"
    );
    apply(&h.root, &plan).unwrap();
    let main = String::from_utf8(h.read(MAIN).unwrap()).unwrap();
    assert!(main.contains(dropin), "{main}");
}
