//! The packaged unit as systemd runs it, inside the node env (`.ci/node-env/`): the agent
//! binary at `/usr/bin/shim-agent`, `packaging/systemd/shim-agent.service`, static Shims in
//! `/etc/shim-agent/shims.d` (no cluster here; tests/node/kube.rs has the cluster path).
//!
//! - `Type=notify`: `systemctl start` returns once the agent is ready, and `StatusText` says
//!   what it does ("1 shim installed").
//! - The journal: every install and rollback is an entry with a stable `MESSAGE_ID` and the
//!   fields `SHIM`, `NODE`, `PHASE`, `DIGEST`.
//! - Metrics on `/run/shim-agent/metrics.sock` and on a configured TCP address.
//! - `systemctl reload` re-reads the config; a broken config is refused and the agent keeps
//!   running.
//! - The watchdog: with `WatchdogSec=2s` the agent stays up (it pings).
//! - `systemctl stop` while containerd restarts: the transaction finishes before the agent
//!   exits, on the one SIGTERM, cleanly.
//!
//! Skipped with a reason without a node env, unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use shim_agent::node::RuntimeHealth;
use shim_agent::telemetry::message_id;

use crate::support::kube::eventually;
use crate::support::node_env::agent::{AGENT_UNIT, write};
use crate::support::node_env::{self, NodeEnv, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

const TEST: &str = "node_service";
/// Not under /tmp: the unit has PrivateTmp=yes.
const ARTIFACT_DIR: &str = "srv/shim-agent-service-test";
const SHIMS_D: &str = "etc/shim-agent/shims.d";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packaged_unit_notifies_logs_serves_metrics_reloads_and_stops_cleanly() {
    let Some(env) = node_env(TEST).await else {
        return;
    };
    let guard = Cleanup { env: &env };
    env.remove_agent();
    guard.remove_artifacts();
    let node_name = env
        .exec_ok(&["cat", "/proc/sys/kernel/hostname"])
        .trim()
        .to_string();
    let port = free_port();
    let config = format!("[metrics]\naddress = \"127.0.0.1:{port}\"\n");
    let original = env.config_files();

    // --- the unit, as the package installs it ------------------------------------------------
    let _agent = env.install_agent(&config, None).await;
    let (url, sha) = artifact(&env, "demo");
    write(
        &env.root.join(SHIMS_D).join("demo.yaml"),
        shim_yaml("demo", &url, &sha).as_bytes(),
        0o644,
    );

    // --- Type=notify: start returns once ready; the status says what is installed -----------
    let t = Instant::now();
    env.exec_ok(&["systemctl", "start", AGENT_UNIT]);
    eprintln!("systemctl start returned after {:?}", t.elapsed());
    assert_eq!(show(&env, "ActiveState"), "active");
    let status = eventually(60, "StatusText to say 1 shim installed", || async {
        let s = show(&env, "StatusText");
        s.starts_with("1 shim installed").then_some(s)
    })
    .await;
    eprintln!("StatusText={status}");
    let systemctl_status = env.exec(&["systemctl", "status", "--no-pager", AGENT_UNIT]);
    let systemctl_status = String::from_utf8_lossy(&systemctl_status.stdout).into_owned();
    assert!(
        systemctl_status.contains("Status: \"1 shim installed"),
        "{systemctl_status}"
    );

    // --- the journal: the install with its fields ---------------------------------------------
    let installed = journal_entries(&env, message_id::INSTALLED);
    let e = installed
        .iter()
        .find(|e| e["SHIM"] == "demo")
        .unwrap_or_else(|| panic!("no INSTALLED entry for demo: {installed:?}"));
    assert_eq!(e["DIGEST"], sha.as_str(), "{e}");
    assert_eq!(e["PHASE"], "committed", "{e}");
    assert_eq!(e["NODE"], node_name.as_str(), "{e}");
    assert_eq!(e["SYSLOG_IDENTIFIER"], "shim-agent", "{e}");

    // --- metrics on the unix socket and on TCP ------------------------------------------------
    let leader = leader_pid();
    let socket = PathBuf::from(format!("/proc/{leader}/root/run/shim-agent/metrics.sock"));
    let m = http_get_unix(&socket, "/metrics");
    assert!(m.starts_with("HTTP/1.1 200"), "{m}");
    assert!(
        m.contains("shim_agent_transactions_total{kind=\"install\",result=\"committed\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("shim_agent_containerd_restarts_total{result=\"ok\"} 1"),
        "{m}"
    );
    assert!(m.contains("shim_agent_shims_installed 1"), "{m}");
    let m = http_get_tcp(port, "/metrics");
    assert!(
        m.contains("shim_agent_phase_duration_seconds_count{phase=\"restarted\"} 1"),
        "{m}"
    );
    assert!(http_get_tcp(port, "/other").starts_with("HTTP/1.1 404"));

    // --- a rollback: containerd refuses the config with this digest ---------------------------
    let (url2, sha2) = artifact(&env, "refused");
    env.add_unit_dropin(
        "refuse",
        &format!(
            "[Service]\nExecStartPre=/bin/sh -c '! grep -rqs {sha2} /etc/containerd/config.toml /etc/containerd/conf.d'\n"
        ),
    )
    .await;
    write(
        &env.root.join(SHIMS_D).join("refused.yaml"),
        shim_yaml("refused", &url2, &sha2).as_bytes(),
        0o644,
    );
    let rolled = eventually(60, "a ROLLED_BACK entry for refused", || async {
        journal_entries(&env, message_id::ROLLED_BACK)
            .into_iter()
            .find(|e| e["SHIM"] == "refused")
    })
    .await;
    assert_eq!(rolled["DIGEST"], sha2.as_str(), "{rolled}");
    assert_eq!(rolled["NODE"], node_name.as_str(), "{rolled}");
    let failed = journal_entries(&env, message_id::FAILED);
    assert!(
        failed
            .iter()
            .any(|e| e["SHIM"] == "refused" && e["PHASE"] == "applied"),
        "the failure names the phase it happened in: {failed:?}"
    );
    let failing = eventually(30, "StatusText to name the failing Shim", || async {
        let s = show(&env, "StatusText");
        s.contains("failing").then_some(s)
    })
    .await;
    eprintln!("StatusText={failing}");
    let _ = std::fs::remove_file(env.root.join(SHIMS_D).join("refused.yaml"));
    env.remove_unit_dropin("refuse").await;
    let m = http_get_unix(&socket, "/metrics");
    assert!(m.contains("shim_agent_rollbacks_total 1"), "{m}");

    // --- reload: a good config is taken, a broken one refused ---------------------------------
    let pid = show(&env, "MainPID");
    write(
        &env.root.join("etc/shim-agent/config.toml"),
        format!("{config}[log]\nlevel = \"debug\"\n").as_bytes(),
        0o644,
    );
    env.exec_ok(&["systemctl", "reload", AGENT_UNIT]);
    eventually(30, "the reload to finish", || async {
        journal_text(&env)
            .contains("configuration reloaded\n")
            .then_some(())
    })
    .await;
    assert_eq!(
        show(&env, "MainPID"),
        pid,
        "a reload does not restart the process"
    );
    write(
        &env.root.join("etc/shim-agent/config.toml"),
        b"[metrics]\nno-such-key = 1\n",
        0o644,
    );
    env.exec_ok(&["systemctl", "reload", AGENT_UNIT]);
    let j = eventually(30, "the broken config to be refused", || async {
        let j = journal_text(&env);
        j.contains("configuration reload failed; keeping the running configuration")
            .then_some(j)
    })
    .await;
    assert!(j.contains("no-such-key"), "the error names the key: {j}");
    assert_eq!(show(&env, "ActiveState"), "active");
    assert_eq!(show(&env, "MainPID"), pid);
    write(
        &env.root.join("etc/shim-agent/config.toml"),
        config.as_bytes(),
        0o644,
    );

    // --- the watchdog: pinged, so never fired -------------------------------------------------
    add_dropin(&env, AGENT_UNIT, "watchdog", "[Service]\nWatchdogSec=2s\n");
    env.exec_ok(&["systemctl", "restart", AGENT_UNIT]);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(show(&env, "ActiveState"), "active");
    assert_eq!(show(&env, "NRestarts"), "0", "the watchdog never fired");
    assert!(journal_text(&env).contains("systemd watchdog on"));
    remove_dropin(&env, AGENT_UNIT, "watchdog");

    // --- stop while containerd restarts: the transaction finishes on the one SIGTERM ----------
    // containerd's stop phase takes 3 s, so the agent's stop below is queued while the
    // restart job is still stopping containerd (a unit ordered after containerd would then
    // hold containerd's start until its own stop finished: a deadlock)
    env.add_unit_dropin(
        "slow",
        "[Service]\nExecStopPost=/bin/sleep 3\nExecStartPre=/bin/sleep 1\n",
    )
    .await;
    let (url3, sha3) = artifact(&env, "slow");
    write(
        &env.root.join(SHIMS_D).join("slow.yaml"),
        shim_yaml("slow", &url3, &sha3).as_bytes(),
        0o644,
    );
    eventually(30, "the agent to restart containerd for slow", || async {
        show(&env, "StatusText")
            .contains("restarting containerd for slow")
            .then_some(())
    })
    .await;
    let t = Instant::now();
    env.exec_ok(&["systemctl", "stop", AGENT_UNIT]);
    let took = t.elapsed();
    eprintln!("systemctl stop took {took:?} (containerd's restart takes 4 s)");
    assert!(
        took < Duration::from_secs(30),
        "the stop waited for the transaction only ({took:?})"
    );
    assert_eq!(
        show(&env, "Result"),
        "success",
        "exited on its own, not killed"
    );
    assert_eq!(show(&env, "ExecMainStatus"), "0");
    let state: serde_json::Value = serde_json::from_slice(
        &std::fs::read(env.root.join("var/lib/shim-agent/state.json")).unwrap(),
    )
    .unwrap();
    assert!(
        state["state"]["journal"].is_null(),
        "no open transaction after the stop: {state}"
    );
    assert_eq!(
        state["state"]["shims"]["slow"]["state"], "installed",
        "the transaction under way finished: {state}"
    );
    assert!(journal_text(&env).contains("stopping: finishing what is under way"));
    env.remove_unit_dropin("slow").await;
    env.cri
        .wait_for_handler("slow", node_env::VERIFY_TIMEOUT)
        .await
        .expect("CRI serves the handler the stopped agent installed");

    // --- everything goes: the node's config as it was -----------------------------------------
    for f in ["demo.yaml", "slow.yaml"] {
        let _ = std::fs::remove_file(env.root.join(SHIMS_D).join(f));
    }
    env.exec_ok(&["systemctl", "start", AGENT_UNIT]);
    eventually(90, "the agent to uninstall both Shims", || async {
        (env.config_files() == original).then_some(())
    })
    .await;
}

/// A Shim artifact: the node's own runc shim as `containerd-shim-<name>-v2`, under the node.
fn artifact(env: &NodeEnv, name: &str) -> (String, String) {
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2")).unwrap();
    let tgz = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File(format!("bin/containerd-shim-{name}-v2").leak(), shim, 0o755),
        // a different digest per Shim
        Entry::File("bin/NAME", name.as_bytes().to_vec(), 0o644),
    ]);
    let file = format!("{name}.tar.gz");
    write(&env.root.join(ARTIFACT_DIR).join(&file), &tgz, 0o644);
    (format!("file:///{ARTIFACT_DIR}/{file}"), sha256_hex(&tgz))
}

