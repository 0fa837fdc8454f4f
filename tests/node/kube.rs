//! The whole Kubernetes path on a real node: the agent binary runs INSIDE the node env
//! (`.ci/node-env/`: systemd 252 + containerd in systemd-nspawn, Debian's 1.6.20 or an upstream
//! 2.x build) as the packaged unit
//! `packaging/systemd/shim-agent.service`, finds the kubelet's kubeconfig (the node's own
//! identity `system:node:<name>`) at `/etc/kubernetes/kubelet.conf`, and talks to the real
//! kube-apiserver of the kube env (tests/support/kube.rs) on 127.0.0.1:6443, which the node
//! reaches because `boot.sh` ran with `INFRA_NETWORK=host` (scripts/test does).
//!
//! A `Shim` applied by the admin is installed (containerd restarted over D-Bus, verified
//! through CRI), the Node is labelled, the coordinator publishes the RuntimeClass, and a pod
//! sandbox then really starts through CRI with the new runtime handler (the shim process runs).
//! Deleting the Shim takes it all back, down to containerd's config bytes.
//!
//! The node gets what a kubelet's node has besides: the sandbox image (imported, there is no
//! registry), and two containerd settings for this machine's limits (see the comments there).
//! The coordinator that publishes the RuntimeClass may be another agent of the cluster (one
//! Lease per cluster); in CI it is this one.
//!
//! Skipped with a reason without a node env (booted with host networking) or a kube env,
//! unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` / `SHIM_AGENT_REQUIRE_KUBE_ENV=1` (CI).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::DeleteParams;
use kube::{Api, Client, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::cluster::{FINALIZER, node_label};
use shim_agent::node::RuntimeHealth;
use shim_agent::node::cri::proto;

use crate::support::kube::{KubeEnv, SERIAL, eventually, kube_env};
use crate::support::node_env::agent::{AGENT_BIN, AGENT_UNIT, AgentInNode, write};
use crate::support::node_env::{self, NodeEnv, UNIT, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

const TEST: &str = "node_kube";
/// The Shim, its RuntimeClass and its handler (the handler defaults to the Shim's name).
const SHIM: &str = "node-kube-demo";
/// The Node label the Shim selects.
const SELECTOR: (&str, &str) = ("shim-agent-test", "node-kube");
/// The artifact inside the node. Not under /tmp or /var/tmp: the packaged unit has
/// `PrivateTmp=yes`, so the agent would see empty ones there.
const ARTIFACT_DIR: &str = "srv/shim-agent-test";
/// How long the agent may take to install, label and publish (or to undo it all).
const CONVERGE_SECS: u64 = 90;
const CRI_CALL: Duration = Duration::from_secs(30);

/// Config files of containerd, as `NodeEnv::config_files` reads them.
type ConfigFiles = std::collections::BTreeMap<PathBuf, Vec<u8>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_in_the_node_installs_a_cluster_shim_and_a_pod_sandbox_runs_with_its_handler() {
    let t0 = Instant::now();
    let _serial = SERIAL.lock().await;
    let Some((kube, env)) = envs().await else {
        return;
    };
    let admin = kube.admin_client().await;
    let name = env
        .exec_ok(&["cat", "/proc/sys/kernel/hostname"])
        .trim()
        .to_string();
    assert!(!name.is_empty(), "the node has a host name");
    // Cleanup (and containerd's journal on failure) from here on, whatever happens.
    let mut guard = Cleanup {
        env: &env,
        kube,
        node: name.clone(),
        images_before: None,
    };
    guard.remove_leftovers();

    let config = join_the_cluster(&env, kube, &name).await;
    guard.images_before = Some(env.image_refs());
    if !give_containerd_what_a_node_has(&env, kube).await {
        return;
    }
    // (removed, and its journal printed on a failure, when dropped)
    let (agent, invocation) = start_the_packaged_agent(&env, &name, &config, t0).await;
    // containerd's config: the main file, and conf.d/ where the agent adds its drop-in on 2.x
    let original = env.config_files();
    let before = env.invocation_id().await;
    apply_the_shim(&env, kube);
    installed_labelled_published_served(&env, &admin, &name, &before, t0).await;
    // Checked to the end; the uninstall below runs whatever happened here, and the test fails
    // afterwards if this step did.
    let sandbox = run_sandbox(&env).await;
    match &sandbox {
        Ok(id) => eprintln!(
            "[{:>5.1}s] pod sandbox {id} ran with handler {SHIM}",
            secs(t0)
        ),
        Err(e) => eprintln!("[{:>5.1}s] pod sandbox FAILED: {e}", secs(t0)),
    }
    deleted_shim_takes_it_all_back(&env, &admin, &name, &original, t0).await;
    ran_without_a_restart_and_stops_cleanly(&env, &invocation);
    drop(agent);
    drop(guard);
    assert!(
        Api::<KubeNode>::all(admin.clone())
            .get_opt(&name)
            .await
            .expect("get the Node")
            .is_none(),
        "the Node object is deleted"
    );
    env.reset().await;
    eprintln!("[{:>5.1}s] done", secs(t0));
    if let Err(e) = sandbox {
        panic!("step 6: no pod sandbox with handler {SHIM}: {e}");
    }
}

/// Step 1: the kube env and a node env that shares the host's network (the agent inside
/// reaches the API server on 127.0.0.1); `None` (skipped, saying why) without them.
async fn envs() -> Option<(&'static KubeEnv, NodeEnv)> {
    let kube = kube_env()?;
    let env = node_env(TEST).await?;
    if !env.shares_host_network() {
        node_env::skip(
            TEST,
            "the node env does not share the host's network, so the agent inside cannot reach \
             the API server on 127.0.0.1:6443; boot it with INFRA_NETWORK=host",
        );
        return None;
    }
    Some((kube, env))
}

/// Step 2: the Node, its kubelet identity where kubeadm puts it, and a coordinator identity;
/// the agent's config.
async fn join_the_cluster(env: &NodeEnv, kube: &KubeEnv, name: &str) -> String {
    kube.create_node(name, &[SELECTOR]).await;
    let identity = kube.node_identity(name);
    write(
        &env.root.join("etc/kubernetes/kubelet.conf"),
        &std::fs::read(&identity).expect("read the node identity's kubeconfig"),
        0o600,
    );
    // the node stands for the coordinator election too: the operator gave it a coordinator
    // identity (a node's own credential carries no cluster-wide verbs)
    write(
        &env.root.join("etc/shim-agent/coordinator.kubeconfig"),
        &std::fs::read(kube.coordinator_identity()).expect("the coordinator identity"),
        0o600,
    );
    format!(
        "[node]\nname = \"{name}\"\n\n[kubernetes]\ncoordinator-kubeconfig = \"/etc/shim-agent/coordinator.kubeconfig\"\n"
    )
}

/// Step 3: what a kubelet's node has besides: the sandbox image (there is no registry to pull
/// it from) and a containerd that can start sandboxes on this machine, both given by the node
/// env harness (`NodeEnv::ensure_images`, `NodeEnv::fit_the_machine`: in the pristine config,
/// which the agent must give back byte for byte). `false` when this machine cannot (skipped,
/// saying why): containerd 2.x always sets a sandbox's cpu shares, so its node needs the cpu
/// controller.
async fn give_containerd_what_a_node_has(env: &NodeEnv, _kube: &KubeEnv) -> bool {
    let cpu_cgroup = env.exec(&[
        "sh",
        "-c",
        "test -d /sys/fs/cgroup/cpu || grep -qw cpu /sys/fs/cgroup/cgroup.controllers",
    ]);
    if !cpu_cgroup.status.success() && env.containerd.is_2x() {
        node_env::skip(
            TEST,
            "the node's cgroups have no cpu controller, and containerd 2.x (no \
             `disable_cgroup` any more) always sets the sandbox's cpu shares: on a host that \
             keeps its controllers on cgroup v1, boot the node with INFRA_CGROUP=hybrid",
        );
        return false;
    }
    true
}

/// Step 4: the agent, as the package installs it, started under systemd; running against the
/// cluster as the configured node. The agent and its unit's invocation.
async fn start_the_packaged_agent<'a>(
    env: &'a NodeEnv,
    name: &str,
    config: &str,
    t0: Instant,
) -> (AgentInNode<'a>, String) {
    let unit_text = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/shim-agent.service"),
    )
    .expect("the packaged unit");
    assert!(
        String::from_utf8_lossy(&unit_text).contains(&format!("ExecStart=/{AGENT_BIN} run")),
        "the packaged unit runs /{AGENT_BIN}"
    );
    // No /opt/shim-agent yet (remove_agent took it): the package's tmpfiles.d entry creates it
    // (its postinst runs systemd-tmpfiles, and systemd-tmpfiles-setup does at every boot).
    let agent = env.install_agent(config, None).await;
    agent.start();
    let invocation = agent.show("InvocationID");
    let this_run = || {
        env.exec_ok(&[
            "journalctl",
            &format!("_SYSTEMD_INVOCATION_ID={invocation}"),
            "--no-pager",
            "-o",
            "cat",
        ])
    };
    let journal = eventually(30, "the agent to run against the cluster", || async {
        let j = this_run();
        j.contains("shim-agent running (cluster and static Shims)")
            .then_some(j)
    })
    .await;
    assert!(
        journal.contains(&format!("as node {name}")),
        "the agent uses the configured node name: {journal}"
    );
    eprintln!("[{:>5.1}s] agent running in the node", secs(t0));
    (agent, invocation)
}

