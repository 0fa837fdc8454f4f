//! Offline install into an image root (`install --root`), end to end through the library:
//! fetch, verify, unpack, place, edit containerd's config, record; uninstall restores the
//! bytes; every failure leaves the root exactly as it was.

use std::os::unix::fs::PermissionsExt;

use shim_agent::api::load::parse_shims;
use shim_agent::artifact::{Platform, node_platform};
use shim_agent::cli::image::{self, InstallOptions, InstallOutcome};
use shim_agent::cli::status;
use shim_agent::settings::Settings;
use shim_agent::state::{NodeState, ShimState, StateStore};

use crate::support;
use crate::support::image_root::{
    Image, deep_snapshot, image, run_install, uninstall, write_artifact,
};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, TestServer, foreign_elf, real_elf, sha256_hex, tar_gz};

fn shim(name: &str, location: &str, sha256: &str) -> ShimBuilder {
    ShimBuilder::new(name)
        .artifact(location, sha256)
        .option("SystemdCgroup", true)
}

fn good_artifact() -> Vec<u8> {
    tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", real_elf(), 0o755),
    ])
}

fn state_of(img: &Image) -> NodeState {
    status::read_state(&img.root, &Settings::default()).unwrap()
}

#[test]
fn install_places_the_binary_registers_the_handler_and_records_it() {
    let img = image();
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    let out = run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap();
    // the whole tree is installed: the shim keeps its place in it (bin/)
    let bin = format!("/opt/shim-agent/shims/demo/{sha}/bin/containerd-shim-demo-v2");
    assert_eq!(
        out,
        InstallOutcome::Installed {
            binary: bin.clone(),
            config_files: vec!["/etc/containerd/config.toml".into()],
            upgraded: false
        }
    );
    let local = img.root.resolve(&bin).unwrap();
    assert_eq!(std::fs::read(&local).unwrap(), real_elf());
    assert_eq!(
        std::fs::metadata(&local).unwrap().permissions().mode() & 0o7777,
        0o755
    );

    let cfg: toml_edit::DocumentMut =
        std::fs::read_to_string(img.root.resolve("/etc/containerd/config.toml").unwrap())
            .unwrap()
            .parse()
            .unwrap();
    let rt = &cfg["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
    // the absolute path as runtime_type: containerd 1.6 ignores runtime_path (containerd#8207)
    assert_eq!(rt["demo"]["runtime_type"].as_str(), Some(bin.as_str()));
    assert!(rt["demo"].get("runtime_path").is_none());
    assert_eq!(rt["demo"]["options"]["SystemdCgroup"].as_bool(), Some(true));
    assert_eq!(
        rt["runc"]["runtime_type"].as_str(),
        Some("io.containerd.runc.v2"),
        "runc kept explicitly for containerd 1.x"
    );

    let state = state_of(&img);
    let rec = &state.shims["demo"];
    assert_eq!(rec.state, ShimState::PendingVerification);
    assert_eq!(rec.artifact_sha256, sha);
    assert_eq!(
        rec.config_files[0].sha256_before.as_deref(),
        Some(sha256_hex(&img.original_config).as_str())
    );
    assert!(state.journal.is_none(), "journal closed after commit");
    assert!(
        img.root
            .resolve(format!("/var/lib/shim-agent/store/sha256/{sha}"))
            .unwrap()
            .is_dir()
    );
    assert!(
        !img.root
            .resolve("/var/lib/shim-agent/backups")
            .unwrap()
            .read_dir()
            .unwrap()
            .any(|_| true),
        "backups removed"
    );

    // same Shim again: nothing changes
    let before = deep_snapshot(img.root.path());
    assert_eq!(
        run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap(),
        InstallOutcome::Unchanged
    );
    assert_eq!(deep_snapshot(img.root.path()), before);
}

#[test]
fn uninstall_restores_the_original_config_bytes_and_removes_everything() {
    let img = image();
    let before = deep_snapshot(img.root.path());
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap();
    let out = uninstall(&img, "demo").unwrap();
    assert_eq!(out.restored, ["/etc/containerd/config.toml"]);
    assert!(out.changed_since.is_empty());
    assert_eq!(
        std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap(),
        img.original_config
    );
    assert!(
        !img.root
            .resolve("/opt/shim-agent/shims/demo")
            .unwrap()
            .exists()
    );
    assert!(
        !img.root
            .resolve(format!("/var/lib/shim-agent/store/sha256/{sha}"))
            .unwrap()
            .exists()
    );
    assert!(state_of(&img).shims.is_empty());
    // what is left is the agent's own (empty) bookkeeping, nothing under /etc or /opt/.../demo
    let after = deep_snapshot(img.root.path());
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "{k} changed");
    }
    let e = uninstall(&img, "demo").unwrap_err();
    assert!(e.to_string().contains("no Shim named \"demo\""), "{e}");
}

