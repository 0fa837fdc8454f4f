//! The node edges against a real systemd 252 and a real containerd (the node env,
//! `.ci/node-env/`: Debian's 1.6.20, or an upstream 2.x build): what only the real things can
//! prove. Skipped with a printed reason when
//! no node env runs, unless `SHIM_AGENT_REQUIRE_NODE_ENV=1`.

use std::path::Path;
use std::time::{Duration, Instant};

use shim_agent::containerd::{AddOptions, RuntimeSpec, apply, load, plan_add};
use shim_agent::node::{NodeError, RuntimeHealth, ServiceManager};

use crate::support::node_env::{RESTART_TIMEOUT, UNIT, VERIFY_TIMEOUT, chain, node_env};

/// Debian's runc shim, registered under a new handler name.
const RUNC_SHIM: &str = "/usr/bin/containerd-shim-runc-v2";
const HANDLER: &str = "shimtest";

#[tokio::test]
async fn restart_over_dbus_finishes_its_job_and_containerd_serves_cri_again() {
    let Some(env) = node_env("restart_over_dbus").await else {
        return;
    };
    let before = env.systemd.unit_state(UNIT).await.expect("unit state");
    let out = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    println!("D-Bus restart: job {} in {:?}", out.job_result, out.elapsed);
    assert_eq!(out.job_result, "done");
    assert!(!out.retried_after_start_limit);
    assert_eq!(
        (
            out.state.active_state.as_str(),
            out.state.sub_state.as_str()
        ),
        ("active", "running")
    );
    assert_ne!(out.state.invocation_id, before.invocation_id, "a new start");
    assert_ne!(out.state.main_pid, before.main_pid, "a new main process");
    assert_ne!(out.state.main_pid, 0);
    // Type=notify tells systemd that containerd runs, not that its CRI service is up:
    // containerd 1.6.20 once answered "server is not initialized yet" right after the job
    // (CI, 2026-11-29). The agent asks until CRI serves the handler; so does this test.
    let asked = Instant::now();
    let st = env
        .cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("CRI after the restart: {}", chain(&e)));
    println!("CRI served runc {:?} after the job", asked.elapsed());
    assert!(st.runtime_ready, "{st:?}");
    assert_eq!(st.handlers, vec!["runc"]);
    let v = env
        .cri
        .version(Duration::from_secs(2))
        .await
        .expect("CRI Version");
    assert_eq!(v.runtime_name, "containerd");
    assert_eq!(v.runtime_version, env.containerd.version, "{v:?}");
    // A CRI check is not a restart: the invocation stays the same.
    assert_eq!(env.invocation_id().await, out.state.invocation_id);
}

#[tokio::test]
async fn a_restart_that_fails_names_the_unit_and_job_result_then_recovers() {
    let Some(env) = node_env("failed_restart").await else {
        return;
    };
    env.add_unit_dropin("fail", "[Service]\nExecStartPre=/bin/false\n")
        .await;
    let err = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .expect_err("ExecStartPre=/bin/false must fail the restart");
    println!("failed restart: {err}");
    assert_eq!(err.reason(), "RestartFailed");
    let NodeError::RestartFailed {
        unit,
        job_result,
        state,
    } = &err
    else {
        panic!("{err:?}");
    };
    assert_eq!((unit.as_str(), job_result.as_str()), (UNIT, "failed"));
    assert_ne!(state.active_state, "active", "{state:?}");
    assert!(err.to_string().contains("containerd.service"));
    assert!(err.to_string().contains("`failed`"));

    env.remove_unit_dropin("fail").await;
    env.systemd.reset_failed(UNIT).await.expect("reset");
    let out = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("after the fix: {}", chain(&e)));
    assert_eq!(out.state.active_state, "active");
    env.cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
}

