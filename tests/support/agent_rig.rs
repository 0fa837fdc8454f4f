//! A node agent against the real API server (tests/support/kube.rs), with the scripted
//! containerd of tests/support/live.rs on the host side.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::cluster::connect::Source;
use shim_agent::cluster::coordinator::CoordinatorConfig;
use shim_agent::cluster::coordinator::election::Timings;
use shim_agent::cluster::node_label;
use shim_agent::cluster::session::{self, SessionConfig};
use shim_agent::state::Origin;

use super::kube::{KubeEnv, eventually, kube_env};
use super::live::{FakeContainerd, World, node, world};

/// Fast election timings for tests.
pub fn fast() -> CoordinatorConfig {
    CoordinatorConfig {
        timings: Timings {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_secs(2),
            retry_period: Duration::from_millis(500),
        },
        status_interval: Duration::from_millis(500),
    }
}

pub struct Rig {
    pub env: &'static KubeEnv,
    pub name: String,
    pub kubeconfig: PathBuf,
    pub admin: Client,
    pub w: World,
}

impl Rig {
    /// A Node `<test>-node` labelled `test=<test>`, and its kubelet identity.
    pub async fn new(test: &str) -> Option<Rig> {
        crate::support::kube::trace_to_test();
        let env = kube_env()?;
        let name = format!("{test}-node");
        env.create_node(&name, &[("test", test)]).await;
        Some(Rig {
            env,
            kubeconfig: env.node_identity(&name),
            admin: env.admin_client().await,
            name,
            w: world(),
        })
    }

    pub fn config(&self) -> SessionConfig {
        SessionConfig {
            source: Source::Kubeconfig(self.kubeconfig.clone()),
            node_name: self.name.clone(),
            coordinator_source: Some(Source::Kubeconfig(self.env.coordinator_identity())),
            coordinator: fast(),
            node_wait: Duration::from_secs(10),
            credential_check: Duration::from_millis(500),
            gate: shim_agent::cluster::agent::gate::GateTimings::default(),
            startup_taint: None,
        }
    }

    /// The node's client on the agent's transport, each request passed through `observe`
    /// on its way out (recorded, or rewritten).
    pub async fn observed_client<F>(&self, observe: F) -> Client
    where
        F: Fn(http::Request<kube::client::Body>) -> http::Request<kube::client::Body>
            + Clone
            + Send
            + Sync
            + 'static,
    {
        super::kube::observed_client_for(&self.kubeconfig, observe).await
    }

    /// A coordinator with the coordinator identity and [`fast`] timings, until `stop`.
    pub async fn spawn_coordinator(
        &self,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let client = super::kube::client_for(&self.env.coordinator_identity()).await;
        tokio::spawn(shim_agent::cluster::coordinator::run(
            client,
            self.name.clone(),
            fast(),
            stop,
        ))
    }

    pub async fn node(&self) -> KubeNode {
        Api::<KubeNode>::all(self.admin.clone())
            .get(&self.name)
            .await
            .unwrap()
    }

    /// The UID of Node `node`.
    pub async fn node_uid(&self, node: &str) -> String {
        Api::<KubeNode>::all(self.admin.clone())
            .get(node)
            .await
            .unwrap()
            .uid()
            .unwrap()
    }

