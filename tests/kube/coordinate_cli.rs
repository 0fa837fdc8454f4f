//! `shim-agent coordinate` as an operator (or a Deployment) runs it: the binary, with the
//! coordinator identity of its own. It serves `/healthz` and `/readyz` for probes and
//! `/metrics` on `--listen`; once elected its gauges report each Shim's rollout, the series of
//! a deleted Shim go with it, and SIGTERM stops it cleanly.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};

use crate::support::agent_rig::Rig;
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::shim_yaml;

const SHIM: &str = "coordinate-cli";

/// The child, killed if the test ends before it stopped (whatever the outcome).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on 127.0.0.1:`port`: the status code and the body; `None` while nothing listens.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    let code = reply.split(' ').nth(1)?.parse().ok()?;
    let body = reply.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_command_serves_probes_and_rollout_gauges_and_stops_on_sigterm() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("coordinate-cli").await else {
        return;
    };
    rig.force_delete(SHIM).await;
    let port = free_port();
    let empty = tempfile::NamedTempFile::new().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .arg("--config")
        .arg(empty.path())
        .arg("coordinate")
        .arg("--kubeconfig")
        .arg(rig.env.coordinator_identity())
        .args(["--identity", "coordinate-cli", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut running = Running(child);

    let (code, _) = eventually(10, "/healthz answered", || async { get(port, "/healthz") }).await;
    assert_eq!(code, 200);
    eventually(10, "/readyz 200", || async {
        (get(port, "/readyz")?.0 == 200).then_some(())
    })
    .await;
    assert_eq!(get(port, "/nothing").map(|r| r.0), Some(404));

    // a Shim no node matches: once elected (an earlier test's coordinator Lease runs out
    // first), the gauges say so
    let (ok, out) = rig.env.apply(&shim_yaml(
        &rig.w,
        SHIM,
        "1",
        ("test", "coordinate-cli-none"),
    ));
    assert!(ok, "{out}");
    let halted = format!("shim_agent_rollout_halted{{shim=\"{SHIM}\"}} 0");
    let targeted = format!("shim_agent_shim_nodes{{shim=\"{SHIM}\",state=\"targeted\"}} 0");
    eventually(60, "the Shim's gauges", || async {
        let (_, m) = get(port, "/metrics")?;
        (m.contains(&halted) && m.contains(&targeted)).then_some(())
    })
    .await;

    // deleted: the finalizer comes off, the series go
    let (ok, out) = rig.env.kubectl(&["delete", "shim", SHIM, "--timeout=60s"]);
    assert!(ok, "{out}");
    eventually(30, "the deleted Shim's series gone", || async {
        let (_, m) = get(port, "/metrics")?;
        (!m.contains(&format!("shim=\"{SHIM}\""))).then_some(())
    })
    .await;

    let killed = Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(s) = running.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the coordinator still runs 20 s after SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    rig.force_delete(SHIM).await;
}
