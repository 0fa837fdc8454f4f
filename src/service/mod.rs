//! `shim-agent run` as a systemd service: the shell around the daemon
//! ([`crate::cluster::session`] with a kubeconfig, [`crate::daemon`] without).
//!
//! - [`notify`]: READY, STATUS, WATCHDOG, RELOADING, STOPPING;
//! - [`logging`]: journald with structured fields, or plain text;
//!
//! # Signals
//! - SIGTERM (or SIGINT) stops the agent. A transaction under way is finished, or rolled
//!   back, before the process exits: the round that runs it is never cancelled, only the
//!   waits between rounds (and a wait for a rollout slot, which ends before the host
//!   changes). A second signal is never needed and changes nothing.
//! - SIGHUP (`systemctl reload`) re-reads the configuration. A config that does not load is
//!   reported and the running one kept. A changed one ends the current session like a stop
//!   (the transaction under way finishes), then the agent starts again in the same process
//!   with the new settings: a new log level, kubeconfig, containerd or fetch settings all
//!   take effect. An unchanged one changes nothing.

pub mod logging;
pub mod notify;

use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use crate::cluster;
use crate::hostroot::HostRoot;
use crate::settings::{self, Settings};
use crate::state::Origin;
use crate::telemetry;
use crate::txn::real::live_node;

/// Where the settings come from, to read them again on SIGHUP.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    /// `--config` was given (then the file must exist).
    pub explicit: bool,
    /// `--log-level`, which overrides the file's.
    pub log_level: Option<String>,
}

impl ConfigSource {
    fn load(&self) -> anyhow::Result<Settings> {
        Ok(settings::load(&self.path, self.explicit)?)
    }

    fn level<'a>(&'a self, s: &'a Settings) -> &'a str {
        self.log_level.as_deref().unwrap_or(&s.log.level)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    Stop,
    Reload,
}

/// Forward SIGTERM, SIGINT and SIGHUP as [`Signal`]s. Once installed, the signals never
/// kill the process by default again.
fn signals() -> anyhow::Result<mpsc::Receiver<Signal>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let s = tokio::select! {
                _ = term.recv() => Signal::Stop,
                _ = int.recv() => Signal::Stop,
                _ = hup.recv() => Signal::Reload,
            };
            if tx.send(s).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Run the agent until SIGTERM; see the module's doc for signals.
pub fn run(
    root: HostRoot,
    source: ConfigSource,
    first: Settings,
    log: logging::LogHandle,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let mut signals = signals()?;
        let _status = AbortOnDrop(notify::follow_activity());
        let _watchdog = notify::watchdog().map(AbortOnDrop);
        let mut settings = first;
        let mut metrics = crate::endpoints::serve(&settings.metrics).await;
        loop {
            match session_until_signal(&root, &source, &settings, &mut signals).await {
                Ended::Reloaded(next) => {
                    log.set_level(source.level(&next));
                    if next.metrics != settings.metrics {
                        metrics.stop().await;
                        metrics = crate::endpoints::serve(&next.metrics).await;
                    }
                    settings = *next;
                    tracing::info!("configuration reloaded");
                }
                Ended::Done(result) => {
                    tracing::info!("stopped");
                    return result;
                }
            }
        }
    })
}

enum Ended {
    /// The session ended on its own (an error), or on SIGTERM.
    Done(anyhow::Result<()>),
    /// SIGHUP with a changed config: run again with it.
    Reloaded(Box<Settings>),
}

/// Run one session with `settings` until it ends, or a signal ends it.
async fn session_until_signal(
    root: &HostRoot,
    source: &ConfigSource,
    settings: &Settings,
    signals: &mut mpsc::Receiver<Signal>,
) -> Ended {
    let (stop_tx, stop_rx) = watch::channel(false);
    let session = run_session(root, settings, stop_rx);
    let mut session = std::pin::pin!(session);
    let (why, next) = loop {
        tokio::select! {
            result = &mut session => return Ended::Done(result),
            Some(sig) = signals.recv() => match sig {
                Signal::Stop => break (Signal::Stop, None),
                Signal::Reload => match source.load() {
                    Ok(s) if s == *settings => {
                        notify::reloading();
                        tracing::info!("configuration reloaded: unchanged");
                        notify::ready();
                    }
                    Ok(s) => break (Signal::Reload, Some(s)),
                    Err(e) => {
                        notify::reloading();
                        tracing::error!("configuration reload failed; keeping the running configuration: {e:#}");
                        notify::ready();
                    }
                },
            },
        }
    };
    let finishing = telemetry::activity().borrow().doing.clone();
    if why == Signal::Stop {
        let line = match &finishing {
            Some(d) => format!("stopping: finishing what is under way ({d})"),
            None => "stopping".to_string(),
        };
        tracing::info!("{line}");
        notify::stopping(&line);
    } else {
        notify::reloading();
        tracing::info!("configuration changed; restarting the agent in-process");
    }
    let _ = stop_tx.send(true);
    let result = session.await;
    match (result, next) {
        (Ok(()), Some(s)) => Ended::Reloaded(Box::new(s)),
        (result, _) => Ended::Done(result),
    }
}

/// One run of the agent with `settings`, until `stop` turns true. Without usable cluster
/// credentials it runs the static Shims and looks for them every
/// [`KUBECONFIG_POLL_SECS`](cluster::connect::KUBECONFIG_POLL_SECS): on first boot the
/// kubelet's kubeconfig (and its client certificate) arrive after the agent started, and the
/// agent then goes on as a cluster agent, in the same process.
async fn run_session(
    root: &HostRoot,
    settings: &Settings,
    mut stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    use cluster::connect::Found;
    loop {
        let why = match cluster::connect::find(settings) {
            Found::Ready(source) => {
                let node = live_node(root, settings, Origin::Cluster).await?;
                let config = cluster::session::SessionConfig::from_settings(source, settings)?;
                tracing::info!(unit = %node.profile.unit, config = %node.profile.config, "shim-agent running (cluster and static Shims) as node {}", config.node_name);
                return cluster::session::run(&node, config, stop).await;
            }
            Found::Waiting(why) => why,
            Found::Nothing => "no kubeconfig found".to_string(),
        };
        let node = live_node(root, settings, Origin::Static).await?;
        tracing::info!(unit = %node.profile.unit, config = %node.profile.config, "shim-agent running (static Shims only: {why}); looking for the cluster's credentials every {} s", cluster::connect::KUBECONFIG_POLL_SECS);
        let (static_stop, static_rx) = watch::channel(false);
        let daemon = crate::daemon::run(&node, static_rx);
        let mut daemon = std::pin::pin!(daemon);
        let joined = tokio::select! {
            result = &mut daemon => return result,
            _ = stop.changed() => false,
            () = credentials_ready(settings) => true,
        };
        // the static round under way finishes first
        let _ = static_stop.send(true);
        daemon.await?;
        if !joined {
            return Ok(());
        }
        tracing::info!("cluster credentials found: the node joined; going on as a cluster agent");
    }
}

/// Resolves once [`cluster::connect::find`] finds usable credentials.
async fn credentials_ready(settings: &Settings) {
    let every = std::time::Duration::from_secs(cluster::connect::KUBECONFIG_POLL_SECS);
    let mut last = String::new();
    loop {
        tokio::time::sleep(every).await;
        match cluster::connect::find(settings) {
            cluster::connect::Found::Ready(_) => return,
            cluster::connect::Found::Waiting(why) if why != last => {
                tracing::info!("waiting for the cluster's credentials: {why}");
                last = why;
            }
            _ => {}
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
