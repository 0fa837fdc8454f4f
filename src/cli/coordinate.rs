//! `shim-agent coordinate`: the coordinator alone, anywhere a coordinator identity is at
//! hand (a Deployment with the `shim-agent-coordinator` ServiceAccount, an operator's
//! machine): the election, then the cluster-wide work of docs/design.md §6, until SIGTERM.
//! Node agents need no coordinator credentials of their own then.

use std::path::PathBuf;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

use crate::cluster::connect::{self, Source};
use crate::cluster::coordinator::election::Timings;
use crate::cluster::coordinator::{self, CoordinatorConfig};
use crate::endpoints;
use crate::settings::{MetricsSettings, Settings};

/// Run the coordinator with `kubeconfig` (else in-cluster) as `identity` (else the host
/// name) until SIGTERM or SIGINT, serving metrics and probes on `listen` (else the config
/// file's `metrics.address`). It never takes the agent's metrics socket: an agent on the
/// same host keeps it.
pub async fn run(
    settings: &Settings,
    kubeconfig: Option<PathBuf>,
    identity: Option<String>,
    listen: Option<String>,
) -> anyhow::Result<()> {
    let listen_on = MetricsSettings {
        socket: String::new(),
        address: listen.unwrap_or_else(|| settings.metrics.address.clone()),
    };
    let server = endpoints::serve(&listen_on).await;
    let source = match kubeconfig {
        Some(p) => Source::Kubeconfig(p),
        None => Source::InCluster,
    };
    let client = connect::client(&source).await?;
    let identity = match identity {
        Some(i) => i,
        None => connect::node_name(settings)?,
    };
    let k = &settings.kubernetes;
    let secs = Duration::from_secs;
    let config = CoordinatorConfig {
        timings: Timings {
            lease_duration: secs(k.lease_duration_secs),
            renew_deadline: secs(k.renew_deadline_secs),
            retry_period: secs(k.retry_period_secs),
        },
        status_interval: secs(k.status_interval_secs),
    };
    let (stop_tx, stop) = watch::channel(false);
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = stop_tx.send(true);
    });
    tracing::info!(%source, %identity, "shim-agent coordinating (standing for the election)");
    // standing for the election: a stand-by replica is as ready as the leader
    crate::telemetry::ready();
    coordinator::run(client, identity, config, stop).await;
    server.stop().await;
    Ok(())
}
