//! A runtime that cannot be proven, as the cluster sees it, on the real API server: the Shim's
//! node is reported `Failed` with the check's own reason and the runtime's own error, an Event
//! and a Degraded condition say so, and no label is set; a node that has no sandbox image says
//! so with its own reason, takes no slot and restarts nothing. The installed shim's version
//! (`-v`) is in the node's state annotation.

use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_cannot_run_a_sandbox_is_reported_failed_and_never_labelled() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-check").await else {
        return;
    };
    let shim = "ke-check-spin";
    rig.fresh(shim).await;
    let mut f = fake(&rig.w);
    f.fail_checks = vec![shim.to_string()];
    let original = crate::support::live::config(&rig.w);
    let since = k8s_openapi::jiff::Timestamp::now();
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-check")));
        let state = eventually(30, "Failed on the node", || async {
            let s = rig.state_annotation().await?;
            s.contains("\"phase\":\"Failed\"").then_some(s)
        })
        .await;
        assert!(
            state.contains("\"reason\":\"SandboxCheckFailed\"")
                && state.contains("unsupported protocol"),
            "the check's reason and the runtime's own words: {state}"
        );
        assert_eq!(rig.label(shim).await, None, "a label is a promise");
        eventually(30, "a SandboxCheckFailed Event on the Shim", || async {
            rig.events_since(shim, since)
                .await
                .iter()
                .any(|(r, n)| {
                    r == "SandboxCheckFailed" && n.contains("could not run a pod sandbox")
                })
                .then_some(())
        })
        .await;
        eventually(30, "Degraded on the Shim", || async {
            (rig.condition(shim, "Degraded").await? == ("True".into(), "SandboxCheckFailed".into()))
                .then_some(())
        })
        .await;
    })
    .await;
    assert_eq!(
        crate::support::live::config(&rig.w),
        original,
        "rolled back to the same bytes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_a_sandbox_image_says_so_and_restarts_nothing() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-nopause").await else {
        return;
    };
    let shim = "ke-nopause-spin";
    rig.fresh(shim).await;
    let mut f = fake(&rig.w);
    f.no_sandbox_image = true;
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-nopause")));
        let state = eventually(30, "Failed on the node", || async {
            let s = rig.state_annotation().await?;
            s.contains("\"phase\":\"Failed\"").then_some(s)
        })
        .await;
        assert!(
            state.contains("\"reason\":\"NoSandboxImage\"") && state.contains("not to blame"),
            "{state}"
        );
        assert_eq!(rig.label(shim).await, None);
    })
    .await;
    assert_eq!(
        *f.restarts.borrow(),
        0,
        "no restart for a node that runs no pod"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_shims_own_version_is_in_the_nodes_state() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-version").await else {
        return;
    };
    let shim = "ke-version-spin";
    rig.fresh(shim).await;
    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-version")));
        let state = eventually(30, "Installed on the node", || async {
            let s = rig.state_annotation().await?;
            s.contains("\"phase\":\"Installed\"").then_some(s)
        })
        .await;
        assert!(state.contains("\"version\":\"1.0.0\""), "{state}");
        assert_eq!(rig.label(shim).await.as_deref(), Some("true"));
    })
    .await;
}
