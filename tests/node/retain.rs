//! Running workloads survive upgrades and uninstalls, on the real containerd of the node env
//! (Debian's 1.6.20, or an upstream 2.x build).
//!
//! containerd reloads each running task at its next restart through the shim path the task
//! was started with (its bundle's `shim-binary-path`), and drops the task when that file is
//! gone. So a replaced or removed shim version must stay while a task runs through it, and go
//! once none does. Here a container runs through version 1 of the installed shim while the
//! Shim is upgraded and containerd restarted twice more; then it exits and the next
//! transaction (another Shim's install, on a store opened while the container still ran)
//! collects version 1. The same after an uninstall. Without retention the container is gone
//! after the first restart that follows the upgrade.
//!
//! Skipped with a reason when no node env runs, unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI).

use std::path::Path;

use shim_agent::hostroot::HostRoot;
use shim_agent::node::{RuntimeHealth, ServiceManager};
use shim_agent::settings::Settings;
use shim_agent::state::NodeState;
use shim_agent::txn::Change;

use crate::support::node_env::{NodeEnv, RESTART_TIMEOUT, UNIT, VERIFY_TIMEOUT, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

/// The containerd namespace the kubelet's containers live in.
const NS: &str = "k8s.io";

fn clean_agent_files(env: &NodeEnv) {
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
}

/// The node's runc shim as `containerd-shim-demo-v2`, with a `VERSION` file: each version is
/// another artifact digest.
fn artifact(env: &NodeEnv, dir: &Path, version: &str) -> (String, String) {
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2"))
        .expect("runc shim in the rootfs");
    let bytes = tar_gz(&[
        Entry::File("containerd-shim-demo-v2", shim, 0o755),
        Entry::File("VERSION", version.as_bytes().to_vec(), 0o644),
    ]);
    let p = dir.join(format!("demo-{version}.tar.gz"));
    std::fs::write(&p, &bytes).unwrap();
    (format!("file://{}", p.display()), sha256_hex(&bytes))
}

fn install(url: &str, sha: &str) -> Vec<Change> {
    let shim = ShimBuilder::new("demo").artifact(url, sha).build();
    vec![Change::Install(Box::new(shim))]
}

fn read_state(root: &HostRoot) -> NodeState {
    shim_agent::cli::status::read_state(root, &Settings::default()).unwrap()
}

/// A container that keeps running, started through the shim binary at `bin`.
fn start_container(env: &NodeEnv, bin: &str, id: &str) {
    remove_container(env, id);
    env.exec_ok(&[
        "ctr",
        "-n",
        NS,
        "run",
        "-d",
        "--cpu-shares",
        "0",
        "--runtime",
        bin,
        "--rootfs",
        "/srv/bbroot",
        id,
        "/bin/sleep",
        "100000",
    ]);
    assert_eq!(task_status(env, id).as_deref(), Some("RUNNING"));
}

/// The task's status as `ctr tasks ls` shows it (`None`: containerd has no such task).
fn task_status(env: &NodeEnv, id: &str) -> Option<String> {
    let out = env.exec_ok(&["ctr", "-n", NS, "tasks", "ls"]);
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cols| cols.first() == Some(&id))
        .and_then(|cols| cols.last().map(|s| s.to_string()))
}

