//! `shim-agent run` with a cluster: recover the journal, then run the agent and take part in
//! the coordinator election, reconnecting whenever the credentials on disk rotate.

use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch as tokio_watch};

use super::agent::gate::GateTimings;
use super::agent::{Agent, Exit};
use super::connect::{self, CredentialWatch, Source};
use super::coordinator::{self, CoordinatorConfig};
use super::readiness::StartupTaint;
use crate::txn::{HealthCheck, Node, Restarter};

/// Settings of a cluster session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub source: Source,
    pub node_name: String,
    /// The coordinator identity's credentials: with them this agent stands for the
    /// coordinator election; without, it is a node agent only.
    pub coordinator_source: Option<Source>,
    pub coordinator: CoordinatorConfig,
    /// How long to wait for this node's Node object at start.
    pub node_wait: Duration,
    /// How often rotated credentials are looked for.
    pub credential_check: Duration,
    /// How this node waits for rollout slots.
    pub gate: GateTimings,
    /// The startup taint this node names for removal once its Shims are ready.
    pub startup_taint: Option<StartupTaint>,
}

impl SessionConfig {
    /// The session `settings` ask for, with the cluster reached through `source`.
    pub fn from_settings(
        source: Source,
        settings: &crate::settings::Settings,
    ) -> anyhow::Result<Self> {
        let k = &settings.kubernetes;
        let secs = Duration::from_secs;
        let coordinator = k.coordinator_kubeconfig.trim();
        let taint = k.startup_taint.trim();
        let startup_taint = if taint.is_empty() {
            None
        } else {
            Some(
                StartupTaint::parse(taint)
                    .map_err(|e| anyhow::anyhow!("kubernetes.startup-taint = {e}"))?,
            )
        };
        Ok(SessionConfig {
            source,
            node_name: connect::node_name(settings)?,
            coordinator_source: (!coordinator.is_empty())
                .then(|| Source::Kubeconfig(coordinator.into())),
            coordinator: CoordinatorConfig {
                timings: super::coordinator::election::Timings {
                    lease_duration: secs(k.lease_duration_secs),
                    renew_deadline: secs(k.renew_deadline_secs),
                    retry_period: secs(k.retry_period_secs),
                },
                status_interval: secs(k.status_interval_secs),
            },
            node_wait: secs(k.node_wait_secs),
            credential_check: secs(connect::CREDENTIAL_CHECK_SECS),
            gate: GateTimings {
                max_deferral: secs(k.max_deferral_secs),
                ..GateTimings::default()
            },
            startup_taint,
        })
    }
}

/// Run until `shutdown` turns true.
pub async fn run<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    config: SessionConfig,
    shutdown: tokio_watch::Receiver<bool>,
) -> anyhow::Result<()> {
    // The journal is recovered once the client exists: a restart then needs its rollout slot.
    let (store, mut state) = node.open_unrecovered()?;
    let (files_tx, mut files) = mpsc::channel::<()>(16);
    let _watcher = crate::statics::watch(&crate::statics::watched_paths(node), files_tx)?;
    let mut credentials = CredentialWatch::new(config.source.clone());
    let mut coordinator_credentials = config.coordinator_source.clone().map(CredentialWatch::new);
    loop {
        let client = connect::client(&config.source).await?;
        tracing::info!(source = %config.source, node = %config.node_name, "connecting to the cluster");
        if state.journal.is_some() {
            let recovered = recover(node, &client, &config, &store, &mut state, &shutdown).await;
            crate::txn::recovery::going_on_after(recovered, &state)?;
        }
        if let Err(e) = node.collect_retained(&store, &mut state) {
            tracing::warn!("cannot collect replaced shim versions yet: {e:#}");
        }
        // aborted when this session is dropped (a crash of the agent ends its coordinator)
        let mut coordinator = match &config.coordinator_source {
            Some(source) => {
                let c = connect::client(source)
                    .await
                    .context("the coordinator's credentials (kubernetes.coordinator-kubeconfig)")?;
                tracing::info!(%source, "standing for the coordinator election");
                Some(AbortOnDrop(tokio::spawn(coordinator::run(
                    c,
                    config.node_name.clone(),
                    config.coordinator,
                    shutdown.clone(),
                ))))
            }
            None => None,
        };
        let mut agent = Agent::new(node, client, config.node_name.clone());
        agent.node_wait = config.node_wait;
        agent.credential_check = config.credential_check;
        agent.gate_timings = config.gate;
        agent.startup_taint = config.startup_taint.clone();
        let exit = agent
            .run(&store, &mut state, shutdown.clone(), &mut files, || {
                // both checked every time (each remembers what it saw)
                let node = credentials.changed();
                let coordinator = coordinator_credentials
                    .as_mut()
                    .is_some_and(|w| w.changed());
                node || coordinator
            })
            .await;
        match exit {
            Ok(Exit::Reconnect) => drop(coordinator),
            Ok(Exit::Shutdown) => {
                // the coordinator releases its lease on the same signal
                if let Some(c) = coordinator.as_mut() {
                    let _ = tokio::time::timeout(Duration::from_secs(5), &mut c.0).await;
                }
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

/// Recover the open journal with the rollout slots of its Shims (see
/// [`Node::recover_gated`]): the Shims as the API server has them now, the node's static
/// ones never gated.
async fn recover<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    client: &kube::Client,
    config: &SessionConfig,
    store: &crate::state::StateStore,
    state: &mut crate::state::NodeState,
    shutdown: &tokio_watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let shims = kube::Api::<crate::api::Shim>::all(client.clone())
        .list(&Default::default())
        .await
        .context("recovering the journal: cannot list the Shims to find their rollout slots")?
        .items;
    let uid = kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .get_opt(&config.node_name)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.uid)
        .unwrap_or_default();
    let statics = match node.root.resolve(&node.settings.paths.static_shims_dir) {
        Ok(dir) => crate::statics::read_static_shims(&dir).0,
        Err(_) => Vec::new(),
    };
    let gate = super::agent::gate::SlotGate::new(
        client.clone(),
        &config.node_name,
        &uid,
        &shims,
        config.gate,
    )
    .until(shutdown.clone())
    .except(statics.iter().map(|s| s.name().to_string()));
    Ok(node.recover_gated(store, state, &gate).await?)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