    /// The rollout slots of `shims` as node `node` takes them: its own identity, its Node's
    /// UID, the default timings.
    pub async fn gate_as<'s>(
        &self,
        node: &str,
        shims: &'s [Shim],
    ) -> shim_agent::cluster::agent::gate::SlotGate<'s> {
        let client = super::kube::client_for(&self.env.node_identity(node)).await;
        shim_agent::cluster::agent::gate::SlotGate::new(
            client,
            node,
            &self.node_uid(node).await,
            shims,
            Default::default(),
        )
    }

    /// The Node's `containerd.x-k8s.io/shim-state` annotation, as JSON text.
    pub async fn state_annotation(&self) -> Option<String> {
        self.node()
            .await
            .annotations()
            .get(shim_agent::cluster::STATE_ANNOTATION)
            .cloned()
    }

    /// Apply Shims `names` (version 1, for the nodes labelled `test=<test>`) in one apply,
    /// and wait until this node carries the label of each.
    pub async fn apply_and_await_labels(&self, names: &[&str], test: &str) {
        let docs: Vec<String> = names
            .iter()
            .map(|s| super::live::shim_yaml(&self.w, s, "1", ("test", test)))
            .collect();
        let (ok, out) = self.env.apply(&docs.join("---\n"));
        assert!(ok, "{out}");
        eventually(60, "every Shim of the apply labelled", || async {
            let mut all = true;
            for s in names {
                all &= self.label(s).await.as_deref() == Some("true");
            }
            all.then_some(())
        })
        .await;
    }

    pub async fn label(&self, shim: &str) -> Option<String> {
        self.node().await.labels().get(&node_label(shim)).cloned()
    }

    /// The Shim as the API server has it; a read that fails (a loaded API server's timeout) is
    /// asked again, a few times, before the test fails with it.
    pub async fn shim(&self, name: &str) -> Option<Shim> {
        let api = Api::<Shim>::all(self.admin.clone());
        let mut tries = 0;
        loop {
            match api.get_opt(name).await {
                Ok(s) => return s,
                Err(e) if tries < 5 => {
                    tries += 1;
                    eprintln!("reading Shim {name} failed ({e}); asking again");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
                Err(e) => panic!("reading Shim {name}: {e}"),
            }
        }
    }

    pub async fn condition(&self, shim: &str, type_: &str) -> Option<(String, String)> {
        let s = self.shim(shim).await?;
        let c = s
            .status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == type_)?;
        Some((c.status, c.reason.unwrap_or_default()))
    }

    /// The Events regarding `name` (any kind) last seen at `since` or later, as (reason,
    /// note): a test's own, not those of an earlier run on the same cluster.
    pub async fn events_since(
        &self,
        name: &str,
        since: k8s_openapi::jiff::Timestamp,
    ) -> Vec<(String, String)> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.admin.clone(), "default");
        let last_seen = |e: &k8s_openapi::api::events::v1::Event| {
            let series = e.series.as_ref().map(|s| s.last_observed_time.0);
            series.or(e.event_time.as_ref().map(|t| t.0))
        };
        events
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(|e| last_seen(e).is_some_and(|t| t >= since))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Remove a Shim whatever state it is in (test cleanup, and leftovers of an earlier run).
    pub async fn force_delete(&self, shim: &str) {
        let api = Api::<Shim>::all(self.admin.clone());
        let _ = api.delete(shim, &DeleteParams::default()).await;
        let patch = serde_json::json!({"metadata": {"finalizers": null}});
        let _ = api
            .patch(shim, &PatchParams::default(), &Patch::Merge(&patch))
            .await;
        let rcs = Api::<RuntimeClass>::all(self.admin.clone());
        let _ = rcs.delete(shim, &DeleteParams::default()).await;
        eventually(30, "the old Shim and RuntimeClass gone", || async {
            // a read that fails (a loaded API server's timeout) is asked again
            let class_gone = rcs.get_opt(shim).await.ok()?.is_none();
            (self.shim(shim).await.is_none() && class_gone).then_some(())
        })
        .await;
    }

    /// [`Rig::force_delete`], and the Shim's slot Leases of an earlier run gone too: a run
    /// that starts before the garbage collector took them finds the slot names taken by the
    /// old Shim's Leases, which the coordinator leaves alone, and its node waited 30 s and
    /// more for a slot (a CI run's second kube pass, on the first pass's leftovers).
    pub async fn fresh(&self, shim: &str) {
        self.force_delete(shim).await;
        let slots = Api::<shim_agent::api::lease::ShimLease>::namespaced(
            self.admin.clone(),
            shim_agent::cluster::NAMESPACE,
        );
        let of = kube::api::ListParams::default().labels(&format!(
            "{}={shim}",
            shim_agent::cluster::slots::SLOT_SHIM_LABEL
        ));
        let _ = slots.delete_collection(&DeleteParams::default(), &of).await;
        eventually(30, "the old Shim's slots gone", || async {
            slots.list(&of).await.ok()?.items.is_empty().then_some(())
        })
        .await;
    }
}

