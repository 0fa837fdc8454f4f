//! The real Kubernetes control plane for tests (kube-apiserver, controller manager and etcd
//! on loopback, with Node,RBAC authorization and NodeRestriction), as envtest gives Go
//! projects. Its scripts live in `$KUBE_ENV_DIR` (default: the CI machine's copy beside the
//! repository). Without them the tests skip, unless `SHIM_AGENT_REQUIRE_KUBE_ENV=1` (CI).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

/// The user name of the tests' coordinator identity.
pub const COORDINATOR_USER: &str = "shim-agent:coordinator";

pub struct KubeEnv {
    pub dir: PathBuf,
    pub admin: PathBuf,
    pub kubectl: PathBuf,
}

static ENV: OnceLock<Option<KubeEnv>> = OnceLock::new();

/// Tests that share the one cluster take turns (one coordinator Lease per cluster).
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The running control plane with the manifests applied, or `None` (test skips).
pub fn kube_env() -> Option<&'static KubeEnv> {
    ENV.get_or_init(start).as_ref()
}

/// The agents' logs into each test's captured output, which libtest prints when the test
/// fails: what the agents did at info level, and the coordinator's and the rollout hooks'
/// decisions (`RUST_LOG` replaces this). One filter for the whole test process, whichever
/// test comes first: a CI failure that showed error lines alone said nothing of what the
/// agent was waiting for.
pub fn trace_to_test() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(
            "warn,shim_agent=info,shim_agent::cluster::coordinator=debug,shim_agent::hooks::rollout=debug",
        )
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .with_ansi(false)
        .try_init();
}

/// Where kube-env's scripts are (`KUBE_ENV_DIR`, or the shared copy beside the repository).
fn kube_env_dir() -> PathBuf {
    std::env::var_os("KUBE_ENV_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kube-env"))
}

/// Run `up.sh` (with `vars` for an instance of its own) and describe the instance it started.
fn up(dir: PathBuf, vars: &[(&'static str, String)], what: &str) -> Option<KubeEnv> {
    let out = Command::new(dir.join("up.sh"))
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("run up.sh");
    assert!(
        out.status.success(),
        "{what} did not start: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let admin = PathBuf::from(String::from_utf8_lossy(&out.stdout).lines().last()?.trim());
    let state = std::env::var("KUBE_ENV_STATE").unwrap_or_else(|_| "/var/tmp/kube-env".into());
    Some(KubeEnv {
        dir,
        admin,
        kubectl: PathBuf::from(state).join("bin/kubectl"),
    })
}

fn start() -> Option<KubeEnv> {
    let dir = kube_env_dir();
    if !dir.join("up.sh").exists() || std::env::var("SHIM_AGENT_KUBE_ENV").is_ok_and(|v| v == "0") {
        super::skip(
            "kube env",
            "SHIM_AGENT_REQUIRE_KUBE_ENV",
            &format!(
                "no kube env at {} (set KUBE_ENV_DIR; SHIM_AGENT_KUBE_ENV=0 turns it off)",
                dir.display()
            ),
        );
        return None;
    }
    let env = up(dir, &[], "kube env")?;
    let manifests = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests.yaml");
    let out = env.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        manifests.to_str()?,
    ]);
    assert!(out.0, "manifests do not apply: {}", out.1);
    let out = env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/shims.containerd.x-k8s.io",
        "crd/shimextensions.containerd.x-k8s.io",
    ]);
    assert!(out.0, "CRD not established: {}", out.1);
    Some(env)
}

