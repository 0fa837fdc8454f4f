//! The command line as a node owner and an image builder use it: exit codes, messages on
//! stderr, and the offline install round trip through the real binary.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, real_elf, sha256_hex, tar_gz};

fn shim_agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args(args)
        .env_remove("SHIM_AGENT_CONFIG")
        .env_remove("SHIM_AGENT_CONFIG")
        .output()
        .expect("run shim-agent")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn crd_prints_the_committed_crd() {
    let out = shim_agent(&["crd"]);
    assert!(out.status.success());
    let committed =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/crd.yaml"))
            .unwrap();
    assert_eq!(text(&out.stdout), committed);
}

#[test]
fn help_explains_the_commands() {
    let out = shim_agent(&["--help"]);
    let help = text(&out.stdout);
    for cmd in [
        "crd",
        "manifests",
        "install",
        "uninstall",
        "status",
        "containerd",
    ] {
        assert!(help.contains(cmd), "--help lacks {cmd}: {help}");
    }
    let out = shim_agent(&["containerd", "add-runtime", "--help"]);
    assert!(text(&out.stdout).contains("--handler"));
}

#[test]
fn a_bad_agent_config_is_an_error_naming_the_file_and_key() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config.toml");
    std::fs::write(&cfg, "[fetch]\nbogus = 1\n").unwrap();
    let out = shim_agent(&["--config", cfg.to_str().unwrap(), "crd"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("config.toml") && err.contains("bogus"),
        "{err}"
    );
}

