//! Installed is not working, against the real containerd of the node env (Debian's 1.6.20, or
//! 2.3.4 on scripts/test's second pass): a new handler runs a pod sandbox through CRI (and its
//! check container) before the commit; a shim missing a library is refused by the preflight
//! with no restart; a shim built for another containerd release (listed by CRI, but unable to
//! start) is rolled back to the config's bytes; a check container still running at its
//! timeout rolls back too; a crash during the check leaves no sandbox and no log directory
//! behind after the next start; one Shim with a build per containerd release installs the
//! build of this node's release.
//!
//! The shims are real: the runc shim of the node's containerd line, the runc shim of another
//! line (the node env's base rootfs has Debian's 1.6 one, `../shared/containerd/` the 2.3.4 one),
//! and a program compiled here with gcc against a library the node lacks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shim_agent::api::load::parse_shims;
use shim_agent::settings::Settings;
use shim_agent::state::Phase;
use shim_agent::txn::Change;

use crate::support::node_env::{CHECK_IMAGE, NodeEnv, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

/// A shim as an artifact: `bytes` packed as `bin/containerd-shim-demo-v2` in a .tar.gz in
/// `dir`; its URL and digest.
fn artifact(dir: &Path, name: &str, bytes: Vec<u8>) -> (String, String) {
    let tgz = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", bytes, 0o755),
    ]);
    let p = dir.join(format!("{name}.tar.gz"));
    std::fs::write(&p, &tgz).unwrap();
    (format!("file://{}", p.display()), sha256_hex(&tgz))
}

/// The runc shim of this node's containerd.
fn own_runc_shim(env: &NodeEnv) -> Vec<u8> {
    std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2")).expect("the node's runc shim")
}

/// Debian's containerd 1.6 runc shim (the node env's base rootfs keeps it).
fn debian_runc_shim() -> Vec<u8> {
    let base =
        std::env::var("INFRA_BASE").unwrap_or_else(|_| "/var/tmp/node-env/base-shim-agent".into());
    std::fs::read(Path::new(&base).join("usr/bin/containerd-shim-runc-v2"))
        .expect("Debian's runc shim in the node env's base rootfs")
}

/// containerd 2.3.4's runc shim, from the machine's containerd builds.
fn runc_shim_234() -> Vec<u8> {
    let dir = std::env::var("CONTAINERD_BUILDS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/containerd"));
    let out = std::process::Command::new(dir.join("unpack.sh"))
        .output()
        .expect("run the containerd builds' unpack.sh");
    assert!(
        out.status.success(),
        "unpack.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bins = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    std::fs::read(bins.join("containerd-shim-runc-v2-v2.3.4")).expect("the 2.3.4 runc shim")
}

/// A runc shim of another containerd line than the node's: CRI lists its handler, and it
/// cannot start a task (1.6 does not read 2.x's bootstrap answer; 2.3 refuses 1.6's shim).
fn foreign_runc_shim(env: &NodeEnv) -> Vec<u8> {
    if env.containerd.is_2x() {
        debian_runc_shim()
    } else {
        runc_shim_234()
    }
}

/// A program that needs `libshimagent-missing.so.1`, which no node has: compiled here against
/// a stub of it that is then left behind.
fn program_missing_a_library(dir: &Path) -> Vec<u8> {
    let gcc = |args: &[&str]| {
        let out = std::process::Command::new("gcc")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("gcc (on CI machines)");
        assert!(
            out.status.success(),
            "gcc {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::write(
        dir.join("lib.c"),
        "int shim_agent_missing(void) { return 0; }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("main.c"),
        "int shim_agent_missing(void);\nint main(void) { return shim_agent_missing(); }\n",
    )
    .unwrap();
    gcc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libshimagent-missing.so.1",
        "-o",
        "libshimagent-missing.so.1",
        "lib.c",
    ]);
    gcc(&["-o", "prog", "main.c", "./libshimagent-missing.so.1"]);
    std::fs::read(dir.join("prog")).unwrap()
}

fn changes(yaml: &str) -> Vec<Change> {
    parse_shims(yaml, "check.yaml")
        .unwrap()
        .into_iter()
        .map(|s| Change::Install(Box::new(s)))
        .collect()
}

/// The log directories of runtime checks on the node (`<state-dir>/checks/*`): none when the
/// directory is absent.
fn check_log_dirs(env: &NodeEnv) -> Vec<String> {
    std::fs::read_dir(env.root.join("var/lib/shim-agent/checks")).map_or_else(
        |_| Vec::new(),
        |d| {
            d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                .collect()
        },
    )
}

fn clean_agent_files(env: &NodeEnv) {
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
}