pub fn cluster_node<'a>(
    w: &'a World,
    f: &'a FakeContainerd,
) -> shim_agent::txn::Node<'a, &'a FakeContainerd, &'a FakeContainerd> {
    let mut n = node(w, f);
    n.origin = Origin::Cluster;
    n
}

/// The node agent of `n` on `client`, until `stop` turns true.
pub async fn run_agent<'a>(
    n: &shim_agent::txn::Node<'a, &'a FakeContainerd, &'a FakeContainerd>,
    client: Client,
    name: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    run_agent_tuned(n, client, name, stop, |_| {}).await
}

/// The agent of one node as a test drives it: its scripted containerd, on its own client.
pub type TestAgent<'n, 'a> =
    shim_agent::cluster::agent::Agent<'n, 'a, &'a FakeContainerd, &'a FakeContainerd>;

/// [`run_agent`] with the agent's settings changed by `tune` first.
pub async fn run_agent_tuned<'a>(
    n: &shim_agent::txn::Node<'a, &'a FakeContainerd, &'a FakeContainerd>,
    client: Client,
    name: &str,
    stop: tokio::sync::watch::Receiver<bool>,
    tune: impl FnOnce(&mut TestAgent<'_, 'a>),
) {
    let mut agent = shim_agent::cluster::agent::Agent::new(n, client, name.to_string());
    tune(&mut agent);
    let (store, mut state) = agent.node.open().await.unwrap();
    let (_files_tx, mut files) = tokio::sync::mpsc::channel(1);
    let exit = agent
        .run(&store, &mut state, stop, &mut files, || false)
        .await
        .unwrap();
    assert_eq!(exit, shim_agent::cluster::agent::Exit::Shutdown);
}

/// A coordinator (its own identity, [`fast`] timings) and the agent of `rig`'s node, on
/// `client` with the scripted containerd `f` and its settings changed by `tune`, beside
/// `body`; both stop when `body` ends.
pub async fn with_coordinator_and_agent<'a, Fut: std::future::Future<Output = ()>>(
    rig: &'a Rig,
    f: &'a FakeContainerd,
    client: Client,
    tune: impl FnOnce(&mut TestAgent<'_, 'a>),
    body: impl FnOnce() -> Fut,
) {
    let n = cluster_node(&rig.w, f);
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let coordinator = rig.spawn_coordinator(stop.clone()).await;
    let agent = run_agent_tuned(&n, client, &rig.name, stop, tune);
    let body = async {
        body().await;
        let _ = stop_tx.send(true);
    };
    tokio::join!(agent, body);
    let _ = coordinator.await;
}

/// Run the agent beside `body`; stop it when `body` ends.
pub async fn with_agent<Fut: std::future::Future<Output = ()>>(
    rig: &Rig,
    f: &FakeContainerd,
    body: impl FnOnce() -> Fut,
) {
    with_agent_config(rig, f, rig.config(), body).await
}

/// [`with_agent`] with a session config of the test's own.
pub async fn with_agent_config<Fut: std::future::Future<Output = ()>>(
    rig: &Rig,
    f: &FakeContainerd,
    config: SessionConfig,
    body: impl FnOnce() -> Fut,
) {
    let n = cluster_node(&rig.w, f);
    let (tx, rx) = tokio::sync::watch::channel(false);
    // an agent that ends before the body says so at once, in the test's output (a body that
    // then times out waiting for it would otherwise hide why)
    let agent = async {
        let result = session::run(&n, config, rx).await;
        if !*tx.borrow() {
            eprintln!("the agent session ended before the test body: {result:?}");
        }
        result
    };
    let body = async {
        body().await;
        let _ = tx.send(true);
    };
    let (result, ()) = tokio::join!(agent, body);
    result.expect("agent session");
}

/// The node holding the coordinator Lease, if any.
pub async fn coordinator_holder(client: &kube::Client) -> Option<String> {
    kube::Api::<shim_agent::api::lease::ShimLease>::namespaced(
        client.clone(),
        shim_agent::cluster::NAMESPACE,
    )
    .get_opt(shim_agent::cluster::COORDINATOR_LEASE)
    .await
    .ok()
    .flatten()
    .and_then(|l| l.spec.holder_identity)
    .filter(|h| !h.is_empty())
}
