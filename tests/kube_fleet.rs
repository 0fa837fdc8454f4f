//! A fleet of agents rolling a Shim out on the real API server (tests/support/fleet.rs): the
//! invariants of docs/design.md §5 hold while hosts fail, agents crash and Nodes go away.
//! CI runs a size that fits its budget; `cargo bench --bench fleet` runs the big ones.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use support::fleet::{FleetConfig, run_fleet};
use support::kube::{SERIAL, kube_env};

#[tokio::test(flavor = "current_thread")]
async fn a_rolling_update_never_restarts_more_than_n_nodes_and_survives_crashes_and_deletions() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let cfg = FleetConfig {
        run: "fleet-ci".into(),
        agents: 24,
        max_update: "3".into(),
        max_failures: 5,
        restart: Duration::from_millis(300),
        failing: BTreeSet::from([4]),
        crashing: BTreeSet::from([7, 13]),
        deleted: BTreeSet::from([10]),
        deadline: Duration::from_secs(120),
    };
    let r = run_fleet(env, &cfg).await;
    eprintln!("{r:?}");
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(
        r.installed,
        24 - 1 - 1,
        "every live, healthy node serves the handler"
    );
    assert!(r.peak_restarting <= 3, "peak {}", r.peak_restarting);
    assert!(
        r.peak_restarting >= 2,
        "the slots were used in parallel: peak {}",
        r.peak_restarting
    );
    assert!(!r.halted);
}

#[tokio::test(flavor = "current_thread")]
async fn failures_beyond_max_failures_halt_the_rollout_and_no_node_takes_a_slot_after() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let cfg = FleetConfig {
        run: "fleet-halt".into(),
        agents: 12,
        max_update: "2".into(),
        max_failures: 1,
        restart: Duration::from_millis(200),
        // every node fails: the first two failures exceed maxFailures 1
        failing: (0..12).collect(),
        crashing: BTreeSet::new(),
        deleted: BTreeSet::new(),
        deadline: Duration::from_secs(60),
    };
    let r = run_fleet(env, &cfg).await;
    eprintln!("{r:?}");
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert!(r.halted, "halted");
    assert_eq!(r.installed, 0);
    assert!(r.peak_holders <= 2, "{}", r.peak_holders);
}