/// The check container the tests ask for: the node's busybox saying something.
const SAID: &str = "shim-agent check ok";

fn check_yaml(url: &str, sha: &str) -> String {
    ShimBuilder::new("demo")
        .artifact(url, sha)
        .check_container(
            CHECK_IMAGE,
            &["/bin/busybox", "sh", "-c", &format!("echo {SAID}")],
            Some(SAID),
            60,
        )
        .yaml()
}

#[tokio::test]
async fn a_runc_class_shim_runs_its_sandbox_and_its_check_container_before_the_commit() {
    let Some(env) =
        node_env("a_runc_class_shim_runs_its_sandbox_and_its_check_container_before_the_commit")
            .await
    else {
        return;
    };
    clean_agent_files(&env);
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "own", own_runc_shim(&env));
    let (root, settings) = (env.host_root(), Settings::default());
    let report = env
        .node(&root, &settings)
        .apply(changes(&check_yaml(&url, &sha)))
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(report.installed, ["demo"]);
    let proven = report
        .phases
        .iter()
        .find(|(p, _)| *p == Phase::Proven)
        .map(|(_, t)| *t);
    eprintln!(
        "containerd {}: the sandbox and check container of handler demo proven in {:?}",
        env.containerd.version, proven
    );
    assert!(proven.is_some(), "{:?}", report.phases);
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    let v = st.shims["demo"].shim_version.clone();
    assert!(
        v.as_deref()
            .is_some_and(|v| v.chars().any(|c| c.is_ascii_digit())),
        "the runc shim's -v: {v:?}"
    );
    assert!(
        env.check_sandboxes().await.is_empty(),
        "nothing the check made outlives it"
    );
    assert!(
        check_log_dirs(&env).is_empty(),
        "the check's log directory is gone"
    );
}

#[tokio::test]
async fn a_check_container_that_does_not_print_what_it_should_rolls_the_install_back() {
    let Some(env) =
        node_env("a_check_container_that_does_not_print_what_it_should_rolls_the_install_back")
            .await
    else {
        return;
    };
    clean_agent_files(&env);
    let original = env.config_files();
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "own", own_runc_shim(&env));
    let yaml = ShimBuilder::new("demo")
        .artifact(&url, &sha)
        .check_container(
            CHECK_IMAGE,
            &["/bin/busybox", "sh", "-c", "echo something else; exit 3"],
            Some(SAID),
            60,
        )
        .yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    let e = env
        .node(&root, &settings)
        .apply(changes(&yaml))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "ContainerCheckFailed", "{e:#}");
    let text = format!("{e:#}");
    assert!(
        text.contains("exited with code 3") && text.contains("something else"),
        "the container's own exit and output: {text}"
    );
    assert_eq!(env.config_files(), original, "the config bytes are back");
    assert!(env.check_sandboxes().await.is_empty());
}

#[tokio::test]
async fn a_check_container_still_running_at_its_timeout_rolls_the_install_back() {
    let Some(env) =
        node_env("a_check_container_still_running_at_its_timeout_rolls_the_install_back").await
    else {
        return;
    };
    clean_agent_files(&env);
    let original = env.config_files();
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "own", own_runc_shim(&env));
    let yaml = ShimBuilder::new("demo")
        .artifact(&url, &sha)
        .check_container(CHECK_IMAGE, &["/bin/busybox", "sleep", "600"], None, 2)
        .yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    let t0 = Instant::now();
    let e = env
        .node(&root, &settings)
        .apply(changes(&yaml))
        .await
        .unwrap_err();
    eprintln!(
        "containerd {}: timed out and rolled back in {:?}: {e:#}",
        env.containerd.version,
        t0.elapsed()
    );
    assert_eq!(e.reason(), "ContainerCheckFailed", "{e:#}");
    assert_eq!(e.blamed.clone(), ["demo"]);
    let text = format!("{e:#}");
    assert!(
        text.contains("still running after 2 s") && text.contains("timeoutSeconds"),
        "{text}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(120),
        "the check gave up at its timeout, not the container's end: {:?}",
        t0.elapsed()
    );
    assert!(
        env.check_sandboxes().await.is_empty(),
        "the sandbox and its sleeping container are gone"
    );
    assert!(
        check_log_dirs(&env).is_empty(),
        "{:?}",
        check_log_dirs(&env)
    );
    assert_eq!(env.config_files(), original, "the config bytes are back");
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    assert!(st.shims.is_empty() && st.journal.is_none(), "{st:?}");
}