#[test]
fn an_upgrade_places_the_new_binary_beside_the_old_and_switches() {
    let img = image();
    let (url1, sha1) = write_artifact(&img, "v1.tar.gz", &good_artifact());
    run_install(&img, &shim("demo", &url1, &sha1).yaml()).unwrap();
    let v2 = tar_gz(&[
        Entry::File("containerd-shim-demo-v2", real_elf(), 0o755),
        Entry::File("VERSION", b"2".to_vec(), 0o644),
    ]);
    let (url2, sha2) = write_artifact(&img, "v2.tar.gz", &v2);
    let out = run_install(&img, &shim("demo", &url2, &sha2).yaml()).unwrap();
    assert!(
        matches!(out, InstallOutcome::Installed { upgraded: true, .. }),
        "{out:?}"
    );
    let cfg =
        std::fs::read_to_string(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap();
    assert!(cfg.contains(&sha2) && !cfg.contains(&sha1), "{cfg}");
    assert!(
        !img.root
            .resolve(format!("/opt/shim-agent/shims/demo/{sha1}"))
            .unwrap()
            .exists()
    );
    assert!(
        !img.root
            .resolve(format!("/var/lib/shim-agent/store/sha256/{sha1}"))
            .unwrap()
            .exists()
    );
    // uninstall after an upgrade still gives back the bytes from before the first install
    uninstall(&img, "demo").unwrap();
    assert_eq!(
        std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap(),
        img.original_config
    );
}

/// Install must fail with `expect` in its message and leave the root untouched.
fn assert_fails_cleanly(img: &Image, yaml: &str, expect: &str) {
    let before = deep_snapshot(img.root.path());
    let e = format!("{:#}", run_install(img, yaml).unwrap_err());
    assert!(e.contains(expect), "expected {expect:?} in: {e}");
    assert_eq!(
        deep_snapshot(img.root.path()),
        before,
        "root changed after: {e}"
    );
}

#[test]
fn bad_artifacts_fail_and_change_nothing() {
    let img = image();
    let (url, _) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    assert_fails_cleanly(&img, &shim("demo", &url, &"0".repeat(64)).yaml(), "sha256");

    let (url, sha) = write_artifact(
        &img,
        "none.tar.gz",
        &tar_gz(&[Entry::File("README", b"x".to_vec(), 0o644)]),
    );
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "README");

    let two = tar_gz(&[
        Entry::File("containerd-shim-a-v2", real_elf(), 0o755),
        Entry::File("containerd-shim-b-v2", real_elf(), 0o755),
    ]);
    let (url, sha) = write_artifact(&img, "two.tar.gz", &two);
    assert_fails_cleanly(
        &img,
        &shim("demo", &url, &sha).yaml(),
        "containerd-shim-b-v2",
    );

    let (url, sha) = write_artifact(
        &img,
        "arch.tar.gz",
        &tar_gz(&[Entry::File("containerd-shim-demo-v2", foreign_elf(), 0o755)]),
    );
    assert_fails_cleanly(
        &img,
        &shim("demo", &url, &sha).yaml(),
        "containerd-shim-demo-v2",
    );

    let evil = tar_gz(&[Entry::File(
        "../../etc/passwd",
        b"root::0:0::/:/bin/sh\n".to_vec(),
        0o644,
    )]);
    let (url, sha) = write_artifact(&img, "evil.tar.gz", &evil);
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "../../etc/passwd");

    let (url, sha) = write_artifact(&img, "html.tar.gz", b"<html>not found</html>");
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "html.tar.gz");

    // a wanted binary that is not in the archive
    let (url, sha) = write_artifact(&img, "demo2.tar.gz", &good_artifact());
    assert_fails_cleanly(
        &img,
        &shim("demo", &url, &sha)
            .binary("containerd-shim-spin-v2")
            .yaml(),
        "containerd-shim-spin-v2",
    );
}