#[tokio::test]
async fn a_restart_that_outlasts_its_timeout_names_the_job() {
    let Some(env) = node_env("restart_timeout").await else {
        return;
    };
    env.add_unit_dropin("slow", "[Service]\nExecStartPre=/bin/sleep 3\n")
        .await;
    let t0 = Instant::now();
    let err = env
        .systemd
        .restart_unit(UNIT, Duration::from_millis(500))
        .await
        .expect_err("a 3 s ExecStartPre cannot finish in 0.5 s");
    println!("slow restart: {err}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let NodeError::RestartTimeout { unit, job, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(unit, UNIT);
    assert!(job.starts_with("/org/freedesktop/systemd1/job/"), "{job}");
    // The job goes on without us: systemd finishes it.
    env.remove_unit_dropin("slow").await;
    let state = env.systemd.unit_state(UNIT).await.expect("unit state");
    assert_eq!(state.active_state, "activating", "{state:?}");
}

#[tokio::test]
async fn restarting_a_unit_that_does_not_exist_is_a_dbus_error_naming_it() {
    let Some(env) = node_env("no_such_unit").await else {
        return;
    };
    let err = env
        .systemd
        .restart_unit("shim-agent-no-such.service", RESTART_TIMEOUT)
        .await
        .expect_err("no such unit");
    assert_eq!(err.reason(), "Dbus");
    assert!(
        chain(&err).contains("shim-agent-no-such.service"),
        "{}",
        chain(&err)
    );
}

#[tokio::test]
async fn a_start_limit_hit_is_reset_and_retried_once() {
    let Some(env) = node_env("start_limit").await else {
        return;
    };
    env.add_unit_dropin(
        "startlimit",
        "[Unit]\nStartLimitIntervalSec=300\nStartLimitBurst=1\n",
    )
    .await;
    env.systemd.reset_failed(UNIT).await.expect("reset");
    let first = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("first restart: {}", chain(&e)));
    assert!(!first.retried_after_start_limit);

    // The limit is really in force: a plain restart is refused now.
    let bare = env.exec(&["systemctl", "restart", UNIT]);
    assert!(
        !bare.status.success(),
        "systemctl restart must hit the limit"
    );
    let hit = env.systemd.unit_state(UNIT).await.expect("unit state");
    assert_eq!(hit.result, "start-limit-hit", "{hit:?}");
    assert_eq!(hit.active_state, "failed", "{hit:?}");

    let out = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("restart_unit after the limit: {}", chain(&e)));
    println!(
        "start limit: retried, job {} in {:?}",
        out.job_result, out.elapsed
    );
    assert!(out.retried_after_start_limit);
    assert_eq!(out.job_result, "done");
    assert_eq!(out.state.active_state, "active");
    env.cri
        .wait_for_handler("runc", VERIFY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
}

#[tokio::test]
async fn a_handler_added_by_the_config_engine_is_served_after_a_restart() {
    let Some(env) = node_env("handler_served").await else {
        return;
    };
    let root = env.host_root();
    let config = Path::new("/etc/containerd/config.toml");
    let set = load(&root, config, None).expect("load");
    let spec = RuntimeSpec::from_binary(HANDLER, RUNC_SHIM);
    let plan = plan_add(&set, &spec, &AddOptions::default()).expect("plan");
    assert!(!plan.is_empty());
    apply(&root, &plan).expect("apply");

    // Written but not restarted: the live containerd does not serve it yet.
    let err = env
        .cri
        .wait_for_handler(HANDLER, Duration::from_millis(300))
        .await
        .expect_err("not served before the restart");
    assert_eq!(err.reason(), "HandlerMissing", "{err}");

    env.systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    let st = env
        .cri
        .wait_for_handler(HANDLER, VERIFY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(st.handlers, vec!["runc", HANDLER], "runc kept");
    assert!(st.runtime_ready);
}

/// containerd 1.x: a `runtimes` table with only the new handler replaces the default map,
/// runc is gone, and the CRI plugin refuses its config. systemd still says `active`.
/// containerd 2.x reads the same table (in its own layout) into its defaults: runc stays, both
/// are served, and there is no trap to detect.
#[tokio::test]
async fn active_alone_proves_nothing_when_the_runtimes_table_loses_runc() {
    let Some(env) = node_env("runc_loss_trap").await else {
        return;
    };
    let broken = format!(
        "version = {}\n\
         [{}.containerd.runtimes.{HANDLER}]\n\
         runtime_type = \"io.containerd.runc.v2\"\n\
         runtime_path = \"{RUNC_SHIM}\"\n",
        env.containerd.config_version,
        env.containerd.cri_runtime_table()
    );
    std::fs::write(env.config_file(), broken).expect("write config");
    let out = env
        .systemd
        .restart_unit(UNIT, RESTART_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{}", chain(&e)));
    assert_eq!(out.job_result, "done");
    assert_eq!(out.state.active_state, "active", "systemd is satisfied");

    let t0 = Instant::now();
    if env.containerd.is_2x() {
        let st = env
            .cri
            .wait_for_handler(HANDLER, VERIFY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("containerd 2.x serves the handler: {}", chain(&e)));
        assert_eq!(st.handlers, vec!["runc", HANDLER], "2.x keeps runc");
        return;
    }
    let err = env
        .cri
        .wait_for_handler(HANDLER, Duration::from_secs(5))
        .await
        .expect_err("the CRI plugin must not serve the handler");
    println!("runc-loss trap after {:?}: {err}", t0.elapsed());
    assert!(
        matches!(err.reason(), "CriUnavailable" | "RuntimeNotReady"),
        "{err:?}"
    );
    if let NodeError::CriUnavailable {
        plugin_not_loaded, ..
    } = &err
    {
        assert!(plugin_not_loaded, "containerd answers, CRI does not: {err}");
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "no need to wait out the timeout"
        );
    }
}