#[tokio::test]
async fn a_shim_missing_a_library_is_refused_by_the_preflight_without_a_restart() {
    let Some(env) =
        node_env("a_shim_missing_a_library_is_refused_by_the_preflight_without_a_restart").await
    else {
        return;
    };
    clean_agent_files(&env);
    let original = env.config_files();
    let invocation = env.invocation_id().await;
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "needs-lib", program_missing_a_library(d.path()));
    let (root, settings) = (env.host_root(), Settings::default());
    let e = env
        .node(&root, &settings)
        .apply(changes(&check_yaml(&url, &sha)))
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "MissingLibraries", "{e:#}");
    assert_eq!(e.blamed.clone(), ["demo"]);
    assert!(
        format!("{e:#}").contains("libshimagent-missing.so.1"),
        "{e:#}"
    );
    assert_eq!(
        env.invocation_id().await,
        invocation,
        "containerd was not restarted"
    );
    assert_eq!(env.config_files(), original);
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    assert!(st.shims.is_empty() && st.journal.is_none(), "{st:?}");
}

#[tokio::test]
async fn a_shim_built_for_another_containerd_is_rolled_back_with_its_own_error() {
    let Some(env) =
        node_env("a_shim_built_for_another_containerd_is_rolled_back_with_its_own_error").await
    else {
        return;
    };
    clean_agent_files(&env);
    let original: BTreeMap<PathBuf, Vec<u8>> = env.config_files();
    let invocation = env.invocation_id().await;
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "foreign", foreign_runc_shim(&env));
    let yaml = ShimBuilder::new("demo").artifact(&url, &sha).yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    let t0 = Instant::now();
    let e = env
        .node(&root, &settings)
        .apply(changes(&yaml))
        .await
        .unwrap_err();
    eprintln!(
        "containerd {}: refused in {:?}: {e:#}",
        env.containerd.version,
        t0.elapsed()
    );
    assert_eq!(e.reason(), "SandboxCheckFailed", "{e:#}");
    assert_eq!(e.blamed.clone(), ["demo"]);
    let text = format!("{e:#}");
    assert!(
        text.contains("could not run a pod sandbox") && text.contains("failed to start shim"),
        "the runtime's own error: {text}"
    );
    assert_eq!(env.config_files(), original, "the config bytes are back");
    assert_ne!(
        env.invocation_id().await,
        invocation,
        "containerd went back to its old config"
    );
    let st = env.cri.status_raw(Duration::from_secs(5)).await.unwrap();
    let served = shim_agent::node::cri::status_from_response(&st)
        .unwrap()
        .handlers;
    assert!(!served.contains(&"demo".to_string()), "{served:?}");
    assert!(
        env.check_sandboxes().await.is_empty(),
        "the failed sandbox is gone too"
    );
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    assert!(st.shims.is_empty() && st.journal.is_none(), "{st:?}");
}

#[tokio::test]
async fn one_shim_with_a_build_per_containerd_release_installs_the_build_of_this_node() {
    let Some(env) =
        node_env("one_shim_with_a_build_per_containerd_release_installs_the_build_of_this_node")
            .await
    else {
        return;
    };
    clean_agent_files(&env);
    let d = tempfile::tempdir().unwrap();
    let (old_url, old_sha) = artifact(d.path(), "for-1x", debian_runc_shim());
    let (new_url, new_sha) = artifact(d.path(), "for-2x", runc_shim_234());
    let arch = shim_agent::artifact::node_platform().arch;
    let yaml = ShimBuilder::new("demo")
        .platform_for_containerd("linux", &arch, "<2.0", &old_url, &old_sha)
        .platform_for_containerd("linux", &arch, ">=2.0", &new_url, &new_sha)
        .yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    env.node(&root, &settings)
        .apply(changes(&yaml))
        .await
        .unwrap_or_else(|e| panic!("containerd {}: {e:#}", env.containerd.version));
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    let (want_sha, want_url) = if env.containerd.is_2x() {
        (&new_sha, &new_url)
    } else {
        (&old_sha, &old_url)
    };
    assert_eq!(
        (&st.shims["demo"].artifact_sha256, &st.shims["demo"].source),
        (want_sha, want_url),
        "containerd {} takes its own build",
        env.containerd.version
    );
}