#[test]
fn network_failures_fail_and_change_nothing() {
    let img = image();
    let server = TestServer::start();
    server.route("/missing.tar.gz", support::Route::status(404, "nope"));
    let url = server.url("/missing.tar.gz");
    assert_fails_cleanly(&img, &shim("demo", &url, &"a".repeat(64)).yaml(), "404");
    // nothing listens on port 1
    assert_fails_cleanly(
        &img,
        &shim("demo", "http://127.0.0.1:1/x.tar.gz", &"a".repeat(64)).yaml(),
        "127.0.0.1:1",
    );
}

#[test]
fn a_config_the_engine_refuses_fails_after_fetch_and_changes_nothing() {
    let img = image();
    std::fs::write(
        img.root.resolve("/etc/containerd/config.toml").unwrap(),
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"\nbroken",
    )
    .unwrap();
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    // the artifact was fetched into the store before planning failed: it must be gone again
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "config.toml");
    std::fs::remove_file(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap();
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "does not exist");
}

#[test]
fn another_shim_with_the_same_handler_is_refused() {
    let img = image();
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap();
    let yaml = shim("other", &url, &sha).handler("demo").yaml();
    assert_fails_cleanly(&img, &yaml, "already installed for Shim \"demo\"");
}

#[test]
fn a_crash_mid_install_is_rolled_back_from_the_journal_on_the_next_run() {
    let img = image();
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap();
    let installed_cfg =
        std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap();
    // Simulate a crash of an upgrade after Applied: new config written, journal still open
    // with its backups on disk (what a killed process leaves behind).
    let state_dir = img.root.resolve("/var/lib/shim-agent").unwrap();
    {
        let store = StateStore::open(&state_dir).unwrap();
        let mut state = store.load().unwrap().state;
        let backup_dir = state_dir.join("backups/crashed");
        std::fs::create_dir_all(&backup_dir).unwrap();
        std::fs::write(backup_dir.join("0"), &installed_cfg).unwrap();
        state.journal = Some(shim_agent::state::Journal {
            id: "crashed".into(),
            kind: shim_agent::state::TxnKind::Upgrade,
            shims: vec!["demo".into()],
            phase: shim_agent::state::Phase::Applied,
            backups: vec![
                shim_agent::state::Backup {
                    path: "/etc/containerd/config.toml".into(),
                    saved_as: Some("/var/lib/shim-agent/backups/crashed/0".into()),
                    sha256: Some(sha256_hex(&installed_cfg)),
                },
                shim_agent::state::Backup {
                    path: "/opt/shim-agent/shims/demo/new/containerd-shim-demo-v2".into(),
                    saved_as: None,
                    sha256: None,
                },
            ],
            reason: None,
            pending: vec![],
            removing: vec![],
            repair: false,
            started_at: 0,
        });
        store.save(&state).unwrap();
    }
    std::fs::write(
        img.root.resolve("/etc/containerd/config.toml").unwrap(),
        b"half-written upgrade",
    )
    .unwrap();
    std::fs::create_dir_all(img.root.resolve("/opt/shim-agent/shims/demo/new").unwrap()).unwrap();
    std::fs::write(
        img.root
            .resolve("/opt/shim-agent/shims/demo/new/containerd-shim-demo-v2")
            .unwrap(),
        b"new",
    )
    .unwrap();
    let status = status::format_status_table(&state_of(&img));
    assert!(
        status.contains("unfinished transaction crashed"),
        "{status}"
    );

    // the next run rolls back first, then sees the Shim as installed
    assert_eq!(
        run_install(&img, &shim("demo", &url, &sha).yaml()).unwrap(),
        InstallOutcome::Unchanged
    );
    assert_eq!(
        std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap(),
        installed_cfg
    );
    assert!(
        !img.root
            .resolve("/opt/shim-agent/shims/demo/new/containerd-shim-demo-v2")
            .unwrap()
            .exists()
    );
    let state = state_of(&img);
    assert!(state.journal.is_none());
    assert!(!state_dir.join("backups/crashed").exists());
}

