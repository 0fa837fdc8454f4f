//! [`SystemdDbus`]: the [`ServiceManager`] port on `org.freedesktop.systemd1` over the system
//! bus (zbus; the bus address honours `DBUS_SYSTEM_BUS_ADDRESS`).
//!
//! # Guarantees
//! - The `JobRemoved` match is registered (and `Subscribe` called) **before** `RestartUnit`,
//!   so a job that finishes before the method reply arrives is still seen.
//! - A job is matched by its object path, never by unit name: other jobs of the same unit
//!   (an `auto-restart` of `Restart=always`) are ignored.
//! - A start refused by the start limit (`Result=start-limit-hit`) is retried exactly once,
//!   after `ResetFailedUnit`.
//!
//! # Caveats
//! - On [`NodeError::RestartTimeout`] the job is left queued: systemd finishes or cancels it.
//! - Unit state is read right after `JobRemoved`; with `Restart=always` a failed unit may
//!   already have moved on to `activating/auto-restart`, which is what the caller sees.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::time::Instant;
use zbus::message::Type as MessageType;
use zbus::{Connection, MatchRule, MessageStream, OwnedObjectPath, OwnedVariant};

use super::error::NodeError;
use super::ports::ServiceManager;
use super::unit::{RestartOutcome, UnitState};

const SYSTEMD_DEST: &str = "org.freedesktop.systemd1";
const MANAGER_PATH: &str = "/org/freedesktop/systemd1";
const MANAGER_IFACE: &str = "org.freedesktop.systemd1.Manager";
const UNIT_IFACE: &str = "org.freedesktop.systemd1.Unit";
const SERVICE_IFACE: &str = "org.freedesktop.systemd1.Service";
const PROPERTIES_IFACE: &str = "org.freedesktop.DBus.Properties";
/// D-Bus error systemd returns for a second `Subscribe` from the same client.
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";
/// Signals queued for one restart before the oldest are dropped.
const JOB_SIGNAL_QUEUE: usize = 256;

/// systemd's manager over D-Bus.
#[derive(Debug, Clone)]
pub struct SystemdDbus {
    conn: Connection,
}

fn dbus_err(call: impl Into<String>) -> impl FnOnce(zbus::Error) -> NodeError {
    let call = call.into();
    move |source| NodeError::Dbus { call, source }
}

impl SystemdDbus {
    /// Connect to the system bus (`DBUS_SYSTEM_BUS_ADDRESS`, else the standard socket).
    pub async fn connect_system() -> Result<SystemdDbus, NodeError> {
        let conn = Connection::system()
            .await
            .map_err(dbus_err("connect to the system bus"))?;
        Ok(SystemdDbus { conn })
    }

    /// Connect to the bus at a D-Bus address (`unix:path=/run/dbus/system_bus_socket`).
    pub async fn connect_address(address: &str) -> Result<SystemdDbus, NodeError> {
        let conn = zbus::connection::Builder::address(address)
            .build()
            .await
            .map_err(dbus_err(format!("connect to {address}")))?;
        Ok(SystemdDbus { conn })
    }

    /// `Manager.Reload` (`systemctl daemon-reload`): re-read unit files and drop-ins. The
    /// reply comes when the reload is done.
    pub async fn reload(&self) -> Result<(), NodeError> {
        self.manager_call("Reload", &()).await.map(|_| ())
    }

    async fn manager_call<B>(&self, method: &str, body: &B) -> Result<zbus::Message, NodeError>
    where
        B: serde::Serialize + zbus::DynamicType + Sync,
    {
        self.conn
            .call_method(
                Some(SYSTEMD_DEST),
                MANAGER_PATH,
                Some(MANAGER_IFACE),
                method,
                body,
            )
            .await
            .map_err(dbus_err(format!("Manager.{method}")))
    }