/// An agent process the test started, killed when the test ends however it ends: a test that
/// fails must not leave it working on the node under the next test.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_crash_during_the_check_leaves_no_sandbox_after_the_next_start() {
    let Some(env) =
        node_env("a_crash_during_the_check_leaves_no_sandbox_after_the_next_start").await
    else {
        return;
    };
    clean_agent_files(&env);
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "own", own_runc_shim(&env));
    let yaml = ShimBuilder::new("demo")
        .artifact(&url, &sha)
        .check_container(
            CHECK_IMAGE,
            &["/bin/busybox", "sh", "-c", &format!("sleep 4; echo {SAID}")],
            Some(SAID),
            60,
        )
        .yaml();
    let file = d.path().join("demo.yaml");
    std::fs::write(&file, &yaml).unwrap();
    // the packaged binary, as a node runs it: `install` on the live node under its root
    let mut agent = KillOnDrop(
        std::process::Command::new(env!("CARGO_BIN_EXE_shim-agent"))
            .args(["install", "--root"])
            .arg(&env.root)
            .arg("--live")
            .arg("-f")
            .arg(&file)
            .env("DBUS_SYSTEM_BUS_ADDRESS", &env.bus)
            .env("CONTAINERD_ADDRESS", env.cri.socket())
            .spawn()
            .expect("start shim-agent install"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while env.check_sandboxes_of("demo").await.is_empty() {
        assert!(Instant::now() < deadline, "no check sandbox appeared");
        assert!(
            agent.0.try_wait().unwrap().is_none(),
            "the agent ended before its check"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    agent.0.kill().expect("SIGKILL the agent"); // Child::kill sends SIGKILL
    agent.0.wait().unwrap();
    let left = env.check_sandboxes().await;
    assert_eq!(
        left.len(),
        1,
        "the crash left the check's sandbox: {left:?}"
    );
    let logs_left = check_log_dirs(&env);
    assert_eq!(
        logs_left.len(),
        1,
        "the crash left the check's log directory: {logs_left:?}"
    );
    let (root, settings) = (env.host_root(), Settings::default());
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    assert_eq!(
        st.journal.as_ref().map(|j| j.phase),
        Some(Phase::Verified),
        "the journal holds the check's place"
    );

    // the next start: the leftover is swept, the journal rolled forward with a check of its own
    env.node(&root, &settings)
        .open()
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
    let all = env
        .cri
        .list_pod_sandboxes(Duration::from_secs(5))
        .await
        .unwrap();
    assert!(
        env.check_sandboxes().await.is_empty(),
        "no sandbox left after the next start: {all:?} (the crash left {left:?})"
    );
    assert!(
        check_log_dirs(&env).is_empty(),
        "no log directory left after the next start: {:?} (the crash left {logs_left:?})",
        check_log_dirs(&env)
    );
    let st = shim_agent::cli::status::read_state(&root, &settings).unwrap();
    assert!(
        st.journal.is_none() && st.shims.contains_key("demo"),
        "{st:?}"
    );
}

#[tokio::test]
async fn containerd_1x_names_its_sandbox_image_in_its_status_and_2x_does_not() {
    let Some(env) =
        node_env("containerd_1x_names_its_sandbox_image_in_its_status_and_2x_does_not").await
    else {
        return;
    };
    let st = env.cri.status_raw(Duration::from_secs(5)).await.unwrap();
    let named = shim_agent::node::cri::sandbox_image_from_verbose_info(&st.info);
    // 2.x keeps it in the image service's pinned images, which its status leaves out: a
    // node's pod check learns it from RunPodSandbox's own words there
    let expected = (!env.containerd.is_2x()).then(|| env.sandbox_image());
    assert_eq!(named, expected, "containerd {}", env.containerd.version);
}

#[tokio::test]
async fn a_node_without_its_sandbox_image_is_told_so_and_the_runtime_is_not_blamed() {
    let Some(env) =
        node_env("a_node_without_its_sandbox_image_is_told_so_and_the_runtime_is_not_blamed").await
    else {
        return;
    };
    clean_agent_files(&env);
    let original = env.config_files();
    let image = env.sandbox_image();
    // the image removed, and no registry to pull it from (this machine has no network)
    env.remove_images(
        &env.image_refs()
            .into_iter()
            .filter(|r| r == &image || r.contains("pause"))
            .collect::<Vec<_>>(),
    );
    let d = tempfile::tempdir().unwrap();
    let (url, sha) = artifact(d.path(), "own", own_runc_shim(&env));
    let yaml = ShimBuilder::new("demo").artifact(&url, &sha).yaml();
    let (root, settings) = (env.host_root(), Settings::default());
    let t0 = Instant::now();
    let e = env
        .node(&root, &settings)
        .apply(changes(&yaml))
        .await
        .unwrap_err();
    env.ensure_images(); // back for the tests after this one
    eprintln!(
        "containerd {}: told in {:?}: {e:#}",
        env.containerd.version,
        t0.elapsed()
    );
    assert_eq!(e.reason(), "NoSandboxImage", "{e:#}");
    let text = format!("{e:#}");
    assert!(
        text.contains(&image) && text.contains("not to blame"),
        "{text}"
    );
    assert_eq!(
        env.config_files(),
        original,
        "the config bytes are as before"
    );
    assert!(env.check_sandboxes().await.is_empty());
}