/// Step 5: the demo artifact inside the node, and the Shim applied by the admin.
fn apply_the_shim(env: &NodeEnv, kube: &KubeEnv) {
    let shim_bin = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2"))
        .expect("runc shim in the rootfs");
    let artifact = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", shim_bin, 0o755),
    ]);
    write(
        &env.root.join(ARTIFACT_DIR).join("demo.tar.gz"),
        &artifact,
        0o644,
    );
    let url = format!("file:///{ARTIFACT_DIR}/demo.tar.gz");
    let (ok, out) = kube.apply(&shim_yaml(&url, &sha256_hex(&artifact)));
    assert!(ok, "kubectl apply: {out}");
}

/// Step 6: installed (containerd restarted, the handler in its config and served by CRI), the
/// Node labelled, the RuntimeClass published, the Shim Ready with its finalizer.
async fn installed_labelled_published_served(
    env: &NodeEnv,
    admin: &Client,
    name: &str,
    before: &str,
    t0: Instant,
) {
    eventually(CONVERGE_SECS, "the node label", || async {
        (label(admin, name).await.as_deref() == Some("true")).then_some(())
    })
    .await;
    eprintln!("[{:>5.1}s] node labelled", secs(t0));
    let rcs: Api<RuntimeClass> = Api::all(admin.clone());
    let rc = eventually(CONVERGE_SECS, "the RuntimeClass", || async {
        rcs.get_opt(SHIM).await.ok().flatten()
    })
    .await;
    assert_eq!(rc.handler, SHIM);
    let selector = rc
        .scheduling
        .and_then(|s| s.node_selector)
        .unwrap_or_default();
    assert_eq!(
        selector.get(&node_label(SHIM)).map(String::as_str),
        Some("true"),
        "the RuntimeClass schedules onto labelled nodes"
    );
    assert_ne!(
        env.invocation_id().await,
        before,
        "containerd was restarted"
    );
    assert!(
        env.config_text()
            .contains(&format!("# shim-agent: handler {SHIM}")),
        "the handler is in containerd's config"
    );
    let st = env.cri.status(CRI_CALL).await.expect("CRI status");
    assert!(
        st.runtime_ready
            && st.handlers.contains(&SHIM.to_string())
            && st.handlers.contains(&"runc".to_string()),
        "{st:?}"
    );
    let shims: Api<Shim> = Api::all(admin.clone());
    eventually(CONVERGE_SECS, "the Shim's Ready=True", || async {
        let s = shims.get_opt(SHIM).await.ok().flatten()?;
        let c = s.status?.conditions?;
        c.iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
            .then_some(())
    })
    .await;
    let s = shims.get(SHIM).await.expect("the Shim");
    assert!(
        s.finalizers().contains(&FINALIZER.to_string()),
        "{:?}",
        s.finalizers()
    );
    eprintln!("[{:>5.1}s] RuntimeClass published, Shim Ready", secs(t0));
}

