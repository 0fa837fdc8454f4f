//! Live transactions against the real systemd 252 and containerd of the node env
//! (`.ci/node-env/`: Debian's 1.6.20 with its version 2 config, or an upstream 2.x build with
//! its default version 3/4 config, where the agent adds its handler as a drop-in in
//! `/etc/containerd/conf.d/`). The agent runs on the host with the container's root as its
//! HostRoot, the container's system bus and containerd's socket: exactly the code a node runs,
//! with paths under a root. Skipped with a reason when no node env runs, unless
//! `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI).
//!
//! Covered: install (CRI serves the handler, `ctr run` through the new shim), no-op, upgrade,
//! a refused upgrade rolled back to the old version, uninstall to the original bytes; a restart
//! refused by the unit and a broken CRI, both rolled back; the agent killed at every failpoint
//! (with `--features failpoints`) and made consistent by its next start; drift repair by `run`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use shim_agent::api::load::parse_shims;
use shim_agent::hostroot::HostRoot;
use shim_agent::node::{RuntimeHealth, ServiceManager};
use shim_agent::settings::Settings;
use shim_agent::state::NodeState;
use shim_agent::txn::Change;

#[cfg(feature = "failpoints")] // the crash test
use crate::support;
use crate::support::node_env::{CONF_D, NodeEnv, UNIT, VERIFY_TIMEOUT, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

/// Remove everything an earlier test's agent left in the container.
fn clean_agent_files(env: &NodeEnv) {
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
}

/// What each live-transaction test starts from: a node without an earlier test's agent files,
/// the demo artifact (version 1) on the host, and the node's config files as they were.
struct Start {
    env: NodeEnv,
    /// Holds the artifact: kept until the test ends.
    tmp: tempfile::TempDir,
    url: String,
    sha: String,
    root: HostRoot,
    settings: Settings,
    original: BTreeMap<PathBuf, Vec<u8>>,
}

/// [`Start`] on the node env for test `name`; `None` (skipped) when no node env runs.
async fn start(name: &str) -> Option<Start> {
    let env = node_env(name).await?;
    clean_agent_files(&env);
    let tmp = tempfile::tempdir().unwrap();
    let (url, sha) = demo_artifact(&env, tmp.path());
    Some(Start {
        root: env.host_root(),
        settings: Settings::default(),
        original: env.config_files(),
        env,
        tmp,
        url,
        sha,
    })
}

/// The node's runc shim (of the node's containerd) packaged as `containerd-shim-demo-v2` in a
/// .tar.gz on the host.
fn demo_artifact(env: &NodeEnv, dir: &Path) -> (String, String) {
    demo_artifact_version(env, dir, "1")
}

/// [`demo_artifact`] with a `VERSION` file: another version, another artifact digest.
fn demo_artifact_version(env: &NodeEnv, dir: &Path, version: &str) -> (String, String) {
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2"))
        .expect("runc shim in the rootfs");
    let bytes = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", shim, 0o755),
        Entry::File("VERSION", version.as_bytes().to_vec(), 0o644),
    ]);
    let p = dir.join(format!("demo-{version}.tar.gz"));
    std::fs::write(&p, &bytes).unwrap();
    (format!("file://{}", p.display()), sha256_hex(&bytes))
}

