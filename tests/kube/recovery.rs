//! An agent stopped between its containerd restart and the check after it, on the real API
//! server: at its next start the check runs first, and when it fails the rollback's restart
//! takes the node's own slot first, the failure reaches the slot (the Shim is Degraded), and
//! the agent goes on.

use kube::{Api, ResourceExt};
use shim_agent::api::lease::{SLOT_FAILED, ShimLease};
use shim_agent::cluster::{NAMESPACE, session, slots::slot_name};
use shim_agent::state::Phase;

use crate::support::agent_rig::{Rig, cluster_node, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{FakeContainerd, fake, shim_yaml, state};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_fails_after_a_crash_past_the_restart_marks_the_slot_and_degrades_the_shim() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-recover").await else {
        return;
    };
    let shim = "ke-recover-spin";
    rig.fresh(shim).await;
    let leases: Api<ShimLease> = Api::namespaced(rig.admin.clone(), NAMESPACE);

    // the agent restarts containerd for the Shim and stops (its task dropped, as a crash)
    // while it checks what containerd serves
    let f = FakeContainerd {
        hang_verifies: vec![1],
        ..fake(&rig.w)
    };
    rig.env
        .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-recover")));
    {
        let n = cluster_node(&rig.w, &f);
        let (_stop, rx) = tokio::sync::watch::channel(false);
        tokio::select! {
            r = session::run(&n, rig.config(), rx) => panic!("the session ended: {r:?}"),
            () = eventually(60, "the check after the restart", || async {
                f.hanging.borrow().then_some(())
            }) => {}
        }
    }
    assert_eq!(*f.restarts.borrow(), 1);
    assert_eq!(
        state(&rig.w).journal.map(|j| j.phase),
        Some(Phase::Restarted)
    );
    let slot = leases.get(&slot_name(shim, 0)).await.unwrap();
    assert_eq!(
        slot.spec.holder_identity.as_deref(),
        Some(rig.name.as_str())
    );

    // at the next start containerd does not serve the handler after all: the recovery rolls
    // the transaction back and the agent goes on; its next try fails the same way
    let f = FakeContainerd {
        fail_verifies: vec![1, 3],
        ..fake(&rig.w)
    };
    with_agent(&rig, &f, || async {
        let marked = eventually(30, "the slot marked failed", || async {
            let l = leases.get_opt(&slot_name(shim, 0)).await.ok()??;
            l.annotations().get(SLOT_FAILED).cloned()
        })
        .await;
        assert!(marked.contains("CRI"), "the failure's reason: {marked}");
        eventually(30, "Degraded on the Shim", || async {
            (rig.condition(shim, "Degraded").await?.0 == "True").then_some(())
        })
        .await;
        eventually(30, "the next try rolled back too", || async {
            (*f.restarts.borrow() == 3).then_some(())
        })
        .await;
    })
    .await;
    let st = state(&rig.w);
    assert!(st.journal.is_none());
    assert!(!st.shims.contains_key(shim), "rolled back");
    let slot = leases.get(&slot_name(shim, 0)).await.unwrap();
    assert_eq!(
        slot.spec.holder_identity.as_deref(),
        Some(rig.name.as_str()),
        "a failed slot stays with its node"
    );
    rig.force_delete(shim).await;
}
