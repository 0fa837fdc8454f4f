//! The cluster agent collects a retained version on its own timer: a version replaced while a
//! containerd task runs through it stays in the node's report, and once the task ends it goes
//! within the agent's retained-versions check (`txn::retain::RETAIN_CHECK_SECS`), with no new
//! transaction and no restart of the agent.

use std::path::Path;

use kube::ResourceExt;
use shim_agent::artifact::version_dir;
use shim_agent::cluster::STATE_ANNOTATION;
use shim_agent::cluster::nodestate::{ShimNodeState, parse_states};
use shim_agent::node::tasks::{SHIM_PATH_FILE, TASK_DIR};
use shim_agent::txn::retain::RETAIN_CHECK_SECS;

use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

/// `shim` as the node's report (its state annotation) says now.
async fn reported(rig: &Rig, shim: &str) -> Option<ShimNodeState> {
    let node = rig.node().await;
    node.annotations().get(STATE_ANNOTATION)?;
    parse_states(node.metadata.annotations.as_ref()).remove(shim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retained_version_goes_on_the_agents_timer_once_its_task_ends() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kr-timer").await else {
        return;
    };
    let f = fake(&rig.w);
    let shim = "kr-timer-spin";
    rig.fresh(shim).await;
    with_agent(&rig, &f, || async {
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "kr-timer")));
        assert!(ok, "{out}");
        // up to 60 s: a slot create refused because the name was just taken (seen once in CI,
        // after the previous test's coordinator) holds the coordinator back for up to
        // WRITTEN_FOR (30 s) by design; this test is about the retained version's timer
        let v1 = eventually(60, "version 1 installed", || async {
            let s = reported(&rig, shim).await?;
            (rig.label(shim).await.as_deref() == Some("true")).then_some(s.digest?)
        })
        .await;
        // a pod's task started through version 1, as containerd records it
        let dir = version_dir(shim, &v1);
        let bundle = rig
            .w
            .root
            .resolve(
                Path::new("/run/containerd")
                    .join(TASK_DIR)
                    .join("k8s.io")
                    .join("kr-pod"),
            )
            .unwrap();
        std::fs::create_dir_all(&bundle).unwrap();
        let binary = dir.join("containerd-shim-x-v2");
        std::fs::write(
            bundle.join(SHIM_PATH_FILE),
            format!("{}\n", binary.display()),
        )
        .unwrap();
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "2", ("test", "kr-timer")));
        assert!(ok, "{out}");
        eventually(
            30,
            "version 2 installed, version 1 retained for its task",
            || async {
                let s = reported(&rig, shim).await?;
                (s.digest.as_deref() != Some(v1.as_str())
                    && s.retained
                        .iter()
                        .any(|r| r.digest == v1 && r.task_count == 1))
                .then_some(())
            },
        )
        .await;
        assert!(rig.w.root.resolve(&binary).unwrap().exists());
        // the task ends: nothing else changes, and the agent's timer collects version 1
        std::fs::remove_dir_all(&bundle).unwrap();
        eventually(
            RETAIN_CHECK_SECS + 15,
            "version 1 collected on the timer",
            || async {
                let s = reported(&rig, shim).await?;
                s.retained.is_empty().then_some(())
            },
        )
        .await;
        assert!(
            !rig.w.root.resolve(&dir).unwrap().exists(),
            "version 1's files are gone"
        );
    })
    .await;
    assert_eq!(
        *f.restarts.borrow(),
        2,
        "the install and the upgrade: the collection needed no transaction"
    );
    rig.force_delete(shim).await;
}