/// `ctr run` of a busybox container through the shim at `bin` (its runtime, by path).
fn ctr_run_through(env: &NodeEnv, bin: &str, id: &str) {
    let out = env.exec(&[
        "ctr",
        "run",
        "--rm",
        "--cpu-shares",
        "0",
        "--runtime",
        bin,
        "--rootfs",
        "/srv/bbroot",
        id,
        "/bin/echo",
        "hello-from-demo-shim",
    ]);
    assert!(
        out.status.success(),
        "ctr run through {bin}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("hello-from-demo-shim"));
}

/// Where the agent put the handler: the main config in place (version 2), or its drop-in in
/// the `conf.d/` containerd 2.x's default config imports (version 3 and later), leaving the
/// main file as it was.
fn assert_handler_placed(env: &NodeEnv, original: &BTreeMap<PathBuf, Vec<u8>>, handler: &str) {
    let now = env.config_files();
    let main = PathBuf::from("etc/containerd/config.toml");
    let dropin = Path::new(CONF_D).join(format!("shim-agent-{handler}.toml"));
    if env.containerd.config_version >= 3 {
        assert_eq!(
            now[&main], original[&main],
            "the main config is left as it was"
        );
        let text = String::from_utf8_lossy(&now[&dropin]).into_owned();
        assert!(text.contains(&format!("handler {handler}")), "{text}");
    } else {
        assert_ne!(
            now[&main], original[&main],
            "the handler is in the main config"
        );
        assert!(!now.contains_key(&dropin));
    }
}

/// The demo Shim. Without `runtime.options`: containerd 1.x hands a handler whose runtime type
/// is a path its options as `runtimeoptions.v1.Options`, which the runc shim cannot decode
/// ("type with url runtimeoptions.v1.Options: not found"), so a `BinaryName` made every pod of
/// the handler fail; these tests used to install it anyway, and the sandbox check now refuses
/// such a shim (tests/node/check.rs). The runc shim finds /usr/sbin/runc on its PATH.
fn demo_yaml(url: &str, sha: &str) -> String {
    ShimBuilder::new("demo").artifact(url, sha).yaml()
}

fn install_change(yaml: &str) -> Vec<Change> {
    parse_shims(yaml, "demo.yaml")
        .unwrap()
        .into_iter()
        .map(|s| Change::Install(Box::new(s)))
        .collect()
}

fn read_state(root: &HostRoot) -> NodeState {
    shim_agent::cli::status::read_state(root, &Settings::default()).unwrap()
}

async fn invocation(env: &NodeEnv) -> String {
    env.systemd
        .unit_state(UNIT)
        .await
        .expect("unit state")
        .invocation_id
}

#[tokio::test]
async fn install_restarts_over_dbus_cri_serves_the_handler_and_ctr_runs_through_the_new_shim() {
    let Some(Start {
        env,
        url,
        sha,
        root,
        settings,
        original,
        tmp: _tmp,
    }) = start("txn_install").await
    else {
        return;
    };
    let before = invocation(&env).await;

    let report = env
        .node(&root, &settings)
        .apply(install_change(&demo_yaml(&url, &sha)))
        .await
        .unwrap();
    assert_eq!(report.installed, ["demo"]);
    assert_ne!(invocation(&env).await, before, "containerd was restarted");
    assert_handler_placed(&env, &original, "demo");
    let st = env.cri.status(Duration::from_secs(2)).await.unwrap();
    assert!(
        st.runtime_ready
            && st.handlers.contains(&"demo".to_string())
            && st.handlers.contains(&"runc".to_string()),
        "{st:?}"
    );

    // a container through the new shim, by its runtime (the installed binary's path)
    let bin = read_state(&root).shims["demo"].binary.clone();
    ctr_run_through(&env, &bin, "demo-ctr");

    // nothing changed: no restart
    let inv = invocation(&env).await;
    let report = env
        .node(&root, &settings)
        .apply(install_change(&demo_yaml(&url, &sha)))
        .await
        .unwrap();
    assert_eq!(report.unchanged, ["demo"]);
    assert_eq!(
        invocation(&env).await,
        inv,
        "no restart when nothing changed"
    );

    // uninstall: the exact original bytes, containerd no longer serves the handler
    let report = env
        .node(&root, &settings)
        .apply(vec![Change::Uninstall("demo".into())])
        .await
        .unwrap();
    assert_eq!(report.removed, ["demo"]);
    assert_eq!(env.config_files(), original);
    assert!(!root.resolve(&bin).unwrap().exists());
    let st = env.cri.status(Duration::from_secs(2)).await.unwrap();
    assert_eq!(st.handlers, ["runc"]);
}

#[tokio::test]
async fn an_upgrade_switches_the_served_binary_and_a_refused_one_keeps_the_old_version() {
    let Some(Start {
        env,
        tmp,
        url: url1,
        sha: sha1,
        root,
        settings,
        original,
    }) = start("txn_upgrade").await
    else {
        return;
    };
    env.node(&root, &settings)
        .apply(install_change(&demo_yaml(&url1, &sha1)))
        .await
        .unwrap();
    let v1 = read_state(&root).shims["demo"].clone();

    // version 2: a restart, the config names only the new binary, the old one is gone
    let (url2, sha2) = demo_artifact_version(&env, tmp.path(), "2");
    let before = invocation(&env).await;
    let report = env
        .node(&root, &settings)
        .apply(install_change(&demo_yaml(&url2, &sha2)))
        .await
        .unwrap();
    assert_eq!(report.installed, ["demo"], "{report:?}");
    assert_eq!(report.restarts, 1, "{report:?}");
    assert_ne!(invocation(&env).await, before, "containerd was restarted");
    let v2 = read_state(&root).shims["demo"].clone();
    assert_ne!(v1.binary, v2.binary);
    assert!(v2.binary.contains(&sha2), "{}", v2.binary);
    let cfg = env.config_text();
    assert!(
        cfg.contains(&v2.binary) && !cfg.contains(&v1.binary),
        "the config names the new binary only:\n{cfg}"
    );
    assert!(root.resolve(&v2.binary).unwrap().exists());
    assert!(
        !root.resolve(&v1.binary).unwrap().exists(),
        "the old binary is removed"
    );
    assert_handler_placed(&env, &original, "demo");
    env.cri
        .wait_for_handler("demo", VERIFY_TIMEOUT)
        .await
        .expect("CRI serves demo after the upgrade");
    ctr_run_through(&env, &v2.binary, "demo-upgraded");
    let upgraded = env.config_files();

    // version 3 is refused by the unit (a site policy naming its digest): rolled back to 2
    let (url3, sha3) = demo_artifact_version(&env, tmp.path(), "3");
    env.add_unit_dropin(
        "refuse-v3",
        &format!(
            "[Service]\nExecStartPre=/bin/sh -c '! grep -rqs {sha3} /etc/containerd/config.toml /etc/containerd/conf.d'\n"
        ),
    )
    .await;
    let e = format!(
        "{:#}",
        env.node(&root, &settings)
            .apply(install_change(&demo_yaml(&url3, &sha3)))
            .await
            .unwrap_err()
    );
    assert!(e.contains("rolled back"), "{e}");
    assert_eq!(
        env.config_files(),
        upgraded,
        "version 2's config, byte for byte"
    );
    let st = read_state(&root);
    assert!(st.journal.is_none(), "{st:?}");
    assert_eq!(
        st.shims["demo"].binary, v2.binary,
        "version 2 stays installed"
    );
    assert!(root.resolve(&v2.binary).unwrap().exists());
    assert!(
        !root
            .resolve(v2.binary.replace(&sha2, &sha3))
            .unwrap()
            .exists(),
        "version 3's binary is not left behind"
    );
    assert_eq!(
        env.systemd.unit_state(UNIT).await.unwrap().active_state,
        "active"
    );
    env.cri
        .wait_for_handler("demo", VERIFY_TIMEOUT)
        .await
        .expect("CRI serves demo (version 2) after the rollback");
    ctr_run_through(&env, &v2.binary, "demo-rolled-back");
    env.remove_unit_dropin("refuse-v3").await;

    let report = env
        .node(&root, &settings)
        .apply(vec![Change::Uninstall("demo".into())])
        .await
        .unwrap();
    assert_eq!(report.removed, ["demo"]);
    assert_eq!(env.config_files(), original);
}

#[tokio::test]
async fn a_restart_refused_by_the_unit_is_rolled_back_and_the_error_names_the_result() {
    let Some(Start {
        env,
        url,
        sha,
        root,
        settings,
        original,
        tmp: _tmp,
    }) = start("txn_failed_restart").await
    else {
        return;
    };
    // refuse any config that names the new handler (a site policy check, say)
    env.add_unit_dropin(
        "refuse-demo",
        "[Service]\nExecStartPre=/bin/sh -c '! grep -rqs \"handler demo\" /etc/containerd/config.toml /etc/containerd/conf.d'\n",
    )
    .await;
    let e = format!(
        "{:#}",
        env.node(&root, &settings)
            .apply(install_change(&demo_yaml(&url, &sha)))
            .await
            .unwrap_err()
    );
    println!("error as the node owner sees it: {e}");
    assert!(
        e.contains("containerd.service") && e.contains("failed") && e.contains("rolled back"),
        "{e}"
    );
    assert_eq!(env.config_files(), original, "original config bytes");
    let unit = env.systemd.unit_state(UNIT).await.unwrap();
    assert_eq!(unit.active_state, "active", "{unit:?}");
    env.cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .expect("CRI serves runc again");
    let st = read_state(&root);
    assert!(st.journal.is_none() && st.shims.is_empty(), "{st:?}");
    env.remove_unit_dropin("refuse-demo").await;
}

/// The unit's `ExecStartPre` that breaks CRI when the demo handler is configured (in the node).
const BREAK_SCRIPT: &str = "/usr/local/sbin/shim-agent-test-break-cri";
/// containerd 2.x: the drop-in it writes, read after the agent's `shim-agent-demo.toml`.
const BREAK_DROPIN: &str = "/etc/containerd/conf.d/zz-shim-agent-test-break-cri.toml";

#[tokio::test]
async fn an_active_containerd_whose_cri_is_broken_is_detected_and_rolled_back() {
    let Some(Start {
        env,
        url,
        sha,
        root,
        settings,
        original,
        tmp: _tmp,
    }) = start("txn_cri_broken").await
    else {
        return;
    };
    // With the new handler present, make containerd start with a CRI runtime config that fails
    // validation (default runtime not configured): the unit is active, CRI is not. 1.x: a table
    // appended to the main config (the rollback writes the original bytes back); 2.x: a drop-in
    // read after the agent's, removed again once the handler is gone.
    let breaker = if env.containerd.config_version >= 3 {
        format!(
            "printf \"version = {}\\n[{}.containerd]\\ndefault_runtime_name = 'nope'\\n\" >{BREAK_DROPIN}",
            env.containerd.config_version,
            env.containerd.cri_runtime_table()
        )
    } else {
        format!(
            "printf '\\n[{}.containerd]\\ndefault_runtime_name = \"nope\"\\n' >>/etc/containerd/config.toml",
            env.containerd.cri_runtime_table()
        )
    };
    let script = format!(
        "#!/bin/sh\nif grep -rqs 'handler demo' /etc/containerd/config.toml /etc/containerd/conf.d; then\n  {breaker}\nelse\n  rm -f {BREAK_DROPIN}\nfi\n"
    );
    let script_path = env.root.join(BREAK_SCRIPT.trim_start_matches('/'));
    std::fs::write(&script_path, script).unwrap();
    std::fs::set_permissions(&script_path, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.add_unit_dropin(
        "break-cri",
        &format!("[Service]\nExecStartPre={BREAK_SCRIPT}\n"),
    )
    .await;
    let e = format!(
        "{:#}",
        env.node(&root, &settings)
            .apply(install_change(&demo_yaml(&url, &sha)))
            .await
            .unwrap_err()
    );
    assert!(e.contains("rolled back"), "{e}");
    assert!(
        e.contains("CriUnavailable")
            || e.contains("RuntimeNotReady")
            || e.contains("HandlerMissing"),
        "{e}"
    );
    assert_eq!(env.config_files(), original);
    assert_eq!(
        env.systemd.unit_state(UNIT).await.unwrap().active_state,
        "active"
    );
    env.cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .expect("CRI healthy after the rollback");
    env.remove_unit_dropin("break-cri").await;
    std::fs::remove_file(&script_path).unwrap();
}

#[cfg(feature = "failpoints")]
/// The phases a killed agent can leave the journal in, with the failpoint that stops it there.
const CRASH_POINTS: &[(&str, &str)] = &[
    ("txn::planned", "planned"),
    ("txn::slot-acquired", "slot-acquired"),
    ("txn::staged", "staged"),
    ("txn::write_config", "staged"),
    ("txn::applied", "applied"),
    ("txn::restarted", "restarted"),
    ("txn::verified", "verified"),
    ("txn::committed", "committed"),
];

/// The environment an agent process needs to reach the node env's systemd and containerd.
fn agent_vars(env: &NodeEnv) -> Vec<(&'static str, String)> {
    vec![
        ("DBUS_SYSTEM_BUS_ADDRESS", env.bus.clone()),
        ("CONTAINERD_ADDRESS", env.cri.socket().display().to_string()),
    ]
}

fn agent(env_vars: &[(&str, String)], args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_shim-agent"));
    c.args(args).env_remove("SHIM_AGENT_CONFIG");
    for (k, v) in env_vars {
        c.env(k, v);
    }
    c
}

#[cfg(feature = "failpoints")]
fn journal_phase(root: &Path) -> Option<String> {
    let bytes = std::fs::read(root.join("var/lib/shim-agent/state.json")).ok()?;
    let st = shim_agent::state::decode_document(&bytes).ok()?;
    st.journal.map(|j| {
        serde_json::to_value(j.phase)
            .unwrap()
            .as_str()
            .unwrap()
            .to_string()
    })
}

#[cfg(feature = "failpoints")]
#[tokio::test]
async fn an_agent_killed_at_any_failpoint_leaves_a_node_the_next_start_makes_consistent() {
    let Some(env) = node_env("txn_crash").await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (url, sha) = demo_artifact(&env, tmp.path());
    let yaml = tmp.path().join("demo.yaml");
    std::fs::write(&yaml, demo_yaml(&url, &sha)).unwrap();
    let vars = agent_vars(&env);
    let root_s = env.root.display().to_string();
    let original = env.config_files();
    for (fp, phase) in CRASH_POINTS {
        env.reset().await;
        clean_agent_files(&env);
        let mut child = agent(
            &vars,
            &[
                "install",
                "--root",
                &root_s,
                "--live",
                "-f",
                yaml.to_str().unwrap(),
            ],
        )
        .env("FAILPOINTS", format!("{fp}=sleep(60000)"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
        // wait until the journal on disk shows the phase, then kill -9
        let mut seen = None;
        for _ in 0..600 {
            seen = journal_phase(&env.root);
            if seen.as_deref() == Some(phase) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(
            seen.as_deref(),
            Some(*phase),
            "{fp}: journal on disk when killed"
        );

        // start again: the agent recovers from the journal, then converges
        let out = agent(
            &vars,
            &[
                "install",
                "--root",
                &root_s,
                "--live",
                "-f",
                yaml.to_str().unwrap(),
            ],
        )
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{fp}: restart of the agent: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let root = env.host_root();
        let st = read_state(&root);
        assert!(st.journal.is_none(), "{fp}: journal closed");
        let cfg = env.config_text();
        for line in cfg.lines() {
            if let Some(p) = support::live::named_binary(line) {
                assert!(
                    root.resolve(p.trim_end_matches('"')).unwrap().exists(),
                    "{fp}: config names a missing binary"
                );
            }
        }
        let rec = &st.shims["demo"];
        assert_eq!(
            cfg.matches("/opt/shim-agent/shims/demo/").count(),
            1,
            "{fp}: one version in the config"
        );
        assert!(cfg.contains(&rec.binary), "{fp}");
        assert_eq!(
            env.systemd.unit_state(UNIT).await.unwrap().active_state,
            "active",
            "{fp}"
        );
        env.cri
            .wait_for_handler("demo", VERIFY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{fp}: {e}"));

        // and an uninstall still gives back the original bytes
        let out = agent(&vars, &["uninstall", "--root", &root_s, "--live", "demo"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{fp}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(env.config_files(), original, "{fp}");
    }
}

#[tokio::test]
async fn run_repairs_drift_and_does_not_restart_for_unrelated_changes() {
    // `_tmp` holds the artifact until the test ends (`..` would drop it at once)
    let Some(Start {
        env,
        url,
        sha,
        tmp: _tmp,
        ..
    }) = start("txn_run_drift").await
    else {
        return;
    };
    let shims_d: PathBuf = env.root.join("etc/shim-agent/shims.d");
    std::fs::create_dir_all(&shims_d).unwrap();
    std::fs::write(shims_d.join("demo.yaml"), demo_yaml(&url, &sha)).unwrap();
    let vars = agent_vars(&env);
    let root_s = env.root.display().to_string();
    let original = env.config_files();
    let mut child = KillOnDrop(
        agent(&vars, &["run", "--root", &root_s])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );

    async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
        for _ in 0..150 {
            if f().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("timed out waiting for {what}");
    }
    let cri = env.cri.clone();
    until("the static Shim to be served", async || {
        cri.status(Duration::from_secs(1))
            .await
            .is_ok_and(|s| s.handlers.contains(&"demo".to_string()))
    })
    .await;
    let installed_cfg = env.config_files();

    // unrelated change next to containerd's config: no restart
    let inv = invocation(&env).await;
    std::fs::write(env.root.join("etc/containerd/README.local"), "not a config").unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        invocation(&env).await,
        inv,
        "no restart for an unrelated file"
    );

    // someone removes the handler (puts back the pristine config): put back, with a restart
    env.restore_config();
    until("the handler to be put back", async || {
        env.config_files() == installed_cfg
    })
    .await;
    // the config is written before the restart: wait for the restart itself
    until("the repair to restart containerd", async || {
        invocation(&env).await != inv
    })
    .await;
    let cri = env.cri.clone();
    until("containerd to serve demo again", async || {
        cri.status(Duration::from_secs(1))
            .await
            .is_ok_and(|s| s.handlers.contains(&"demo".to_string()))
    })
    .await;
    // and the repair to end: after the restart it proves the handler (a pod sandbox) before it
    // commits; a binary deleted while it proves makes the check fail and the repair roll back
    until("the repair to commit", async || {
        read_state(&env.host_root()).journal.is_none()
    })
    .await;

    // the binary is deleted: put back without a restart
    let inv = invocation(&env).await;
    let bin = read_state(&env.host_root()).shims["demo"].binary.clone();
    let local = env.host_root().resolve(&bin).unwrap();
    std::fs::remove_file(&local).unwrap();
    until("the binary to be put back", async || local.exists()).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        invocation(&env).await,
        inv,
        "a binary repair needs no restart"
    );

    // the Shim file goes: uninstalled, original bytes back
    std::fs::remove_file(shims_d.join("demo.yaml")).unwrap();
    until("the uninstall", async || env.config_files() == original).await;
    sigterm(child.0.id());
    let status = child.0.wait().unwrap();
    assert!(status.success(), "run exits 0 on SIGTERM: {status:?}");
}

/// A child process killed when the test ends (also when it fails), so that no agent outlives it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// SIGTERM without a libc dependency: `kill -TERM`.
fn sigterm(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}