    /// `Subscribe`, so that systemd emits job signals to this client; a repeat is fine.
    async fn subscribe(&self) -> Result<(), NodeError> {
        match self.manager_call("Subscribe", &()).await {
            Err(NodeError::Dbus {
                source: zbus::Error::MethodError(name, _, _),
                ..
            }) if name.as_str() == ALREADY_SUBSCRIBED => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// One `RestartUnit` and its `JobRemoved`: (job result, elapsed).
    async fn restart_once(
        &self,
        unit: &str,
        timeout: Duration,
    ) -> Result<(String, Duration), NodeError> {
        self.subscribe().await?;
        // No sender in the rule: signals carry systemd's unique name, not the well-known one.
        let rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .path(MANAGER_PATH)
            .interface(MANAGER_IFACE)
            .member("JobRemoved")
            .build()
            .map_err(dbus_err("build the JobRemoved match rule"))?;
        let mut stream = MessageStream::for_match_rule(
            rule,
            &self.conn,
            std::num::NonZeroUsize::new(JOB_SIGNAL_QUEUE),
        )
        .await
        .map_err(dbus_err("AddMatch JobRemoved"))?;
        let started = Instant::now();
        let deadline = started + timeout;
        let timed_out = |job: String| NodeError::RestartTimeout {
            unit: unit.to_string(),
            job,
            timeout,
        };
        let reply = tokio::time::timeout_at(
            deadline,
            self.manager_call("RestartUnit", &(unit, "replace")),
        )
        .await
        .map_err(|_| timed_out("none: RestartUnit was not answered".to_string()))?
        .map_err(|e| with_call(e, format!("Manager.RestartUnit({unit})")))?;
        let job: OwnedObjectPath = reply
            .body()
            .deserialize()
            .map_err(dbus_err(format!("RestartUnit({unit}) reply")))?;
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next()).await;
            let msg = match next {
                Err(_) | Ok(None) => return Err(timed_out(job.to_string())),
                Ok(Some(msg)) => msg.map_err(dbus_err("receive JobRemoved"))?,
            };
            let Ok((_id, path, _unit, result)) = msg
                .body()
                .deserialize::<(u32, OwnedObjectPath, String, String)>()
            else {
                continue;
            };
            if path == job {
                return Ok((result, started.elapsed()));
            }
        }
    }

    /// The unit's object path (`LoadUnit` also works for units not loaded yet).
    async fn unit_path(&self, unit: &str) -> Result<OwnedObjectPath, NodeError> {
        self.manager_call("LoadUnit", &(unit,))
            .await
            .map_err(|e| with_call(e, format!("Manager.LoadUnit({unit})")))?
            .body()
            .deserialize()
            .map_err(dbus_err(format!("LoadUnit({unit}) reply")))
    }