fn shim_yaml(name: &str, url: &str, sha: &str) -> String {
    ShimBuilder::new(name).artifact(url, sha).yaml()
}

fn show(env: &NodeEnv, prop: &str) -> String {
    env.exec_ok(&["systemctl", "show", "--value", "-p", prop, AGENT_UNIT])
        .trim()
        .to_string()
}

fn journal_entries(env: &NodeEnv, id: &str) -> Vec<serde_json::Value> {
    env.exec_ok(&[
        "journalctl",
        "--no-pager",
        "-o",
        "json",
        &format!("MESSAGE_ID={id}"),
    ])
    .lines()
    .filter_map(|l| serde_json::from_str(l).ok())
    .collect()
}

fn journal_text(env: &NodeEnv) -> String {
    env.exec_ok(&["journalctl", "-u", AGENT_UNIT, "--no-pager", "-o", "cat"])
}

fn add_dropin(env: &NodeEnv, unit: &str, name: &str, text: &str) {
    write(
        &env.root
            .join(format!("etc/systemd/system/{unit}.d/{name}.conf")),
        text.as_bytes(),
        0o644,
    );
    env.exec_ok(&["systemctl", "daemon-reload"]);
}

fn remove_dropin(env: &NodeEnv, unit: &str, name: &str) {
    let _ = std::fs::remove_file(
        env.root
            .join(format!("etc/systemd/system/{unit}.d/{name}.conf")),
    );
    env.exec_ok(&["systemctl", "daemon-reload"]);
}

