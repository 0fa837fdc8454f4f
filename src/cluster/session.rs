//! `shim-agent run` with a cluster: recover the journal, then run the agent and take part in
//! the coordinator election, reconnecting whenever the credentials on disk rotate.

use std::time::Duration;

use tokio::sync::{mpsc, watch as tokio_watch};

use super::agent::{Agent, Exit};
use super::connect::{self, CredentialWatch, Source};
use super::coordinator::{self, CoordinatorConfig};
use super::gate::GateTimings;
use crate::txn::{HealthCheck, Node, Restarter};

/// Settings of a cluster session.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub source: Source,
    pub node_name: String,
    pub coordinator: CoordinatorConfig,
    /// How long to wait for this node's Node object at start.
    pub node_wait: Duration,
    /// How often rotated credentials are looked for.
    pub credential_check: Duration,
    /// How this node waits for rollout slots.
    pub gate: GateTimings,
}

impl SessionConfig {
    /// The session `settings` ask for, with the cluster reached through `source`.
    pub fn from_settings(
        source: Source,
        settings: &crate::settings::Settings,
    ) -> anyhow::Result<Self> {
        let k = &settings.kubernetes;
        let secs = Duration::from_secs;
        Ok(SessionConfig {
            source,
            node_name: connect::node_name(settings)?,
            coordinator: CoordinatorConfig {
                timings: super::election::Timings {
                    lease_duration: secs(k.lease_duration_secs),
                    renew_deadline: secs(k.renew_deadline_secs),
                    retry_period: secs(k.retry_period_secs),
                },
                status_interval: secs(k.status_interval_secs),
            },
            node_wait: secs(k.node_wait_secs),
            credential_check: secs(connect::CREDENTIAL_CHECK_SECS),
            gate: GateTimings::default(),
        })
    }
}

/// Run until `shutdown` turns true.
pub async fn run<R: Restarter, H: HealthCheck>(
    node: &Node<'_, R, H>,
    config: SessionConfig,
    shutdown: tokio_watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let (store, mut state) = node.open().await?;
    let (files_tx, mut files) = mpsc::channel::<()>(16);
    let _watcher = crate::daemon::watch(&crate::daemon::watched_paths(node), files_tx)?;
    let mut credentials = CredentialWatch::new(config.source.clone());
    loop {
        let client = connect::client(&config.source).await?;
        tracing::info!(source = %config.source, node = %config.node_name, "connecting to the cluster");
        // aborted when this session is dropped (a crash of the agent ends its coordinator)
        let mut coordinator = AbortOnDrop(tokio::spawn(coordinator::run(
            client.clone(),
            config.node_name.clone(),
            config.coordinator,
            shutdown.clone(),
        )));
        let mut agent = Agent::new(node, client, config.node_name.clone());
        agent.node_wait = config.node_wait;
        agent.credential_check = config.credential_check;
        agent.gate_timings = config.gate;
        let exit = agent
            .run(&store, &mut state, shutdown.clone(), &mut files, || {
                credentials.changed()
            })
            .await;
        match exit {
            Ok(Exit::Reconnect) => drop(coordinator),
            Ok(Exit::Shutdown) => {
                // the coordinator releases its lease on the same signal
                let _ = tokio::time::timeout(Duration::from_secs(5), &mut coordinator.0).await;
                return Ok(());
            }
            Err(e) => return Err(e),
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
