//! A fleet of agents rolling a Shim out on the real API server (tests/support/fleet.rs): the
//! invariants of docs/design.md §5 hold while hosts fail, agents crash and Nodes go away.
//! CI runs sizes that fit its budget; `cargo bench --bench fleet` runs the big ones.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::support::fleet::{FleetConfig, run_fleet};
use crate::support::kube::{SERIAL, kube_env};

#[tokio::test(flavor = "current_thread")]
async fn a_rolling_update_never_restarts_more_than_n_nodes_and_survives_crashes_and_deletions() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let mut cfg = FleetConfig::new("fleet-ci", 24, "3", Duration::from_millis(300));
    cfg.max_failures = 5;
    cfg.failing = BTreeSet::from([4]);
    cfg.crashing = BTreeSet::from([7, 13]);
    cfg.deleted = BTreeSet::from([10]);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(
        r.installed,
        24 - 1 - 1,
        "every live, healthy node serves the handler"
    );
    assert!(r.peak_restarting <= 3, "peak {}", r.peak_restarting);
    assert!(
        r.peak_restarting >= 2,
        "slots used in parallel: peak {}",
        r.peak_restarting
    );
    assert!(!r.halted);
    // every slot carries the fleet's size for the claim windows before the first status
    assert_eq!(r.targeted, BTreeSet::from([Some("24".to_string())]));
}

#[tokio::test(flavor = "current_thread")]
async fn changing_max_update_mid_rollout_grows_and_retires_slots_within_the_new_bound() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    // 6 slots, then 2 once 8 nodes are done
    let mut cfg = FleetConfig::new("fleet-resize", 24, "6", Duration::from_millis(400));
    cfg.resize = Some((8, "2".into()));
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 24);
    // and back up: 1 slot, then 50 %
    let mut cfg = FleetConfig::new("fleet-grow", 16, "1", Duration::from_millis(300));
    cfg.resize = Some((3, "\"50%\"".into()));
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert_eq!(r.installed, 16);
    assert!(
        r.peak_restarting > 1,
        "the new slots were used: {}",
        r.peak_restarting
    );
}

#[tokio::test(flavor = "current_thread")]
async fn failures_beyond_max_failures_halt_the_rollout_across_a_coordinator_failover_until_resumed()
{
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    // every node fails: the first two failures exceed maxFailures 1
    let mut cfg = FleetConfig::new("fleet-halt", 12, "2", Duration::from_millis(200));
    cfg.max_failures = 1;
    cfg.failing = (0..12).collect();
    cfg.failover_on_halt = true;
    cfg.deadline = Duration::from_secs(90);
    let r = run_fleet(env, &cfg).await;
    eprintln!("{}", r.summary());
    assert!(r.violations.is_empty(), "{:#?}", r.violations);
    assert!(r.halted, "halted, kept across the failover, then resumed");
    assert_eq!(r.installed, 0);
    assert!(r.peak_holders <= 2, "{}", r.peak_holders);
}
