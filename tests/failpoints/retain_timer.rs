//! Retained versions are collected on a timer: the static-mode daemon (`shim-agent run`
//! without a cluster), run in this process on tokio's paused clock, removes a replaced version
//! whose last task ended with no transaction, no file event and no restart to trigger it,
//! [`RETAIN_CHECK_SECS`] after its last look, and not before.
//!
//! In this group because it runs the transaction engine: failpoints are process-wide, so it
//! takes its turn with the crash tests ([`crate::serial`]); it configures none.
#![cfg(feature = "failpoints")]

use std::path::Path;
use std::time::Duration;

use shim_agent::api::load::parse_shims;
use shim_agent::node::tasks::{SHIM_PATH_FILE, TASK_DIR};
use shim_agent::txn::Change;
use shim_agent::txn::retain::RETAIN_CHECK_SECS;

use crate::serial;
use crate::support::live::*;

/// Static Shim `spin` holding `version`: its manifest written into `shims.d`, and the same
/// Shim as an install.
fn static_shim(w: &World, version: &str) -> Change {
    let yaml = shim_builder(w, "spin", version).yaml();
    let dir = w.root.resolve(&w.settings.paths.static_shims_dir).unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("spin.yaml"), &yaml).unwrap();
    let shim = parse_shims(&yaml, "spin.yaml").unwrap().remove(0);
    Change::Install(Box::new(shim))
}

fn on_disk(w: &World, host_path: &str) -> bool {
    w.root.resolve(host_path).unwrap().exists()
}

#[test]
fn the_static_daemon_collects_a_retained_version_whose_tasks_are_gone_on_its_timer_alone() {
    let _serial = serial();
    let w = world();
    let f = fake(&w);
    // version 1 of the static Shim, a task through it, then the upgrade to version 2: version
    // 1 is retained for its task
    block(node(&w, &f).apply(vec![static_shim(&w, "1")])).unwrap();
    let v1 = state(&w).shims["spin"].clone();
    let bundle = w
        .root
        .resolve(
            Path::new("/run/containerd")
                .join(TASK_DIR)
                .join("k8s.io")
                .join("pod-on-v1"),
        )
        .unwrap();
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::write(bundle.join(SHIM_PATH_FILE), &v1.binary).unwrap();
    block(node(&w, &f).apply(vec![static_shim(&w, "2")])).unwrap();
    let st = state(&w);
    let v2 = st.shims["spin"].clone();
    assert_ne!(v2.artifact_sha256, v1.artifact_sha256);
    assert_eq!(st.retained.len(), 1, "{:?}", st.retained);
    assert_eq!(st.retained[0].digest, v1.artifact_sha256);
    let restarts = *f.restarts.borrow();
    let v1_dir = st.retained[0].dir.clone();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let n = node(&w, &f);
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let daemon = shim_agent::daemon::run(&n, stopped);
        let test = async {
            // the daemon started: recovered nothing, changed nothing, kept version 1
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert!(on_disk(&w, &v1.binary), "version 1 went while its task ran");
            assert_eq!(state(&w).retained.len(), 1);

            // the task ends; nothing else happens on the node
            std::fs::remove_dir_all(&bundle).unwrap();
            tokio::time::sleep(Duration::from_secs(RETAIN_CHECK_SECS - 2)).await;
            assert!(
                on_disk(&w, &v1.binary),
                "collected before the timer: something else triggered it"
            );
            assert_eq!(state(&w).retained.len(), 1);

            // the timer fires: version 1 is collected
            tokio::time::sleep(Duration::from_secs(2)).await;
            let st = state(&w);
            assert!(st.retained.is_empty(), "{:?}", st.retained);
            assert!(
                !on_disk(&w, &v1_dir),
                "version 1 still on disk {RETAIN_CHECK_SECS} s after its task ended"
            );
            stop.send(true).unwrap();
        };
        let (ran, ()) = tokio::join!(daemon, test);
        ran.unwrap();
    });

    // no transaction did it: no restart, no journal, version 2 untouched
    assert_eq!(*f.restarts.borrow(), restarts, "containerd was restarted");
    let st = state(&w);
    assert!(st.journal.is_none());
    assert_eq!(st.shims["spin"], v2);
    assert!(on_disk(&w, &v2.binary));
}
