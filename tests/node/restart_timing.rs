//! Measures, on the node env (containerd 1.6 or 2.x), how long a containerd restart takes and
//! how long its CRI is unavailable: the agent's D-Bus restart (`RestartUnit` → `JobRemoved`)
//! against a bare `systemctl restart containerd` run through `.ci/node-env/exec.sh`, measured
//! the same way in the same run, interleaved. Prints the medians (recorded in BENCHMARKS.md,
//! "node edges").
//!
//! Both are timed from just before the restart is asked for: "call" until the restart reports
//! completion (`restart_unit` returning, which includes `Subscribe`, `AddMatch` and reading the
//! unit's state afterwards; or `systemctl` exiting), "CRI window" until a CRI `Status`
//! answers with the runtime ready. For D-Bus, "job" is `RestartUnit` → `JobRemoved` alone.

use std::time::{Duration, Instant};

use shim_agent::node::{CriClient, RuntimeHealth, ServiceManager};

use crate::support::node_env::{RESTART_TIMEOUT, UNIT, chain, node_env};

const REPETITIONS: usize = 7;
/// Between CRI polls while waiting for it to come back.
const POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Longest wait for CRI after a restart.
const CRI_DEADLINE: Duration = Duration::from_secs(10);

/// Poll CRI from `t0` until the runtime is ready; time since `t0`.
async fn cri_back(cri: &CriClient, t0: Instant) -> Duration {
    let deadline = Instant::now() + CRI_DEADLINE;
    loop {
        if let Ok(st) = cri.status(Duration::from_millis(500)).await
            && st.runtime_ready
        {
            return t0.elapsed();
        }
        assert!(Instant::now() < deadline, "CRI did not come back");
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

#[tokio::test]
async fn dbus_restart_against_systemctl_restart() {
    let Some(env) = node_env("restart_timing").await else {
        return;
    };
    let (mut dbus_job, mut dbus_call, mut dbus_cri) = (vec![], vec![], vec![]);
    let (mut ctl_call, mut ctl_cri) = (vec![], vec![]);
    for _ in 0..REPETITIONS {
        let before = env.systemd.unit_state(UNIT).await.expect("state");
        let t0 = Instant::now();
        let out = env
            .systemd
            .restart_unit(UNIT, RESTART_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{}", chain(&e)));
        dbus_call.push(t0.elapsed());
        dbus_job.push(out.elapsed);
        dbus_cri.push(cri_back(&env.cri, t0).await);
        assert_ne!(out.state.invocation_id, before.invocation_id);

        let before = env.systemd.unit_state(UNIT).await.expect("state");
        let t0 = Instant::now();
        let bare = env.exec(&["systemctl", "restart", UNIT]);
        ctl_call.push(t0.elapsed());
        assert!(bare.status.success(), "{bare:?}");
        ctl_cri.push(cri_back(&env.cri, t0).await);
        let after = env.systemd.unit_state(UNIT).await.expect("state");
        assert_ne!(
            after.invocation_id, before.invocation_id,
            "systemctl restarted"
        );
    }
    println!(
        "node edges, containerd {} restart, median of {REPETITIONS} (ms):",
        env.containerd.version
    );
    println!(
        "  D-Bus restart_unit:  job {:>6}  call {:>6}  CRI window {:>6}   calls {:?}",
        ms(median(dbus_job)),
        ms(median(dbus_call.clone())),
        ms(median(dbus_cri)),
        dbus_call.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
    println!(
        "  exec.sh systemctl:   job      -  call {:>6}  CRI window {:>6}   calls {:?}",
        ms(median(ctl_call.clone())),
        ms(median(ctl_cri)),
        ctl_call.iter().map(|d| ms(*d)).collect::<Vec<_>>()
    );
}
