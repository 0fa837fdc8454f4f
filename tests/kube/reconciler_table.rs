//! The cluster agent decides the shared failure table (tests/support/failure_table.rs) as
//! `run` with static Shims does (tests/pure/reconciler_table.rs): the same Shims, applied to
//! the real API server, on a node whose scripted containerd misbehaves as each row says; the
//! decisions read back from the Node's state annotation, as the coordinator reads them: a
//! Shim is installed when its entry names an installed artifact (a failed uninstall or
//! upgrade leaves one in place), and failing when its entry is `Failed`, with its reason.

use std::collections::BTreeMap;
use std::time::Duration;

use shim_agent::cluster::nodestate::{NodePhase, parse_states};

use shim_agent::reconciler::memory::spec_key;

use crate::support::agent_rig::{Rig, cluster_node, with_agent};
use crate::support::failure_table::{Decisions, Row, TABLE, break_state_dir};
use crate::support::kube::SERIAL;
use crate::support::live::{FakeContainerd, fake};
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
        let docs = |selected: &dyn Fn(&str) -> String| {
            let docs: Vec<String> = builders
                .iter()
                .map(|b| {
                    let name = b.clone().build().name().to_string();
                    b.clone().node_selector("test", &selected(&name)).yaml()
                })
                .collect();
            docs.join("---\n")
        };
        let f = row.containerd(fake(&rig.w), &prefix);
        let expected = row.expected(&prefix);
        if !row.crashed.is_empty() {
            // the Shims exist (their UIDs key the records) before the agent that starts on
            // the records a dead one left
            apply(&rig, &docs(&|_| test.clone()));
            seed_crashes(&rig, row, &prefix, &f).await;
        }
        let mut seen = None;
        with_agent(&rig, &f, || async {
            if row.unsaveable {
                await_agent(&rig).await;
                break_state_dir(&rig.w);
            }
            if row.crashed.is_empty() && !apply(&rig, &docs(&|_| test.clone())) {
                return;
            }
            if row.removes() {
                // first every Shim of the row installed
                let all = row.decided(names.clone(), BTreeMap::new(), &f, &prefix);
                if let Err(d) = settle(&rig, row, &f, &prefix, &all).await {
                    seen = Some(d);
                    return;
                }
                let elsewhere = format!("{test}-elsewhere");
                let selected = |n: &str| {
                    let removed = row.is_removed(n, &prefix);
                    if removed {
                        elsewhere.clone()
                    } else {
                        test.clone()
                    }
                };
                if !apply(&rig, &docs(&selected)) {
                    return;
                }
            }
            seen = Some(
                settle(&rig, row, &f, &prefix, &expected)
                    .await
                    .unwrap_or_else(|d| d),
            );
            if !row.checked_once.is_empty() && seen.as_ref() == Some(&expected) {
                // the failed Shim waits its backoff while the agent goes on: still one check
                tokio::time::sleep(Duration::from_secs(3)).await;
                seen = Some(decisions(&rig, row, &f, &prefix).await);
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

/// Apply the Shims of `docs`; false (said) when kubectl refused.
fn apply(rig: &Rig, docs: &str) -> bool {
    let (applied, out) = rig.env.apply(docs);
    if !applied {
        eprintln!("kubectl apply: {out}");
    }
    applied
}

/// Until the node decided `expected`, or 60 s: the decisions last seen, `Err` if not those.
async fn settle(
    rig: &Rig,
    row: &Row,
    f: &FakeContainerd,
    prefix: &str,
    expected: &Decisions,
) -> Result<Decisions, Decisions> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let decided = decisions(rig, row, f, prefix).await;
        if decided == *expected {
            return Ok(decided);
        }
        if Instant::now() >= deadline {
            return Err(decided);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Until the agent has written the Node (its store is open, its first round done), or 20 s.
async fn await_agent(rig: &Rig) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while rig.state_annotation().await.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The crash records a dead agent left for the row's `crashed` Shims, at their specs as the
/// API server has them, in the node's state store.
async fn seed_crashes(rig: &Rig, row: &Row, prefix: &str, f: &FakeContainerd) {
    let mut shims = BTreeMap::new();
    for (s, _) in row.crashed {
        let name = format!("{prefix}{s}");
        let shim = rig.shim(&name).await.expect("the applied Shim");
        shims.insert(name, spec_key(&shim));
    }
    let n = cluster_node(&rig.w, f);
    let (store, mut state) = n.open().await.unwrap();
    row.seed_crashes(&mut state, prefix, |name| shims[name].clone());
    store.save(&state).unwrap();
}

/// The decisions the Node's state annotation shows, and the checks `f` ran.
async fn decisions(rig: &Rig, row: &Row, f: &FakeContainerd, prefix: &str) -> Decisions {
    let node = rig.node().await;
    let states = parse_states(node.metadata.annotations.as_ref());
    // on the node: its entry names the installed artifact, whatever became of the last
    // change (a failed uninstall or upgrade leaves the installed version in place)
    let installed = states
        .iter()
        .filter(|(_, s)| s.digest.is_some())
        .map(|(n, _)| n.clone())
        .collect();
    let failing: BTreeMap<String, String> = states
        .iter()
        .filter(|(_, s)| s.phase == NodePhase::Failed)
        .map(|(n, s)| (n.clone(), s.reason.clone().unwrap_or_default()))
        .collect();
    row.decided(installed, failing, f, prefix)
}
