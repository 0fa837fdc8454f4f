//! Lifecycles of the agent in a real node, as the package runs it: the packaged unit under the
//! node env's systemd, with the kubelet's identity, against the kube env's real API server.
//!
//! - First boot: the agent starts before the node joined; the kubelet's kubeconfig arrives
//!   5 s later (or a bootstrap kubeconfig whose client certificate arrives later), and the
//!   agent goes on as a cluster agent without a restart.
//! - Crash isolation (`--features failpoints`): a Shim that panics the agent inside its round
//!   is set aside as `AgentCrashed` after two crashes; the other Shim converges; the Shim
//!   stays aside across a restart of the agent, and installs once its spec changes.
//! - A drift repair whose restart containerd refuses is rolled back to the drifted state,
//!   judged healthy, reported `DriftUnrepairable`, retried with backoff, and repaired once
//!   containerd takes it.
//!
//! Skipped with a reason without a node env (booted with host networking) or a kube env,
//! unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` / `SHIM_AGENT_REQUIRE_KUBE_ENV=1` (CI).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::{Api, Client, ResourceExt};
use shim_agent::cluster::node_label;
use shim_agent::cluster::nodestate::{NodePhase, ShimNodeState, parse_states};

use crate::support::kube::{KubeEnv, SERIAL, eventually, kube_env};
use crate::support::node_env::agent::write;
use crate::support::node_env::{self, NodeEnv, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

/// The Node label the test Shims select.
const SELECTOR: (&str, &str) = ("shim-agent-test", "node-lifecycle");
/// The artifact inside the node (not under /tmp: the unit has `PrivateTmp=yes`).
const ARTIFACT_DIR: &str = "srv/shim-agent-lifecycle";
const CONVERGE_SECS: u64 = 90;

/// The node env and the cluster, with the node's Node object and its name.
struct Setup {
    env: NodeEnv,
    kube: &'static KubeEnv,
    admin: Client,
    name: String,
}

/// The envs, with this node's Node object (and none of `shims` left from an earlier run).
async fn setup(test: &str, shims: &[&str]) -> Option<Setup> {
    let kube = kube_env()?;
    let env = node_env(test).await?;
    if !env.shares_host_network() {
        node_env::skip(
            test,
            "the node env does not share the host's network, so the agent inside cannot reach \
             the API server on 127.0.0.1:6443; boot it with INFRA_NETWORK=host",
        );
        return None;
    }
    let name = env
        .exec_ok(&["cat", "/proc/sys/kernel/hostname"])
        .trim()
        .to_string();
    let admin = kube.admin_client().await;
    let s = Setup {
        env,
        kube,
        admin,
        name,
    };
    s.env.remove_agent();
    s.remove_cluster_objects(shims);
    s.kube.create_node(&s.name, &[SELECTOR]).await;
    // the node stands for the coordinator election too (the coordinator makes the rollout
    // slots): the operator gave it a coordinator identity, as a node's own credential carries
    // no cluster-wide verbs
    write(
        &s.env
            .root
            .join(COORDINATOR_KUBECONFIG.trim_start_matches('/')),
        &std::fs::read(s.kube.coordinator_identity()).expect("the coordinator identity"),
        0o600,
    );
    Some(s)
}

/// Where the node keeps the coordinator identity.
const COORDINATOR_KUBECONFIG: &str = "/etc/shim-agent/coordinator.kubeconfig";

impl Setup {
    /// The agent's config: this node's name, and the coordinator identity to stand with.
    fn config(&self) -> String {
        format!(
            "[node]\nname = \"{}\"\n\n[kubernetes]\ncoordinator-kubeconfig = \"{COORDINATOR_KUBECONFIG}\"\n",
            self.name
        )
    }

    /// The node's runc shim as `containerd-shim-<shim>-v2`, with a version file, in the node.
    fn artifact(&self, shim: &str, version: &str) -> (String, String) {
        let bin = std::fs::read(self.env.root.join("usr/bin/containerd-shim-runc-v2"))
            .expect("runc shim in the rootfs");
        let file: &'static str = Box::leak(format!("containerd-shim-{shim}-v2").into_boxed_str());
        let bytes = tar_gz(&[
            Entry::File(file, bin, 0o755),
            Entry::File("VERSION", version.as_bytes().to_vec(), 0o644),
        ]);
        let rel = format!("{ARTIFACT_DIR}/{shim}-{version}.tar.gz");
        write(&self.env.root.join(&rel), &bytes, 0o644);
        (format!("file:///{rel}"), sha256_hex(&bytes))
    }

    fn apply_shim(&self, shim: &str, version: &str) {
        let (url, sha) = self.artifact(shim, version);
        let yaml = ShimBuilder::new(shim)
            .node_selector(SELECTOR.0, SELECTOR.1)
            .artifact(&url, &sha)
            .yaml();
        let (ok, out) = self.kube.apply(&yaml);
        assert!(ok, "kubectl apply: {out}");
    }

    /// The kubelet's identity for this node, as a kubeconfig.
    fn kubeconfig(&self) -> Vec<u8> {
        std::fs::read(self.kube.node_identity(&self.name)).expect("the node identity")
    }

    async fn node(&self) -> Option<KubeNode> {
        Api::<KubeNode>::all(self.admin.clone())
            .get_opt(&self.name)
            .await
            .ok()
            .flatten()
    }

    async fn labelled(&self, shim: &str) -> bool {
        self.node()
            .await
            .is_some_and(|n| n.labels().get(&node_label(shim)).map(String::as_str) == Some("true"))
    }

    /// This node's entry for `shim` in its state annotation.
    async fn entry(&self, shim: &str) -> Option<ShimNodeState> {
        let n = self.node().await?;
        parse_states(n.metadata.annotations.as_ref()).remove(shim)
    }

    async fn wait_labelled(&self, shim: &str) {
        eventually(CONVERGE_SECS, &format!("{shim}'s node label"), || async {
            self.labelled(shim).await.then_some(())
        })
        .await;
    }

    /// Delete the test's Shims (finalizers dropped), RuntimeClasses and the Node.
    fn remove_cluster_objects(&self, shims: &[&str]) {
        for s in shims {
            let _ = self
                .kube
                .kubectl(&["delete", "shim", s, "--ignore-not-found", "--wait=false"]);
            let _ = self.kube.kubectl(&[
                "patch",
                "shim",
                s,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
            let _ = self
                .kube
                .kubectl(&["delete", "runtimeclass", s, "--ignore-not-found"]);
        }
        let _ = self
            .kube
            .kubectl(&["delete", "node", &self.name, "--ignore-not-found"]);
        let _ = std::fs::remove_dir_all(self.env.root.join(ARTIFACT_DIR));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_before_the_node_joined_takes_up_the_kubeconfig_written_5_s_later() {
    const SHIM: &str = "nl-boot";
    let _serial = SERIAL.lock().await;
    let Some(s) = setup("lifecycle_first_boot", &[SHIM]).await else {
        return;
    };
    let agent = s.env.install_agent(&s.config(), None).await;
    s.apply_shim(SHIM, "1");
    agent.start();
    eventually(30, "the agent to run static Shims only", || async {
        agent
            .journal()
            .contains("running (static Shims only: no kubeconfig found)")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!s.labelled(SHIM).await, "no label before the node joined");

    // kubeadm join writes the kubelet's kubeconfig
    let joined = Instant::now();
    write(
        &s.env.root.join("etc/kubernetes/kubelet.conf"),
        &s.kubeconfig(),
        0o600,
    );
    s.wait_labelled(SHIM).await;
    eprintln!(
        "labelled {:.1} s after the kubeconfig appeared",
        joined.elapsed().as_secs_f64()
    );
    let journal = agent.journal();
    assert!(
        journal.contains("cluster credentials found: the node joined"),
        "{journal}"
    );
    assert_eq!(agent.show("NRestarts"), "0", "no restart of the agent");
    s.remove_cluster_objects(&[SHIM]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_waits_for_the_client_certificate_a_bootstrap_kubeconfig_names() {
    const SHIM: &str = "nl-bootstrap";
    let _serial = SERIAL.lock().await;
    let Some(s) = setup("lifecycle_bootstrap", &[SHIM]).await else {
        return;
    };
    // The kubelet's TLS bootstrap: /var/lib/kubelet/kubeconfig names the rotated
    // kubelet-client-current.pem (certificate and key in one file), issued later.
    let kc: serde_yaml::Value = serde_yaml::from_slice(&s.kubeconfig()).unwrap();
    let user = &kc["users"][0]["user"];
    let decode = |k: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .decode(user[k].as_str().expect("embedded credentials"))
            .expect("base64")
    };
    let pem = [decode("client-certificate-data"), decode("client-key-data")].concat();
    let mut bootstrap = kc.clone();
    let pem_path = "/var/lib/kubelet/pki/kubelet-client-current.pem";
    bootstrap["users"][0]["user"] = serde_yaml::from_str(&format!(
        "{{client-certificate: {pem_path}, client-key: {pem_path}}}"
    ))
    .unwrap();
    write(
        &s.env.root.join("var/lib/kubelet/kubeconfig"),
        serde_yaml::to_string(&bootstrap).unwrap().as_bytes(),
        0o600,
    );
    let agent = s.env.install_agent(&s.config(), None).await;
    s.apply_shim(SHIM, "1");
    agent.start();
    eventually(30, "the agent to wait for the certificate", || async {
        let j = agent.journal();
        (j.contains("static Shims only") && j.contains("kubelet-client-current.pem")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!s.labelled(SHIM).await);
    // the CSR is approved: the certificate appears
    write(&s.env.root.join(&pem_path[1..]), &pem, 0o600);
    s.wait_labelled(SHIM).await;
    assert_eq!(agent.show("NRestarts"), "0", "no restart of the agent");
    s.remove_cluster_objects(&[SHIM]);
}

#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shim_that_crashes_the_agent_twice_is_set_aside_and_the_other_shim_converges() {
    const BAD: &str = "nl-crash";
    const GOOD: &str = "nl-fine";
    let _serial = SERIAL.lock().await;
    let Some(s) = setup("lifecycle_crash_isolation", &[BAD, GOOD]).await else {
        return;
    };
    write(
        &s.env.root.join("etc/kubernetes/kubelet.conf"),
        &s.kubeconfig(),
        0o600,
    );
    // the failpoint stands for a Shim that panics the agent inside its round
    let dropin = format!("[Service]\nEnvironment=FAILPOINTS=round::{BAD}=panic\n");
    let agent = s.env.install_agent(&s.config(), Some(&dropin)).await;
    s.apply_shim(BAD, "1");
    s.apply_shim(GOOD, "1");
    agent.start();
    s.wait_labelled(GOOD).await;
    let entry = eventually(CONVERGE_SECS, "the crashing Shim set aside", || async {
        let e = s.entry(BAD).await?;
        (e.phase == NodePhase::Failed && e.reason.as_deref() == Some("AgentCrashed")).then_some(e)
    })
    .await;
    assert!(
        entry
            .message
            .unwrap_or_default()
            .contains("crashed 2 times"),
        "two crashes"
    );
    assert!(!s.labelled(BAD).await);
    // it crashed exactly twice: then it stays up
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(agent.show("NRestarts"), "2", "{}", agent.journal());
    assert_eq!(agent.show("ActiveState"), "active");

    // a restart (without the failpoint) keeps it aside: its spec did not change
    let _ = std::fs::remove_dir_all(s.env.root.join("etc/systemd/system/shim-agent.service.d"));
    s.env.systemd.reload().await.unwrap();
    s.env
        .exec_ok(&["systemctl", "restart", "shim-agent.service"]);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!s.labelled(BAD).await, "still aside after a restart");
    assert_eq!(
        s.entry(BAD).await.and_then(|e| e.reason),
        Some("AgentCrashed".to_string())
    );

    // a new spec is a new start
    s.apply_shim(BAD, "2");
    s.wait_labelled(BAD).await;
    assert!(s.labelled(GOOD).await);
    s.remove_cluster_objects(&[BAD, GOOD]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drift_repair_containerd_refuses_is_rolled_back_to_the_drifted_state_and_reported() {
    const SHIM: &str = "nl-drift";
    let _serial = SERIAL.lock().await;
    let Some(s) = setup("lifecycle_drift", &[SHIM]).await else {
        return;
    };
    write(
        &s.env.root.join("etc/kubernetes/kubelet.conf"),
        &s.kubeconfig(),
        0o600,
    );
    let verify_secs = 20;
    let config = format!(
        "{}\n[containerd]\nverify-timeout-secs = {verify_secs}\n",
        s.config()
    );
    let agent = s.env.install_agent(&config, None).await;
    s.apply_shim(SHIM, "1");
    agent.start();
    s.wait_labelled(SHIM).await;

    // the node owner's site policy: containerd refuses to start with that handler
    s.env
        .add_unit_dropin(
            "refuse-drift",
            &format!(
                "[Service]\nExecStartPre=/bin/sh -c '! grep -rqs {SHIM} /etc/containerd/config.toml /etc/containerd/conf.d'\n"
            ),
        )
        .await;
    // ... and removes the handler by hand
    let dropin = s
        .env
        .root
        .join(format!("etc/containerd/conf.d/shim-agent-{SHIM}.toml"));
    if dropin.exists() {
        std::fs::remove_file(&dropin).unwrap();
    } else {
        s.env.exec_ok(&[
            "shim-agent",
            "containerd",
            "remove-runtime",
            "--config",
            "/etc/containerd/config.toml",
            "--handler",
            SHIM,
        ]);
    }
    let drifted = s.env.config_files();
    let drift = Instant::now();

    // the repair's restart fails, the rollback restores the drifted bytes, and containerd,
    // healthy with them, is judged against them: DriftUnrepairable, not a broken node
    let entry = eventually(CONVERGE_SECS, "DriftUnrepairable", || async {
        let e = s.entry(SHIM).await?;
        (e.reason.as_deref() == Some("DriftUnrepairable")).then_some(e)
    })
    .await;
    let took = drift.elapsed();
    assert_eq!(entry.phase, NodePhase::Failed);
    assert!(
        took < Duration::from_secs(verify_secs),
        "reported after {took:?}: the rollback waited out the verify timeout"
    );
    assert_eq!(s.env.config_files(), drifted, "the drifted bytes are back");
    assert_eq!(
        s.env
            .exec_ok(&["systemctl", "is-active", "containerd"])
            .trim(),
        "active"
    );
    let journal = agent.journal();
    assert!(!journal.contains("the rollback failed too"), "{journal}");
    // backoff: no new attempt (no containerd restart) right away
    let invocation = s.env.invocation_id().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        s.env.invocation_id().await,
        invocation,
        "retried without backoff"
    );

    // containerd takes the handler again: the next attempt repairs the drift
    s.env.remove_unit_dropin("refuse-drift").await;
    eventually(CONVERGE_SECS, "the drift repaired", || async {
        let e = s.entry(SHIM).await?;
        (e.phase == NodePhase::Installed).then_some(())
    })
    .await;
    assert!(s.env.config_text().contains(&format!("handler {SHIM}")));
    s.remove_cluster_objects(&[SHIM]);
}