impl KubeEnv {
    /// kubectl as the admin: (success, stdout + stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        self.kubectl_as(&self.admin, args)
    }

    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .output()
            .expect("run kubectl");
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    /// kubectl apply of a document on stdin, as `kubeconfig`.
    pub fn apply_as(&self, kubeconfig: &Path, yaml: &str) -> (bool, String) {
        use std::io::Write;
        let mut child = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["apply", "--server-side", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    }

    pub fn apply(&self, yaml: &str) -> (bool, String) {
        self.apply_as(&self.admin.clone(), yaml)
    }

    /// `kubectl apply --dry-run=server` of `yaml` as the admin: what the API server (its
    /// schema, CEL rules and admission) says of it, nothing stored.
    pub fn apply_dry_run(&self, yaml: &str) -> (bool, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("objects.yaml");
        std::fs::write(&path, yaml).unwrap();
        self.kubectl(&["apply", "--dry-run=server", "-f", path.to_str().unwrap()])
    }

    /// A kubelet's identity for Node `node` (user system:node:<node>, group system:nodes).
    pub fn node_identity(&self, node: &str) -> PathBuf {
        self.identity(&format!("system:node:{node}"), &["system:nodes"])
    }

    /// A coordinator identity (group `containerd.x-k8s.io:coordinators`): what an operator
    /// gives the agents that stand for the coordinator election.
    pub fn coordinator_identity(&self) -> PathBuf {
        self.identity(
            COORDINATOR_USER,
            &[shim_agent::api::rbac::COORDINATOR_GROUP],
        )
    }

    pub fn identity(&self, user: &str, groups: &[&str]) -> PathBuf {
        let out = Command::new(self.dir.join("identity.sh"))
            .arg(user)
            .args(groups)
            .output()
            .expect("identity.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }

    /// A kubeconfig acting as ServiceAccount `sa` of `shim-agent-system`, with a token bound to
    /// Node `node` (or to nothing), as `kubectl create token` makes it.
    pub fn token_kubeconfig(&self, sa: &str, node: Option<&str>) -> PathBuf {
        self.token_kubeconfig_in("shim-agent-system", sa, node)
    }

    /// [`KubeEnv::token_kubeconfig`] for ServiceAccount `sa` of namespace `ns`.
    pub fn token_kubeconfig_in(&self, ns: &str, sa: &str, node: Option<&str>) -> PathBuf {
        let mut args = vec!["create", "token", sa, "-n", ns];
        if let Some(n) = node {
            args.extend(["--bound-object-kind", "Node", "--bound-object-name", n]);
        }
        let (ok, token) = self.kubectl(&args);
        assert!(ok, "{token}");
        let mut kc = Kubeconfig::read_from(&self.admin).unwrap();
        for a in &mut kc.auth_infos {
            a.auth_info = Some(kube::config::AuthInfo {
                token: Some(token.trim().to_string().into()),
                ..Default::default()
            });
        }
        let path = std::env::temp_dir().join(format!(
            "shim-agent-token-{ns}-{sa}-{}-{}-{}.kubeconfig",
            node.unwrap_or("unbound"),
            self.admin
                .parent()
                .and_then(|p| p.file_name())
                .and_then(|n| n.to_str())
                .unwrap_or(""),
            std::process::id()
        ));
        std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();
        path
    }

    /// A dedicated node identity's certificate for Node `node` (user
    /// `containerd.x-k8s.io:node:<node>` in the node agents' group).
    pub fn dedicated_node_identity(&self, node: &str) -> PathBuf {
        self.identity(
            &format!("{}{node}", shim_agent::api::rbac::AGENT_USER_PREFIX),
            &[shim_agent::api::rbac::AGENT_GROUP],
        )
    }

    /// Start kube-scheduler beside this control plane, if it is not running (up.sh keeps
    /// what runs). It schedules only pods without a nodeName, onto Ready nodes with room:
    /// the Node objects other tests create have no status, so no pod lands on them.
    pub fn with_scheduler(&self) {
        let out = Command::new(self.dir.join("up.sh"))
            .env("KUBE_ENV_SCHEDULER", "1")
            .output()
            .expect("run up.sh");
        assert!(
            out.status.success(),
            "kube-scheduler did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub async fn admin_client(&self) -> Client {
        client_for(&self.admin).await
    }

    /// Create (or recreate) a Node object with these labels.
    pub async fn create_node(&self, name: &str, labels: &[(&str, &str)]) {
        let api: Api<Node> = Api::all(self.admin_client().await);
        let _ = api.delete(name, &DeleteParams::default()).await;
        for _ in 0..50 {
            if api.get_opt(name).await.unwrap().is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let labels: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
        }))
        .unwrap();
        api.create(&PostParams::default(), &node).await.unwrap();
    }
}

pub async fn client_for(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    Client::try_from(config).unwrap()
}

/// A client for `kubeconfig` on the agent's own transport, each request passed through
/// `observe` on its way out (recorded, or rewritten).
pub async fn observed_client_for<F>(kubeconfig: &Path, observe: F) -> Client
where
    F: Fn(http::Request<kube::client::Body>) -> http::Request<kube::client::Body>
        + Clone
        + Send
        + Sync
        + 'static,
{
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    shim_agent::cluster::transport::client_observed(config, observe).unwrap()
}

/// `req` turned into a watch of Node `node` that the API server holds for `secs` before it
/// ends it: a slow endpoint for that one request, on the real server.
pub fn hold_as_watch(req: &mut http::Request<kube::client::Body>, node: &str, secs: u64) {
    *req.method_mut() = http::Method::GET;
    *req.uri_mut() = format!(
        "/api/v1/nodes?fieldSelector=metadata.name%3D{node}&watch=true&timeoutSeconds={secs}"
    )
    .parse()
    .unwrap();
}

/// Poll `f` every 100 ms until it returns `Some`, or panic after `secs` naming `what`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A control plane of its own beside the shared one (another instance name and ports, see
/// kube-env's README), with nothing applied; stopped and wiped on drop. `None` (the test
/// skips) without the kube env, as [`kube_env`].
pub struct Instance {
    pub env: KubeEnv,
    vars: Vec<(&'static str, String)>,
}

impl Instance {
    /// Start instance `name` with its API server on `port`, etcd on `etcd` and `etcd + 10`,
    /// and no controller manager.
    pub fn start(name: &str, port: u16, etcd: u16) -> Option<Instance> {
        kube_env()?;
        let vars = vec![
            ("KUBE_ENV_NAME", name.to_string()),
            ("KUBE_ENV_PORT", port.to_string()),
            ("KUBE_ENV_ETCD_PORT", etcd.to_string()),
            ("KUBE_ENV_ETCD_PEER_PORT", (etcd + 10).to_string()),
            ("KUBE_ENV_NO_KCM", "1".to_string()),
        ];
        let env = up(kube_env_dir(), &vars, &format!("kube env instance {name}"))?;
        Some(Instance { env, vars })
    }

    /// A kubelet's identity for Node `node` on this instance.
    pub fn node_identity(&self, node: &str) -> PathBuf {
        self.identity(&format!("system:node:{node}"), &["system:nodes"])
    }

    /// A coordinator identity on this instance.
    pub fn coordinator_identity(&self) -> PathBuf {
        self.identity(
            COORDINATOR_USER,
            &[shim_agent::api::rbac::COORDINATOR_GROUP],
        )
    }

    /// An identity `user` in `groups` on this instance.
    pub fn identity(&self, user: &str, groups: &[&str]) -> PathBuf {
        let out = Command::new(self.env.dir.join("identity.sh"))
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .arg(user)
            .args(groups)
            .output()
            .expect("identity.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = Command::new(self.env.dir.join("down.sh"))
            .envs(self.vars.iter().map(|(k, v)| (k, v)))
            .arg("--wipe")
            .output();
    }
}
