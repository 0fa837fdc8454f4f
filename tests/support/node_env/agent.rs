//! The agent as the package installs it, inside the node: the test build of the binary at
//! `/usr/bin/shim-agent`, the packaged unit and tmpfiles entry, and its config; started,
//! stopped and read through the node's own systemd and journal.

use std::path::Path;

use super::NodeEnv;

/// The agent's unit inside the node.
pub const AGENT_UNIT: &str = "shim-agent.service";
/// Where the packaged unit runs the agent from (its `ExecStart=`).
pub const AGENT_BIN: &str = "usr/bin/shim-agent";

/// The agent installed in a node env; removed (stopped, files gone) on drop.
pub struct AgentInNode<'a> {
    pub env: &'a NodeEnv,
    /// The node's clock when it was installed (`@<unix seconds>`): its journal starts there.
    since: String,
}

/// Write a file of the node (creating its directory) with this mode.
pub fn write(path: &Path, bytes: &[u8], mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create a directory in the node");
    }
    std::fs::write(path, bytes).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", path.display()));
}

impl NodeEnv {
    /// Install the agent as the package does, with `config` as `/etc/shim-agent/config.toml`
    /// and `dropin` (if any) as a drop-in of its unit; not started. (Call
    /// [`NodeEnv::remove_agent`] first for a node without an earlier test's agent.)
    pub async fn install_agent(&self, config: &str, dropin: Option<&str>) -> AgentInNode<'_> {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        write(
            &self.root.join(AGENT_BIN),
            &std::fs::read(env!("CARGO_BIN_EXE_shim-agent")).expect("the agent binary"),
            0o755,
        );
        let unit = std::fs::read(manifest.join("packaging/systemd/shim-agent.service"))
            .expect("the packaged unit");
        write(
            &self.root.join("etc/systemd/system").join(AGENT_UNIT),
            &unit,
            0o644,
        );
        if let Some(text) = dropin {
            write(
                &self
                    .root
                    .join("etc/systemd/system/shim-agent.service.d/50-test.conf"),
                text.as_bytes(),
                0o644,
            );
        }
        write(
            &self.root.join("usr/lib/tmpfiles.d/shim-agent.conf"),
            &std::fs::read(manifest.join("packaging/tmpfiles/shim-agent.conf")).unwrap(),
            0o644,
        );
        write(
            &self.root.join("etc/shim-agent/config.toml"),
            config.as_bytes(),
            0o644,
        );
        self.exec_ok(&["systemd-tmpfiles", "--create", "shim-agent.conf"]);
        self.systemd.reload().await.expect("daemon-reload");
        let since = format!("@{}", self.exec_ok(&["date", "+%s"]).trim());
        AgentInNode { env: self, since }
    }

    /// Stop the agent and remove everything [`NodeEnv::install_agent`] and the agent wrote
    /// (its state, installed shims, the kubelet's kubeconfigs a test wrote).
    pub fn remove_agent(&self) {
        let _ = self.exec(&["systemctl", "stop", AGENT_UNIT]);
        let _ = self.exec(&["systemctl", "reset-failed", AGENT_UNIT]);
        for f in [
            AGENT_BIN,
            "etc/systemd/system/shim-agent.service",
            "usr/lib/tmpfiles.d/shim-agent.conf",
            "etc/kubernetes/kubelet.conf",
            "var/lib/kubelet/kubeconfig",
        ] {
            let _ = std::fs::remove_file(self.root.join(f));
        }
        for d in [
            "etc/systemd/system/shim-agent.service.d",
            "etc/shim-agent",
            "opt/shim-agent",
            "var/lib/shim-agent",
            "var/lib/kubelet/pki",
        ] {
            let _ = std::fs::remove_dir_all(self.root.join(d));
        }
        let _ = self.exec(&["systemctl", "daemon-reload"]);
    }
}

impl AgentInNode<'_> {
    pub fn start(&self) {
        self.env.exec_ok(&["systemctl", "start", AGENT_UNIT]);
    }

    pub fn stop(&self) {
        self.env.exec_ok(&["systemctl", "stop", AGENT_UNIT]);
    }

    /// A property of the unit (`systemctl show -P`).
    pub fn show(&self, prop: &str) -> String {
        self.env
            .exec_ok(&["systemctl", "show", "-P", prop, AGENT_UNIT])
            .trim()
            .to_string()
    }

    /// The agent's journal since the unit was installed (every run).
    pub fn journal(&self) -> String {
        let out = self.env.exec(&[
            "journalctl",
            "-u",
            AGENT_UNIT,
            "--since",
            &self.since,
            "--no-pager",
            "-o",
            "cat",
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for AgentInNode<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "==== journalctl -u {AGENT_UNIT} (in the node) ====\n{}",
                self.journal()
            );
        }
        self.env.remove_agent();
    }
}
