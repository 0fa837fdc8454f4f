//! `shim-agent doctor --root` on an image root, through the real binary: it reads the image's
//! files only (no systemd, no socket, no cluster), judges the containerd config, its registry
//! hosts and the free space, and exits 1 when the image could not take an install.

use std::path::Path;
use std::process::Command;

fn doctor(root: &Path, json: bool) -> (i32, String) {
    let mut args = vec![
        "--config",
        "/dev/null",
        "doctor",
        "--root",
        root.to_str().unwrap(),
    ];
    if json {
        args.push("--json");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args(&args)
        .output()
        .expect("run shim-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

fn level(report: &serde_json::Value, check: &str) -> Vec<String> {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| f["level"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn an_image_root_is_judged_on_its_files_and_what_it_cannot_check_is_skipped() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path();
    std::fs::create_dir_all(root.join("etc/containerd/certs.d/docker.io")).unwrap();
    std::fs::write(
        root.join("etc/containerd/config.toml"),
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = \"/etc/containerd/certs.d\"\n",
    )
    .unwrap();
    std::fs::write(
        root.join("etc/containerd/certs.d/docker.io/hosts.toml"),
        "server = \"https://registry-1.docker.io\"\n",
    )
    .unwrap();
    let (rc, out) = doctor(root, true);
    assert_eq!(rc, 0, "{out}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["target"], format!("image {}", root.display()));
    assert_eq!(level(&r, "containerd.config"), ["ok"]);
    assert_eq!(level(&r, "containerd.registry-hosts"), ["ok"]);
    // no containerd binary in this image: its version is unknown, which warns
    assert_eq!(level(&r, "containerd.version"), ["warn"]);
    for check in [
        "containerd.unit",
        "cri.socket",
        "cri.sandbox-image",
        "kube.credentials",
        "proxy",
    ] {
        assert_eq!(level(&r, check), ["skip"], "{check}");
    }
    assert_eq!(level(&r, "disk.state"), ["ok"]);

    // the text form says the same
    let (rc, text) = doctor(root, false);
    assert_eq!(rc, 0);
    assert!(text.contains("skip  cri.socket"), "{text}");
    assert!(
        text.ends_with("nothing blocks installs; 1 warning(s)\n"),
        "{text}"
    );
}

#[test]
fn an_image_without_a_readable_containerd_config_cannot_take_an_install() {
    let d = tempfile::tempdir().unwrap();
    let (rc, text) = doctor(d.path(), false);
    assert_eq!(rc, 1, "{text}");
    assert!(
        text.contains("FAIL  containerd.config")
            && text
                .contains("/etc/containerd/config.toml: the containerd config file does not exist"),
        "{text}"
    );
    std::fs::create_dir_all(d.path().join("etc/containerd")).unwrap();
    std::fs::write(d.path().join("etc/containerd/config.toml"), "version = [\n").unwrap();
    let (rc, text) = doctor(d.path(), false);
    assert_eq!(rc, 1, "{text}");
    assert!(text.contains("FAIL  containerd.config"), "{text}");
    assert!(
        text.ends_with("1 problem(s) block installs; 1 warning(s)\n"),
        "{text}"
    );
}

/// The node's signature policy is loaded as an install loads it: a `[signatures]` whose key
/// file is not a public key blocks installs, and the doctor says so; a sound one is told.
#[test]
fn a_signature_policy_that_cannot_load_blocks_installs_and_a_sound_one_is_told() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("img");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    std::fs::create_dir_all(root.join("etc/shim-agent/keys")).unwrap();
    let config = d.path().join("config.toml");
    let run = |key: &str| {
        std::fs::write(root.join("etc/shim-agent/keys/team.pub"), key).unwrap();
        std::fs::write(
            &config,
            "[signatures]\nrequire = true\nkeys = [\"/etc/shim-agent/keys/team.pub\"]\n",
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_shim-agent"))
            .args([
                "--config",
                config.to_str().unwrap(),
                "doctor",
                "--json",
                "--root",
            ])
            .arg(&root)
            .output()
            .expect("run shim-agent");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        let finding = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["check"] == "signature-policy")
            .cloned()
            .unwrap();
        (out.status.code(), finding)
    };
    let (rc, f) = run("not a key");
    assert_eq!((rc, f["level"].as_str()), (Some(1), Some("fail")), "{f}");
    assert!(f["summary"].as_str().unwrap().contains("team.pub"), "{f}");
    // a real P-256 public key (cosign's kind)
    let key = rcgen::KeyPair::generate().unwrap();
    let pem = crate::support::sigstore::pem_of(
        "PUBLIC KEY",
        &rcgen::PublicKeyData::subject_public_key_info(&key),
    );
    let (_, f) = run(&pem);
    assert_eq!(f["level"], "ok", "{f}");
    assert!(
        f["summary"]
            .as_str()
            .unwrap()
            .contains("0 identities and 1 keys trusted"),
        "{f}"
    );
}