/// The container exits and is removed, as the kubelet removes a finished pod's.
fn remove_container(env: &NodeEnv, id: &str) {
    let _ = env.exec(&["ctr", "-n", NS, "tasks", "kill", "-s", "SIGKILL", id]);
    for _ in 0..50 {
        let _ = env.exec(&["ctr", "-n", NS, "tasks", "rm", "-f", id]);
        if task_status(env, id).is_none() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = env.exec(&["ctr", "-n", NS, "containers", "rm", id]);
}

async fn restart_containerd(env: &NodeEnv) {
    let out = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .expect("restart containerd");
    assert_eq!(out.state.active_state, "active", "{out:?}");
    env.cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .expect("CRI is back");
}

#[tokio::test]
async fn a_container_on_version_1_survives_the_upgrade_and_two_more_restarts_and_the_next_transaction_after_it_exits_removes_version_1()
 {
    let Some(env) = node_env("retain_upgrade").await else {
        return;
    };
    clean_agent_files(&env);
    let tmp = tempfile::tempdir().unwrap();
    let root = env.host_root();
    let settings = Settings::default();
    let (url1, sha1) = artifact(&env, tmp.path(), "1");
    let n = env.node(&root, &settings);
    n.apply(install(&url1, &sha1)).await.unwrap();
    let v1 = read_state(&root).shims["demo"].clone();
    let v1_dir = root
        .resolve(Path::new(&v1.binary).parent().unwrap())
        .unwrap();
    // ids of this run: a container an interrupted run left behind is not in the way
    let on_v1 = &format!("on-v1-{}", std::process::id());
    let on_v2 = &format!("on-v2-{}", std::process::id());
    start_container(&env, &v1.binary, on_v1);

    // the upgrade restarts containerd with version 2; version 1 stays, and says why
    let (url2, sha2) = artifact(&env, tmp.path(), "2");
    let report = n.apply(install(&url2, &sha2)).await.unwrap();
    assert_eq!(
        (report.installed.clone(), report.restarts),
        (vec!["demo".to_string()], 1)
    );
    let st = read_state(&root);
    assert!(st.shims["demo"].binary.contains(&sha2));
    assert!(
        v1_dir.join("containerd-shim-demo-v2").exists(),
        "version 1 is kept"
    );
    assert_eq!(st.retained.len(), 1, "{st:?}");
    assert_eq!(st.retained[0].digest, sha1);
    assert_eq!(st.retained[0].tasks, vec![format!("{NS}/{on_v1}")]);
    let status = shim_agent::cli::status::format_status_table(&st);
    assert!(
        status.contains(&format!("1 task run through it: k8s.io/{on_v1}")),
        "{status}"
    );
    assert_eq!(task_status(&env, on_v1).as_deref(), Some("RUNNING"));

    // two more restarts (another Shim's install, say), and collections in between
    for _ in 0..2 {
        restart_containerd(&env).await;
        assert_eq!(
            task_status(&env, on_v1).as_deref(),
            Some("RUNNING"),
            "containerd reloaded the task through version 1"
        );
        let (store, mut state) = n.open().await.unwrap();
        n.collect_retained(&store, &mut state).unwrap();
        assert_eq!(state.retained.len(), 1);
    }

    // the container exits while the engine is open: the next transaction (another Shim's
    // install) collects version 1 when it ends, without the engine being opened again;
    // version 2 stays
    {
        let (store, mut state) = n.open().await.unwrap();
        assert_eq!(
            state.retained.len(),
            1,
            "still running: {:?}",
            state.retained
        );
        remove_container(&env, on_v1);
        assert!(
            v1_dir.exists(),
            "nothing collects before the next transaction"
        );
        let (url3, sha3) = artifact(&env, tmp.path(), "other");
        let other = ShimBuilder::new("other").artifact(&url3, &sha3).build();
        let report = n
            .apply_with(&store, &mut state, vec![Change::Install(Box::new(other))])
            .await
            .unwrap();
        assert_eq!(report.installed, ["other"]);
        assert!(state.retained.is_empty(), "{:?}", state.retained);
        assert!(read_state(&root).retained.is_empty());
        assert!(!v1_dir.exists(), "version 1's files are gone");
        assert!(root.resolve(&state.shims["demo"].binary).unwrap().exists());
    }

    // the same after an uninstall: a container on version 2 keeps it past the uninstall
    let v2 = read_state(&root).shims["demo"].clone();
    let v2_dir = root
        .resolve(Path::new(&v2.binary).parent().unwrap())
        .unwrap();
    start_container(&env, &v2.binary, on_v2);
    let report = n
        .apply(vec![
            Change::Uninstall("demo".into()),
            Change::Uninstall("other".into()),
        ])
        .await
        .unwrap();
    assert_eq!(report.removed, ["demo", "other"]);
    let st = read_state(&root);
    assert!(st.shims.is_empty());
    assert_eq!(st.retained.len(), 1, "{st:?}");
    assert!(v2_dir.exists(), "version 2 is kept while on-v2 runs");
    restart_containerd(&env).await;
    restart_containerd(&env).await;
    assert_eq!(task_status(&env, on_v2).as_deref(), Some("RUNNING"));
    remove_container(&env, on_v2);
    let (_store, state) = n.open().await.unwrap();
    assert!(state.retained.is_empty(), "{:?}", state.retained);
    assert!(!v2_dir.exists(), "version 2's files are gone");
    assert!(
        !root.resolve("/opt/shim-agent/shims/demo").unwrap().exists(),
        "nothing of the Shim is left"
    );
    // and containerd still comes back
    restart_containerd(&env).await;
}