/// Step 8: the Shim goes: label, RuntimeClass, finalizer, containerd's config bytes, the
/// handler in CRI, the installed files.
async fn deleted_shim_takes_it_all_back(
    env: &NodeEnv,
    admin: &Client,
    name: &str,
    original: &ConfigFiles,
    t0: Instant,
) {
    let shims: Api<Shim> = Api::all(admin.clone());
    let rcs: Api<RuntimeClass> = Api::all(admin.clone());
    shims
        .delete(SHIM, &DeleteParams::default())
        .await
        .expect("delete the Shim");
    eventually(CONVERGE_SECS, "the label to go", || async {
        label(admin, name).await.is_none().then_some(())
    })
    .await;
    eventually(CONVERGE_SECS, "the RuntimeClass to go", || async {
        rcs.get_opt(SHIM)
            .await
            .ok()
            .is_some_and(|r| r.is_none())
            .then_some(())
    })
    .await;
    eventually(
        CONVERGE_SECS,
        "the Shim to go (finalizer removed)",
        || async {
            shims
                .get_opt(SHIM)
                .await
                .ok()
                .is_some_and(|s| s.is_none())
                .then_some(())
        },
    )
    .await;
    eventually(CONVERGE_SECS, "containerd's config bytes back", || async {
        (&env.config_files() == original).then_some(())
    })
    .await;
    let cri = env.cri.clone();
    eventually(CONVERGE_SECS, "CRI without the handler", || async {
        let st = cri.status(Duration::from_secs(2)).await.ok()?;
        (st.runtime_ready && !st.handlers.contains(&SHIM.to_string())).then_some(())
    })
    .await;
    assert!(
        !env.root.join("opt/shim-agent/shims").join(SHIM).exists(),
        "the installed shim is removed"
    );
    eprintln!("[{:>5.1}s] uninstalled, config bytes back", secs(t0));
}