#[test]
fn install_refuses_a_root_that_is_not_a_directory() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let shim = d.path().join("shim.yaml");
    // not a whole Shim, and no need: the root is refused before the file is read
    std::fs::write(&shim, "kind: Shim\n").unwrap();
    let out = shim_agent(&[
        "install",
        "--root",
        file.to_str().unwrap(),
        "-f",
        shim.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is not a directory") && err.contains("not-a-dir"),
        "{err}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn install_refuses_a_file_that_is_not_a_shim() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let f = d.path().join("pod.yaml");
    std::fs::write(&f, "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n").unwrap();
    let out = shim_agent(&[
        "install",
        "--root",
        root.to_str().unwrap(),
        "-f",
        f.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("is not a Shim"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&root).unwrap().count(),
        0,
        "root must stay empty"
    );
}

#[test]
fn live_install_without_a_reachable_systemd_fails_before_touching_the_node() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    let f = d.path().join("shim.yaml");
    std::fs::write(
        &f,
        ShimBuilder::new("demo")
            .artifact("file:///nonexistent", &"a".repeat(64))
            .yaml(),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args([
            "install",
            "--root",
            root.to_str().unwrap(),
            "--live",
            "-f",
            f.to_str().unwrap(),
        ])
        .env(
            "DBUS_SYSTEM_BUS_ADDRESS",
            format!("unix:path={}/no-bus", d.path().display()),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("cannot reach systemd"),
        "{}",
        text(&out.stderr)
    );
    let mut names: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["etc"], "nothing created in the node");
}

#[test]
fn offline_install_status_and_uninstall_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    let original = b"version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n";
    std::fs::write(root.join("etc/containerd/config.toml"), original).unwrap();
    let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let art_path = d.path().join("demo.tar.gz");
    std::fs::write(&art_path, &art).unwrap();
    let yaml = ShimBuilder::new("demo")
        .artifact(&format!("file://{}", art_path.display()), &sha256_hex(&art))
        .yaml();
    let f = d.path().join("shim.yaml");
    std::fs::write(&f, yaml).unwrap();
    let r = root.to_str().unwrap();

    let out = shim_agent(&["install", "--root", r, "-f", f.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("installed demo: handler demo"),
        "{}",
        text(&out.stdout)
    );

    let out = shim_agent(&["status", "--root", r]);
    let table = text(&out.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("demo") && table.contains("pending-verification"),
        "{table}"
    );

    let out = shim_agent(&["status", "--root", r, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["shims"]["demo"]["state"], "pending-verification");
    assert_eq!(v["shims"]["demo"]["artifact_sha256"], sha256_hex(&art));

    let out = shim_agent(&["uninstall", "--root", r, "demo"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("restored to its bytes"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read(root.join("etc/containerd/config.toml")).unwrap(),
        original
    );

    let out = shim_agent(&["uninstall", "--root", r, "demo"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no Shim named \"demo\""),
        "{}",
        text(&out.stderr)
    );
}

/// An image builder bakes the node's policy into the image; `install --root` must honour it as
/// the node that boots the image will: the image's own /etc/shim-agent config, not the build
/// machine's. `--config` still names another.
#[test]
fn install_into_an_image_honours_the_images_own_signature_policy() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    let original = b"version = 2\n";
    std::fs::write(root.join("etc/containerd/config.toml"), original).unwrap();
    let policy = root.join("etc/shim-agent/config.d");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(
        policy.join("50-signatures.toml"),
        "[signatures]\nrequire = true\nidentities = [{ identity = \"ci@example.com\", issuer = \"https://accounts.example.com\" }]\n",
    )
    .unwrap();
    let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let art_path = d.path().join("demo.tar.gz");
    std::fs::write(&art_path, &art).unwrap();
    let yaml = ShimBuilder::new("demo")
        .artifact(&format!("file://{}", art_path.display()), &sha256_hex(&art))
        .yaml();
    let f = d.path().join("shim.yaml");
    std::fs::write(&f, yaml).unwrap();
    let (r, f) = (root.to_str().unwrap(), f.to_str().unwrap());
    let before = tree(&root);

    let out = shim_agent(&["install", "--root", r, "-f", f]);
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("this node requires signed shims"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(tree(&root), before, "the refused install changed the image");

    // --config names the settings instead (an empty file: no policy)
    let empty = d.path().join("agent.toml");
    std::fs::write(&empty, "").unwrap();
    let out = shim_agent(&[
        "--config",
        empty.to_str().unwrap(),
        "install",
        "--root",
        r,
        "-f",
        f,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn containerd_config_flag_is_not_the_agent_config_flag() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("config.toml");
    std::fs::write(&cfg, "version = 2\n").unwrap();
    let out = shim_agent(&["containerd", "show", "--config", cfg.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("io.containerd.grpc.v1.cri"),
        "{}",
        text(&out.stdout)
    );
}

/// Every path under `dir` with its bytes (files), link target (links) and modification time.
fn tree(dir: &Path) -> Vec<(String, Option<Vec<u8>>, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let bytes = if m.is_file() {
                Some(std::fs::read(&p).unwrap())
            } else if m.is_symlink() {
                Some(
                    std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                )
            } else {
                todo.push(p.clone());
                None
            };
            out.push((p.display().to_string(), bytes, m.modified().unwrap()));
        }
    }
    out.sort();
    out
}

/// `shim-agent ARGS` with `stdin` on standard input.
fn shim_agent_stdin(args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args(args)
        .env_remove("SHIM_AGENT_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run shim-agent");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn a_dry_run_says_what_an_install_would_do_and_changes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    let shim = |name: &str, handler: &str, body: &[u8]| {
        let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", body.to_vec(), 0o755)]);
        let path = d.path().join(format!("{name}-{}.tar.gz", sha256_hex(&art)));
        std::fs::write(&path, &art).unwrap();
        ShimBuilder::new(name)
            .artifact(&format!("file://{}", path.display()), &sha256_hex(&art))
            .handler(handler)
            .yaml()
    };
    let v1 = shim("demo", "demo", &real_elf());
    let r = root.to_str().unwrap();
    let dry = |yaml: &str| {
        let before = tree(&root);
        let out = shim_agent_stdin(&["install", "--root", r, "--dry-run", "-f", "-"], yaml);
        assert_eq!(tree(&root), before, "a dry run changed the root");
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };

    assert_eq!(
        dry(&v1),
        (true, "would install demo\n".into(), String::new())
    );

    // the Shims on standard input (`-f -`), as the Ansible role hands them over
    let out = shim_agent_stdin(&["install", "--root", r, "-f", "-"], &v1);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("installed demo: "),
        "{}",
        text(&out.stdout)
    );

    assert_eq!(dry(&v1).1, "demo: already installed, nothing to do\n");
    // ... and the install itself leaves the root as it was, times included
    let before = tree(&root);
    let out = shim_agent_stdin(&["install", "--root", r, "-f", "-"], &v1);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "demo: already installed, nothing to do\n"
    );
    assert_eq!(
        tree(&root),
        before,
        "an install with nothing to do wrote to the root"
    );

    let mut other = real_elf();
    other.extend_from_slice(b"v2");
    assert_eq!(dry(&shim("demo", "demo", &other)).1, "would upgrade demo\n");

    let (ok, out, err) = dry(&shim("other", "demo", &other));
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains("handler \"demo\" is already installed for Shim \"demo\"; uninstall it first"),
        "{err}"
    );

    let state: serde_json::Value =
        serde_json::from_slice(&shim_agent(&["status", "--root", r, "--json"]).stdout).unwrap();
    let binary = state["shims"]["demo"]["binary"].as_str().unwrap();
    std::fs::remove_file(root.join(binary.trim_start_matches('/'))).unwrap();
    assert_eq!(
        dry(&v1).1,
        "would repair demo: its binary or its handler is missing\n"
    );

    let out = shim_agent(&["install", "--dry-run", "-f", "-"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--root"),
        "{}",
        text(&out.stderr)
    );
}