    async fn property(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<OwnedVariant, NodeError> {
        let call = format!("Properties.Get({iface}.{name})");
        self.conn
            .call_method(
                Some(SYSTEMD_DEST),
                path,
                Some(PROPERTIES_IFACE),
                "Get",
                &(iface, name),
            )
            .await
            .map_err(dbus_err(call.clone()))?
            .body()
            .deserialize::<OwnedVariant>()
            .map_err(dbus_err(call))
    }

    async fn string_property(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<String, NodeError> {
        let v = self.property(path, iface, name).await?;
        String::try_from(v).map_err(dbus_err(format!("{iface}.{name} as string")))
    }

    /// `LoadState`, `ActiveState` and `SubState` of a unit, for `doctor` (a unit that does
    /// not exist is `not-found`, not an error).
    pub async fn unit_load_state(&self, unit: &str) -> Result<[String; 3], NodeError> {
        let path = self.unit_path(unit).await?;
        Ok([
            self.string_property(&path, UNIT_IFACE, "LoadState").await?,
            self.string_property(&path, UNIT_IFACE, "ActiveState")
                .await?,
            self.string_property(&path, UNIT_IFACE, "SubState").await?,
        ])
    }

    /// A service's `Environment=` entries (`NAME=value`) and its `EnvironmentFile=` paths,
    /// for `doctor`.
    pub async fn unit_environment(
        &self,
        unit: &str,
    ) -> Result<(Vec<String>, Vec<String>), NodeError> {
        let path = self.unit_path(unit).await?;
        let env = self.property(&path, SERVICE_IFACE, "Environment").await?;
        let env = Vec::<String>::try_from(env)
            .map_err(dbus_err(format!("{SERVICE_IFACE}.Environment as strings")))?;
        let files = self
            .property(&path, SERVICE_IFACE, "EnvironmentFiles")
            .await?;
        let files = Vec::<(String, bool)>::try_from(files)
            .map_err(dbus_err(format!("{SERVICE_IFACE}.EnvironmentFiles")))?;
        Ok((env, files.into_iter().map(|(f, _)| f).collect()))
    }

    async fn u32_property(
        &self,
        path: &OwnedObjectPath,
        iface: &str,
        name: &str,
    ) -> Result<u32, NodeError> {
        let v = self.property(path, iface, name).await?;
        u32::try_from(v).map_err(dbus_err(format!("{iface}.{name} as u32")))
    }
}

/// Re-label a D-Bus error with the call that failed (the unit name included).
fn with_call(e: NodeError, call: String) -> NodeError {
    match e {
        NodeError::Dbus { source, .. } => NodeError::Dbus { call, source },
        other => other,
    }
}

impl ServiceManager for SystemdDbus {
    async fn restart_unit(
        &self,
        unit: &str,
        timeout: Duration,
    ) -> Result<RestartOutcome, NodeError> {
        let t0 = Instant::now();
        let (mut job_result, mut elapsed) = self.restart_once(unit, timeout).await?;
        let mut state = self.unit_state(unit).await?;
        let mut retried = false;
        if job_result != "done" && state.result == "start-limit-hit" {
            tracing::warn!(
                unit,
                "restart hit the start limit; resetting the unit and retrying once"
            );
            self.reset_failed(unit).await?;
            let left = timeout.saturating_sub(t0.elapsed());
            (job_result, elapsed) = self.restart_once(unit, left).await?;
            state = self.unit_state(unit).await?;
            retried = true;
            if job_result != "done" && state.result == "start-limit-hit" {
                return Err(NodeError::StartLimitHit {
                    unit: unit.to_string(),
                    job_result,
                    state: Box::new(state),
                });
            }
        }
        if job_result != "done" {
            return Err(NodeError::RestartFailed {
                unit: unit.to_string(),
                job_result,
                state: Box::new(state),
            });
        }
        Ok(RestartOutcome {
            job_result,
            elapsed,
            state,
            retried_after_start_limit: retried,
        })
    }

    async fn unit_state(&self, unit: &str) -> Result<UnitState, NodeError> {
        let path = self.unit_path(unit).await?;
        let invocation = self.property(&path, UNIT_IFACE, "InvocationID").await?;
        let invocation: Vec<u8> = Vec::try_from(invocation)
            .map_err(dbus_err(format!("{UNIT_IFACE}.InvocationID as bytes")))?;
        let mut state = UnitState {
            active_state: self
                .string_property(&path, UNIT_IFACE, "ActiveState")
                .await?,
            sub_state: self.string_property(&path, UNIT_IFACE, "SubState").await?,
            invocation_id: hex::encode(invocation),
            ..UnitState::default()
        };
        // Result, MainPID and NRestarts exist only on service units.
        if unit.ends_with(".service") {
            state.result = self.string_property(&path, SERVICE_IFACE, "Result").await?;
            state.main_pid = self.u32_property(&path, SERVICE_IFACE, "MainPID").await?;
            state.n_restarts = self.u32_property(&path, SERVICE_IFACE, "NRestarts").await?;
        }
        Ok(state)
    }

    async fn reset_failed(&self, unit: &str) -> Result<(), NodeError> {
        self.manager_call("ResetFailedUnit", &(unit,))
            .await
            .map(|_| ())
            .map_err(|e| with_call(e, format!("Manager.ResetFailedUnit({unit})")))
    }
}