/// Step 9: the agent ran all along under the hardened unit (no crash, no restart) and stops
/// cleanly on SIGTERM.
fn ran_without_a_restart_and_stops_cleanly(env: &NodeEnv, invocation: &str) {
    let show = |props: &str| {
        env.exec_ok(&["systemctl", "show", "--value", "-p", props, AGENT_UNIT])
            .trim()
            .to_string()
    };
    assert_eq!(
        (show("InvocationID"), show("NRestarts")),
        (invocation.to_string(), "0".to_string()),
        "the agent ran without a restart"
    );
    env.exec_ok(&["systemctl", "stop", AGENT_UNIT]);
    assert_eq!(
        (show("Result"), show("ExecMainStatus")),
        ("success".to_string(), "0".to_string()),
        "the agent stops cleanly on SIGTERM"
    );
}

/// RunPodSandbox with the handler and host network; it must be ready, listed with the handler,
/// run by the installed shim binary, and go away on stop + remove. The sandbox's ID, or what
/// went wrong (with containerd's last words).
async fn run_sandbox(env: &NodeEnv) -> Result<String, String> {
    let containerd_log = || {
        let out = env.exec(&[
            "journalctl",
            "-u",
            UNIT,
            "--no-pager",
            "-n",
            "5",
            "-o",
            "cat",
        ]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let id = env
        .cri
        .run_pod_sandbox(sandbox_config(), SHIM, CRI_CALL)
        .await
        .map_err(|e| {
            format!(
                "RunPodSandbox with handler {SHIM}: {}\ncontainerd:\n{}",
                node_env::chain(&e),
                containerd_log()
            )
        })?;
    let checked = check_sandbox(env, &id).await;
    let stopped = env.cri.stop_pod_sandbox(&id, CRI_CALL).await;
    let removed = env.cri.remove_pod_sandbox(&id, CRI_CALL).await;
    checked?;
    stopped.map_err(|e| format!("StopPodSandbox: {}", node_env::chain(&e)))?;
    removed.map_err(|e| format!("RemovePodSandbox: {}", node_env::chain(&e)))?;
    let listed = env
        .cri
        .list_pod_sandboxes(CRI_CALL)
        .await
        .map_err(|e| format!("ListPodSandbox: {}", node_env::chain(&e)))?;
    if listed.iter().any(|s| s.id == id) {
        return Err(format!("sandbox {id} still listed after RemovePodSandbox"));
    }
    Ok(id)
}

async fn check_sandbox(env: &NodeEnv, id: &str) -> Result<(), String> {
    if id.is_empty() {
        return Err("RunPodSandbox returned an empty id".into());
    }
    let status = env
        .cri
        .pod_sandbox_status(id, CRI_CALL)
        .await
        .map_err(|e| format!("PodSandboxStatus: {}", node_env::chain(&e)))?;
    if status.status.as_ref().map(|s| s.state) != Some(proto::SANDBOX_READY) {
        return Err(format!("the sandbox is not ready: {status:?}"));
    }
    // containerd's verbose info names the handler (1.x `runtimeHandler`, 2.x the sandbox
    // metadata's `RuntimeHandler`) and the runtime type it maps to: the installed shim
    let raw = status.info.get("info").cloned().unwrap_or_default();
    let info: serde_json::Value = serde_json::from_str(&raw)
        .map_err(|e| format!("the sandbox's verbose info is not JSON ({e}): {raw}"))?;
    let handler = info
        .get("runtimeHandler")
        .or_else(|| info.pointer("/sandboxMetadata/Metadata/RuntimeHandler"))
        .and_then(|h| h.as_str());
    let runtime_type = info.get("runtimeType").and_then(|t| t.as_str());
    let prefix = format!("/opt/shim-agent/shims/{SHIM}/");
    if handler != Some(SHIM) || !runtime_type.is_some_and(|t| t.starts_with(&prefix)) {
        return Err(format!(
            "the sandbox's runtime handler is not {SHIM} with the installed shim \
             (handler {handler:?}, runtime type {runtime_type:?}): {raw}"
        ));
    }
    let listed = env
        .cri
        .list_pod_sandboxes(CRI_CALL)
        .await
        .map_err(|e| format!("ListPodSandbox: {}", node_env::chain(&e)))?;
    match listed.iter().find(|s| s.id == id) {
        Some(s) if s.state == proto::SANDBOX_READY && s.runtime_handler == SHIM => {}
        other => return Err(format!("ListPodSandbox shows {other:?}")),
    }
    // the installed shim binary itself serves the sandbox
    let ps = env.exec_ok(&["ps", "-eo", "args"]);
    let prefix = format!("/opt/shim-agent/shims/{SHIM}/");
    if !ps
        .lines()
        .any(|l| l.starts_with(&prefix) && l.contains("/containerd-shim-demo-v2 "))
    {
        return Err(format!(
            "no {prefix}.../containerd-shim-demo-v2 process:\n{ps}"
        ));
    }
    Ok(())
}

fn secs(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64()
}

/// The demo Shim, selecting the test's Node. Without `runtime.options`: containerd 1.x's CRI
/// hands a handler whose runtime type is not `io.containerd.runc.v*` its options as
/// `runtimeoptions.v1.Options`, which the runc shim (the demo artifact) cannot decode ("type with
/// url runtimeoptions.v1.Options: not found"), so `BinaryName` would make every pod fail; the
/// runc shim finds /usr/sbin/runc on its PATH anyway.
fn shim_yaml(url: &str, sha: &str) -> String {
    ShimBuilder::new(SHIM)
        .node_selector(SELECTOR.0, SELECTOR.1)
        .artifact(url, sha)
        .yaml()
}

/// A host-network pod sandbox, as the kubelet asks for a `hostNetwork: true` pod.
fn sandbox_config() -> proto::PodSandboxConfig {
    proto::PodSandboxConfig {
        metadata: Some(proto::PodSandboxMetadata {
            name: "node-kube-sandbox".into(),
            uid: "6b1f4a4e-node-kube-sandbox".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        linux: Some(proto::LinuxPodSandboxConfig {
            cgroup_parent: String::new(),
            security_context: Some(proto::LinuxSandboxSecurityContext {
                namespace_options: Some(proto::NamespaceOption {
                    network: proto::NAMESPACE_NODE,
                    pid: proto::NAMESPACE_POD,
                    ipc: proto::NAMESPACE_POD,
                }),
            }),
        }),
        ..Default::default()
    }
}

async fn label(admin: &Client, node: &str) -> Option<String> {
    Api::<KubeNode>::all(admin.clone())
        .get_opt(node)
        .await
        .ok()
        .flatten()?
        .labels()
        .get(&node_label(SHIM))
        .cloned()
}

/// Everything the test adds to the node and the cluster, taken away on drop (also when the
/// test fails, after printing the agent's journal).
struct Cleanup<'a> {
    env: &'a NodeEnv,
    kube: &'a KubeEnv,
    node: String,
    /// containerd's image references before the test imported the sandbox image.
    images_before: Option<Vec<String>>,
}

impl Cleanup<'_> {
    /// What an earlier, interrupted run may have left: a running agent and its files, the Shim
    /// with its finalizer, the RuntimeClass, the artifact.
    fn remove_leftovers(&self) {
        self.env.remove_agent();
        self.remove_cluster_objects();
        self.remove_files();
    }

    fn remove_cluster_objects(&self) {
        let k = |args: &[&str]| {
            let _ = self.kube.kubectl(args);
        };
        k(&["delete", "shim", SHIM, "--ignore-not-found", "--wait=false"]);
        k(&[
            "patch",
            "shim",
            SHIM,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ]);
        k(&["delete", "runtimeclass", SHIM, "--ignore-not-found"]);
    }

    /// The test's own files (the agent's are `NodeEnv::remove_agent`'s).
    fn remove_files(&self) {
        let root = &self.env.root;
        let _ = std::fs::remove_dir_all(root.join(ARTIFACT_DIR));
        let _ = std::fs::remove_dir(root.join("etc/kubernetes"));
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        // (the agent: stopped, removed and its journal printed by `AgentInNode`, dropped first)
        if std::thread::panicking() {
            let out = self.env.exec(&[
                "journalctl",
                "-u",
                UNIT,
                "--no-pager",
                "-n",
                "40",
                "-o",
                "cat",
            ]);
            eprintln!(
                "==== journalctl -u {UNIT} -n 40 ====\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        self.env.remove_agent();
        self.remove_cluster_objects();
        self.remove_files();
        if let Some(before) = &self.images_before {
            let added: Vec<String> = self
                .env
                .image_refs()
                .into_iter()
                .filter(|r| !before.contains(r))
                .collect();
            self.env.remove_images(&added);
        }
        let _ = self
            .kube
            .kubectl(&["delete", "node", &self.node, "--ignore-not-found"]);
    }
}