/// The node's leader process on the host (its `/proc/<pid>/root` is the node's view, with
/// its own /run).
fn leader_pid() -> String {
    if let Ok(p) = std::env::var("INFRA_LEADER_PID") {
        return p;
    }
    let env_file = std::env::var("INFRA_RUN")
        .map(|r| PathBuf::from(r).join("env"))
        .unwrap_or_else(|_| PathBuf::from(node_env::ENV_FILE));
    std::fs::read_to_string(&env_file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("export INFRA_LEADER_PID="))
        .map(str::to_string)
        .unwrap_or_else(|| {
            panic!(
                "INFRA_LEADER_PID is neither set nor in {}",
                env_file.display()
            )
        })
}

fn request(path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
}

fn http_get_unix(socket: &Path, path: &str) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    s.write_all(request(path).as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn http_get_tcp(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("metrics over TCP");
    s.write_all(request(path).as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

struct Cleanup<'a> {
    env: &'a NodeEnv,
}

impl Cleanup<'_> {
    fn remove_artifacts(&self) {
        let _ = std::fs::remove_dir_all(self.env.root.join(ARTIFACT_DIR));
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        // (the agent itself: removed, its journal printed on a panic, by `AgentInNode`)
        self.remove_artifacts();
        self.env.restore_config();
        let _ = self.env.exec(&["systemctl", "restart", node_env::UNIT]);
    }
}
