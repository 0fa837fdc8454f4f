//! The cluster agent decides the shared failure table (tests/support/failure_table.rs) as
//! `run` with static Shims does (tests/pure/reconciler_table.rs): the same Shims, applied to
//! the real API server, on a node whose scripted containerd misbehaves as each row says; the
//! decisions read back from the Node's state annotation, as the coordinator reads them.

use std::collections::BTreeMap;
use std::time::Duration;

use shim_agent::cluster::nodestate::{NodePhase, parse_states};

use crate::support::agent_rig::{Rig, with_agent};
use crate::support::failure_table::{Decisions, TABLE};
use crate::support::kube::SERIAL;
use crate::support::live::fake;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_decides_the_failure_table_as_the_static_daemon_does() {
    let _serial = SERIAL.lock().await;
    for (i, row) in TABLE.iter().enumerate() {
        let test = format!("rt{i}");
        let Some(rig) = Rig::new(&test).await else {
            return;
        };
        let prefix = format!("{test}-");
        let builders = row.builders(&rig.w, &prefix);
        let names: Vec<String> = builders
            .iter()
            .map(|b| b.clone().build().name().to_string())
            .collect();
        for n in &names {
            rig.fresh(n).await;
        }
        let docs: Vec<String> = builders
            .into_iter()
            .map(|b| b.node_selector("test", &test).yaml())
            .collect();
        let f = row.containerd(fake(&rig.w), &prefix);
        let expected = row.expected(&prefix);
        let mut seen = None;
        with_agent(&rig, &f, || async {
            let (applied, out) = rig.env.apply(&docs.join("---\n"));
            if !applied {
                return eprintln!("kubectl apply: {out}");
            }
            // until every Shim of the row is installed or held failed as expected, or 60 s
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let decided = decisions(&rig).await;
                let done = decided == expected;
                seen = Some(decided);
                if done {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
        .await;
        // cleaned up whatever the outcome, before the verdict
        for n in &names {
            rig.force_delete(n).await;
        }
        assert_eq!(seen.as_ref(), Some(&expected), "{}", row.what);
    }
}

/// The decisions the Node's state annotation shows.
async fn decisions(rig: &Rig) -> Decisions {
    let node = rig.node().await;
    let states = parse_states(node.metadata.annotations.as_ref());
    let installed = states
        .iter()
        .filter(|(_, s)| s.phase == NodePhase::Installed)
        .map(|(n, _)| n.clone())
        .collect();
    let failing: BTreeMap<String, String> = states
        .iter()
        .filter(|(_, s)| s.phase == NodePhase::Failed)
        .map(|(n, s)| (n.clone(), s.reason.clone().unwrap_or_default()))
        .collect();
    Decisions { installed, failing }
}
