//! `shim-agent doctor` on a real node (`.ci/node-env/`: systemd, containerd, its CRI) joined
//! to the kube env's API server: a healthy node blocks nothing; then one thing broken at a
//! time, as an operator's node breaks (containerd stopped, its config unreadable, a registry's
//! hosts.toml broken, no sandbox image, no API server, another node's kubeconfig, a kubeconfig
//! still waiting for its certificate), each found, judged and explained, with the exit code
//! saying whether installs are blocked. A proxy's password never reaches the report.
//!
//! Skipped with a reason without a node env and a kube env, unless required (CI).

use serde_json::Value;

use crate::support::kube::kube_env;
use crate::support::node_env::agent::write;
use crate::support::node_env::{self, NodeEnv, node_env};

const TEST: &str = "node_doctor";
const KUBECONFIG: &str = "etc/kubernetes/kubelet.conf";
const DROPIN: &str = "etc/systemd/system/shim-agent.service.d/50-proxy.conf";

/// `shim-agent doctor --json` inside the node: its exit code and report.
fn doctor(env: &NodeEnv) -> (i32, Value) {
    let out = env.exec(&["shim-agent", "doctor", "--json"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let report: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "doctor --json printed no JSON ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

/// The findings of one check: `(level, summary)`.
fn findings(report: &Value, check: &str) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["check"] == check)
        .map(|f| {
            (
                f["level"].as_str().unwrap_or("").to_string(),
                f["summary"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// The one finding of `check` has `level`; its summary.
#[track_caller]
fn expect(report: &Value, check: &str, level: &str) -> String {
    let f = findings(report, check);
    assert!(
        f.iter().any(|(l, _)| l == level),
        "{check}: want {level}, got {f:?}\nreport: {report:#}"
    );
    f.into_iter()
        .find(|(l, _)| l == level)
        .map(|(_, s)| s)
        .unwrap_or_default()
}

/// Puts back what the test broke, whatever happens.
struct Restore<'a>(&'a NodeEnv);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let env = self.0;
        let _ = env.exec(&["systemctl", "start", "containerd.service"]);
        env.restore_config();
        let _ = std::fs::remove_dir_all(env.root.join("etc/containerd/certs.d"));
        env.remove_agent();
        let _ = std::fs::remove_file(env.root.join(DROPIN));
        let _ = env.exec(&["systemctl", "daemon-reload"]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_finds_each_broken_precondition_and_says_what_to_do() {
    let Some(kube) = kube_env() else { return };
    let Some(env) = node_env(TEST).await else {
        return;
    };
    if !env.shares_host_network() {
        node_env::skip(
            TEST,
            "the node env does not share the host's network (INFRA_NETWORK=host), so it cannot reach the API server",
        );
        return;
    }
    let _restore = Restore(&env);
    env.remove_agent();
    let name = env
        .exec_ok(&["cat", "/proc/sys/kernel/hostname"])
        .trim()
        .to_string();
    let _agent = env.install_agent("", None).await;
    env.ensure_images();
    write(
        &env.root.join(KUBECONFIG),
        &std::fs::read(kube.node_identity(&name)).expect("identity"),
        0o600,
    );
    write(
        &env.root.join(DROPIN),
        b"[Service]\nEnvironment=\"HTTPS_PROXY=http://agent:s3cret@proxy.example:3128\" \"NO_PROXY=127.0.0.1,.svc\"\n",
        0o644,
    );
    env.exec_ok(&["systemctl", "daemon-reload"]);

    // --- healthy: nothing blocks; each check says what it found --------------------------
    let (rc, r) = doctor(&env);
    assert_eq!(rc, 0, "{r:#}");
    assert_eq!(r["blocking"], false);
    assert_eq!(r["target"], format!("node {name}"));
    expect(&r, "containerd.unit", "ok");
    expect(&r, "containerd.config", "ok");
    let version = expect(&r, "containerd.version", "ok");
    assert!(version.starts_with("containerd "), "{version}");
    expect(&r, "cri.socket", "ok");
    let sandbox = expect(&r, "cri.sandbox-image", "ok");
    assert!(sandbox.contains(&env.sandbox_image()), "{sandbox}");
    expect(&r, "kube.credentials", "ok");
    expect(&r, "kube.api-server", "ok");
    let who = expect(&r, "kube.identity", "ok");
    assert!(who.starts_with(&format!("system:node:{name}")), "{who}");
    expect(&r, "kube.clock-skew", "ok");
    expect(&r, "disk.state", "ok");
    expect(&r, "disk.install", "ok");
    let proxy = expect(&r, "proxy", "info");
    assert!(
        proxy.contains(
            "shim-agent.service: HTTPS_PROXY=http://***@proxy.example:3128 NO_PROXY=127.0.0.1,.svc"
        ),
        "{proxy}"
    );
    let text = env.exec(&["shim-agent", "doctor"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.ends_with("nothing blocks installs\n") || text.contains("nothing blocks installs;"),
        "{text}"
    );
    assert!(
        !text.contains("s3cret") && !r.to_string().contains("s3cret"),
        "a proxy password reached the report"
    );

    // --- another node's kubeconfig: the identity is refused --------------------------------
    write(
        &env.root.join(KUBECONFIG),
        &std::fs::read(kube.node_identity("doctor-other")).expect("identity"),
        0o600,
    );
    let (rc, r) = doctor(&env);
    assert_eq!(rc, 1, "{r:#}");
    let s = expect(&r, "kube.identity", "fail");
    assert!(
        s.contains("system:node:doctor-other") && s.contains(&name),
        "{s}"
    );

    // --- an API server that does not answer; the token never shows -------------------------
    let unreachable = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: tok-s3cret}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
    write(&env.root.join(KUBECONFIG), unreachable.as_bytes(), 0o600);
    let (rc, r) = doctor(&env);
    assert_eq!(rc, 1, "{r:#}");
    expect(&r, "kube.api-server", "fail");
    assert!(
        !r.to_string().contains("tok-s3cret"),
        "the token reached the report"
    );

    // --- a kubeconfig still waiting for its client certificate (first boot) ---------------
    let waiting = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: u\n  user: {client-certificate: /var/lib/kubelet/pki/kubelet-client-current.pem, client-key: /var/lib/kubelet/pki/kubelet-client-current.pem}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n";
    write(&env.root.join(KUBECONFIG), waiting.as_bytes(), 0o600);
    let (rc, r) = doctor(&env);
    assert_eq!(
        rc, 0,
        "a node that has not joined yet is not blocked: {r:#}"
    );
    let s = expect(&r, "kube.credentials", "warn");
    assert!(s.contains("kubelet-client-current.pem"), "{s}");
    std::fs::remove_file(env.root.join(KUBECONFIG)).expect("remove the kubeconfig");

    // --- a registry's hosts.toml that containerd cannot read -------------------------------
    // config_path set in containerd's config as an operator sets it (2.x's default config
    // has the table already, with an empty path)
    let config = std::fs::read_to_string(env.config_file()).expect("config");
    let mut doc: toml_edit::DocumentMut = config.parse().expect("the node's config parses");
    let cri = if env.containerd.config_version >= 3 {
        "io.containerd.cri.v1.images"
    } else {
        "io.containerd.grpc.v1.cri"
    };
    doc["plugins"][cri]["registry"]["config_path"] = toml_edit::value("/etc/containerd/certs.d");
    std::fs::write(env.config_file(), doc.to_string()).expect("write the config");
    write(&env.root.join("etc/containerd/certs.d/docker.io/hosts.toml"), b"server = \"https://registry-1.docker.io\"\n[host.\"https://mirror.example\"]\ncapabilities = [\"pull\"]\n", 0o644);
    write(
        &env.root
            .join("etc/containerd/certs.d/bad.example/hosts.toml"),
        b"[host.\"https://m\"\n",
        0o644,
    );
    let (rc, r) = doctor(&env);
    assert_eq!(rc, 0, "{r:#}");
    let s = expect(&r, "containerd.registry-hosts", "warn");
    assert!(
        s.starts_with("/etc/containerd/certs.d/bad.example/hosts.toml: not valid TOML"),
        "{s}"
    );
    let s = expect(&r, "containerd.registry-hosts", "ok");
    assert_eq!(
        s,
        "config_path /etc/containerd/certs.d: hosts.toml for bad.example, docker.io"
    );

    // --- containerd's config unreadable ------------------------------------------------------
    std::fs::write(env.config_file(), "version = [\n").expect("write the config");
    let (rc, r) = doctor(&env);
    assert_eq!(rc, 1, "{r:#}");
    expect(&r, "containerd.config", "fail");
    env.restore_config();

    // --- no sandbox image: the check would have to pull it -----------------------------------
    let image = env.sandbox_image();
    env.remove_images(std::slice::from_ref(&image));
    let (rc, r) = doctor(&env);
    env.ensure_images();
    assert_eq!(rc, 0, "{r:#}");
    let s = expect(&r, "cri.sandbox-image", "warn");
    assert!(
        s.starts_with(&format!("{image} is not in containerd's image store")),
        "{s}"
    );

    // --- no room where shims are installed ----------------------------------------------------
    env.exec_ok(&["mkdir", "-p", "/opt/shim-agent/shims"]);
    let mounted = env.exec(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=1m",
        "doctor-full",
        "/opt/shim-agent/shims",
    ]);
    if mounted.status.success() {
        let (rc, r) = doctor(&env);
        env.exec_ok(&["umount", "/opt/shim-agent/shims"]);
        assert_eq!(rc, 1, "{r:#}");
        let s = expect(&r, "disk.install", "fail");
        assert!(
            s.starts_with("/opt/shim-agent/shims: 1 MiB free")
                || s.starts_with("/opt/shim-agent/shims: 0 MiB free"),
            "{s}"
        );
    } else {
        eprintln!(
            "(no tmpfs mount in this node: {})",
            String::from_utf8_lossy(&mounted.stderr)
        );
    }

    // --- containerd stopped -------------------------------------------------------------------
    env.exec_ok(&["systemctl", "stop", "containerd.service"]);
    let (rc, r) = doctor(&env);
    env.exec_ok(&["systemctl", "start", "containerd.service"]);
    assert_eq!(rc, 1, "{r:#}");
    let s = expect(&r, "containerd.unit", "fail");
    assert!(s.starts_with("containerd.service is inactive/dead"), "{s}");
    expect(&r, "cri.socket", "fail");
    expect(&r, "cri.sandbox-image", "skip");
}