#[test]
fn platforms_pick_the_image_architecture() {
    let img = image();
    let (url, sha) = write_artifact(&img, "demo.tar.gz", &good_artifact());
    let yaml = ShimBuilder::new("demo")
        .platform("linux", "riscv64", "file:///nonexistent", &"b".repeat(64))
        .platform("linux", &node_platform().arch, &url, &sha)
        .yaml();
    run_install(&img, &yaml).unwrap();
    // an image for a platform the Shim does not list
    let img2 = image();
    let shim = parse_shims(&yaml, "shim.yaml").unwrap().remove(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let before = deep_snapshot(img2.root.path());
    let e = rt
        .block_on(image::install_offline(
            &img2.root,
            &Settings::default(),
            &shim,
            &InstallOptions {
                platform: Platform::new("linux", "s390x"),
                containerd_version: None,
                progress: false,
            },
        ))
        .unwrap_err();
    assert!(format!("{e:#}").contains("s390x"), "{e:#}");
    assert_eq!(deep_snapshot(img2.root.path()), before);
}

/// A Shim with a build for containerd before 2.0 and one for 2.0 and later.
fn two_builds(img: &Image) -> (String, String, String) {
    let old = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let new = tar_gz(&[
        Entry::File("containerd-shim-demo-v2", real_elf(), 0o755),
        Entry::File("NEW", b"2".to_vec(), 0o644),
    ]);
    let (old_url, old_sha) = write_artifact(img, "old.tgz", &old);
    let (new_url, new_sha) = write_artifact(img, "new.tgz", &new);
    let arch = node_platform().arch;
    let yaml = ShimBuilder::new("demo")
        .platform_for_containerd("linux", &arch, "<2.0", &old_url, &old_sha)
        .platform_for_containerd("linux", &arch, ">=2.0", &new_url, &new_sha)
        .yaml();
    (yaml, old_sha, new_sha)
}

#[test]
fn an_image_gets_the_build_for_the_containerd_it_runs() {
    for (version, want_new) in [("v2.3.4", true), ("1.6.20~ds1", false)] {
        let img = image();
        let (yaml, old_sha, new_sha) = two_builds(&img);
        let opts = InstallOptions {
            containerd_version: Some(version.into()),
            ..support::image_root::opts()
        };
        support::image_root::run_install_with(&img, &yaml, &opts).unwrap();
        let want = if want_new { new_sha } else { old_sha };
        assert_eq!(
            state_of(&img).shims["demo"].artifact_sha256,
            want,
            "{version}"
        );
    }
}

#[test]
fn an_image_whose_containerd_version_is_unknown_gets_no_ranged_build_and_is_unchanged() {
    let img = image();
    let (yaml, _, _) = two_builds(&img);
    // the test's image has no containerd binary to ask, and no --containerd-version was given
    assert_fails_cleanly(&img, &yaml, "--containerd-version");
}

#[test]
fn the_preflight_of_an_offline_install_reads_the_image_not_the_builder() {
    let img = image();
    // /bin/true needs libc.so.6 and its interpreter: the builder has them, the image does not
    let bytes = tar_gz(&[Entry::File(
        "containerd-shim-demo-v2",
        std::fs::read("/bin/true").unwrap(),
        0o755,
    )]);
    let (url, sha) = write_artifact(&img, "needs-libc.tgz", &bytes);
    assert_fails_cleanly(&img, &shim("demo", &url, &sha).yaml(), "libc.so.6");
}

#[test]
fn containerds_own_answer_gives_its_version() {
    use shim_agent::cli::image::parse_containerd_version;
    let debian = "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n";
    let upstream = "containerd github.com/containerd/containerd/v2 v2.3.4 a1b2c3d\n";
    assert_eq!(
        parse_containerd_version(debian).as_deref(),
        Some("1.6.20~ds1")
    );
    assert_eq!(
        parse_containerd_version(upstream).as_deref(),
        Some("v2.3.4")
    );
    assert_eq!(parse_containerd_version("runc version 1.1.5\n"), None);
    assert_eq!(parse_containerd_version(""), None);
}
