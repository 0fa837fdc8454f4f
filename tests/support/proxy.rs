//! A real HTTP proxy for the tests: Debian's tinyproxy, unpacked by scripts/lib.sh's
//! `debian_tool` (scripts/test exports its path as `SHIM_AGENT_TINYPROXY`), run in the
//! foreground on a free loopback port with basic authentication, logging every request it
//! forwards. Stopped on drop. Without it the caller skips, unless `SHIM_AGENT_REQUIRE_PROXY=1`.

use std::path::PathBuf;
use std::process::{Child, Command};

/// The user and password the proxy asks for.
pub const USER: &str = "agent";
pub const PASSWORD: &str = "pr0xy-s3cret";

pub struct Tinyproxy {
    child: Child,
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// Where the binary is: `SHIM_AGENT_TINYPROXY`, else debian_tool's cache.
fn binary() -> Option<PathBuf> {
    let p = std::env::var_os("SHIM_AGENT_TINYPROXY")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/tmp/shim-agent-tools/tinyproxy-bin/root/usr/bin/tinyproxy".into());
    p.is_file().then_some(p)
}

/// A running proxy, or `None` (skipped, saying why) when there is no tinyproxy here.
pub fn tinyproxy(test: &str) -> Option<Tinyproxy> {
    let Some(bin) = binary() else {
        super::skip(
            test,
            "SHIM_AGENT_REQUIRE_PROXY",
            "no tinyproxy: run scripts/test, or set SHIM_AGENT_TINYPROXY (Debian's tinyproxy-bin)",
        );
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let port = super::free_port();
    let log = dir.path().join("tinyproxy.log");
    let conf = dir.path().join("tinyproxy.conf");
    std::fs::write(
        &conf,
        format!(
            "Port {port}\nListen 127.0.0.1\nTimeout 30\nLogFile \"{}\"\nLogLevel Connect\nMaxClients 20\nAllow 127.0.0.1\nBasicAuth {USER} {PASSWORD}\n",
            log.display()
        ),
    )
    .expect("write tinyproxy.conf");
    let mut cmd = Command::new(bin);
    cmd.args(["-d", "-c"]).arg(&conf);
    let child = super::spawn_listening(cmd, port, "tinyproxy", 10);
    Some(Tinyproxy {
        child,
        port,
        log,
        _dir: dir,
    })
}

impl Tinyproxy {
    /// `http://USER:PASSWORD@127.0.0.1:PORT`, or with another password.
    pub fn url_with(&self, password: &str) -> String {
        format!("http://{USER}:{password}@127.0.0.1:{}", self.port)
    }

    /// The requests it forwarded: `GET http://…` for each.
    pub fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once("]: Request (file descriptor ").map(|(_, r)| r))
            .filter_map(|r| r.split_once("): ").map(|(_, req)| req.to_string()))
            .collect()
    }
}

impl Drop for Tinyproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
