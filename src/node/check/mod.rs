//! The functional check of a runtime handler (docs/design.md §3): after containerd lists a new
//! handler, a pod sandbox is started through it over CRI as the kubelet starts one
//! (`RunPodSandbox` with `runtime_handler`), must be ready, and is stopped and removed; where
//! the Shim names a check container, it runs in that sandbox and must exit as asked.
//!
//! # Guarantees
//! - Nothing the check creates outlives it: the sandbox (and with it its container) is stopped
//!   and removed whatever the outcome; a call that timed out is followed by a sweep of that
//!   check's sandboxes; [`sweep`] removes every check sandbox a crash left, and
//!   [`remove_log_dirs`] every log directory, both at start.
//! - Every sandbox it makes carries [`CHECK_LABEL`] and its own [`CHECK_ID_LABEL`], is named
//!   `shim-agent-check-<handler>` in the CRI namespace [`CHECK_NAMESPACE`], uses the node's
//!   network (no CNI needed, no pod IP taken) and the `system.slice` cgroup parent (outside
//!   the kubelet's `kubepods`, valid for the cgroupfs and the systemd drivers alike).
//! - A node without its sandbox image is [`NodeError::NoSandboxImage`], never blamed on the
//!   runtime; the runtime's own refusal is [`NodeError::SandboxCheckFailed`] with its words.
//!
//! # Caveats
//! - The kubelet lists every sandbox of containerd's CRI and may stop one it does not know
//!   (an orphan) at its next housekeeping; the check lives well under a second with runc and
//!   stops its sandbox itself.

mod output;
mod sandbox;
mod spec;

use std::collections::HashMap;
use std::time::{Duration, Instant};

pub use output::{Ended, judge, read_cri_log};
pub use sandbox::{CHECK_CGROUP_PARENT, check_sandbox_config, container_config, sandbox_id_for};
pub use spec::{
    CHECK_HANDLER_LABEL, CHECK_ID_LABEL, CHECK_LABEL, CHECK_NAMESPACE, CheckPlace, CheckReport,
    ContainerCheck, DETAIL_MAX_BYTES, HandlerCheck,
};

use super::NodeError;
use super::cri::{CallError, CriClient};
use crate::text::clip;

/// How often a running check container's status is asked.
const POLL: Duration = Duration::from_millis(50);
/// How long the cleanup calls may take each.
const CLEANUP_CALL: Duration = Duration::from_secs(30);

/// Run the check of `check.handler`; whatever the outcome, its sandbox is gone after.
pub async fn check_handler(
    cri: &CriClient,
    check: &HandlerCheck,
    place: &CheckPlace,
) -> Result<CheckReport, NodeError> {
    let t0 = Instant::now();
    ensure_sandbox_image(cri, place.sandbox_timeout).await?;
    let id = sandbox_id_for(&check.handler);
    let logs_local = place.logs_local.join(&id);
    let logs_node = format!("{}/{id}", place.logs_node.trim_end_matches('/'));
    if let Err(e) = std::fs::create_dir_all(&logs_local) {
        tracing::warn!(dir = %logs_local.display(), "cannot create the check's log directory: {e}");
    }
    let config = check_sandbox_config(&check.handler, &id, &logs_node);
    let log = logs_local.join(sandbox::CHECK_LOG);
    let ran = run_in_sandbox(cri, check, place, config, &log).await;
    if let Err(e) = sweep_id(cri, &id).await {
        tracing::warn!(handler = %check.handler, "cannot remove the check's sandbox yet (the next sweep will): {e}");
    }
    let _ = std::fs::remove_dir_all(&logs_local);
    let (sandbox, container) = ran?;
    Ok(CheckReport {
        handler: check.handler.clone(),
        sandbox,
        container,
        total: t0.elapsed(),
    })
}

/// The sandbox, ready, then the container: how long each took.
async fn run_in_sandbox(
    cri: &CriClient,
    check: &HandlerCheck,
    place: &CheckPlace,
    config: super::cri::proto::PodSandboxConfig,
    log: &std::path::Path,
) -> Result<(Duration, Option<Duration>), NodeError> {
    let handler = &check.handler;
    let sandbox_failed = |detail: String| NodeError::SandboxCheckFailed {
        handler: handler.clone(),
        detail: clip(&detail, DETAIL_MAX_BYTES),
    };
    let t = Instant::now();
    let id = cri
        .try_run_pod_sandbox(config.clone(), handler, place.sandbox_timeout)
        .await
        .map_err(|e| match &e {
            // containerd 2.x names no sandbox image in its status: RunPodSandbox pulls it, and
            // says so when it cannot (not the runtime's fault)
            CallError::Refused { message, .. } => match output::sandbox_image_failure(message) {
                Some(image) => NodeError::NoSandboxImage {
                    image: clip(&image, 256),
                    detail: clip(message, DETAIL_MAX_BYTES),
                },
                None => refusal(e, sandbox_failed),
            },
            _ => refusal(e, sandbox_failed),
        })?;
    let status = cri
        .try_pod_sandbox_status(&id, place.sandbox_timeout)
        .await
        .map_err(|e| refusal(e, sandbox_failed))?;
    let state = status.status.map(|s| s.state);
    if state != Some(super::cri::proto::SANDBOX_READY) {
        return Err(sandbox_failed(format!(
            "the sandbox started but is not ready (state {state:?}): its runtime stopped it"
        )));
    }
    let sandbox = t.elapsed();
    let Some(c) = &check.container else {
        return Ok((sandbox, None));
    };
    let t = Instant::now();
    run_container(cri, handler, c, (&id, config), log).await?;
    Ok((sandbox, Some(t.elapsed())))
}

/// A refused call is the runtime's failure (`failed`); an unreachable CRI stays what it is.
fn refusal(e: CallError, failed: impl Fn(String) -> NodeError) -> NodeError {
    match e {
        CallError::Unavailable(e) => e,
        other => failed(other.to_string()),
    }
}

/// The check container in sandbox `sandbox_id`: its image had, created, started, waited for
/// and judged.
async fn run_container(
    cri: &CriClient,
    handler: &str,
    c: &ContainerCheck,
    (sandbox_id, sandbox): (&str, super::cri::proto::PodSandboxConfig),
    log: &std::path::Path,
) -> Result<(), NodeError> {
    let deadline = Instant::now() + c.timeout;
    let left = || deadline.saturating_duration_since(Instant::now()).max(POLL);
    let failed = |detail: String| NodeError::ContainerCheckFailed {
        handler: handler.to_string(),
        detail: clip(&detail, DETAIL_MAX_BYTES),
    };
    ensure_image(cri, &c.image, Some(sandbox.clone()), left())
        .await
        .map_err(|(e, detail)| match e {
            Some(e) => e,
            None => NodeError::CheckImageUnavailable {
                image: clip(&c.image, 256),
                detail,
            },
        })?;
    let config = container_config(c, sandbox_id);
    let id = cri
        .create_container(sandbox_id, config, sandbox, left())
        .await
        .map_err(|e| refusal(e, failed))?;
    cri.start_container(&id, left())
        .await
        .map_err(|e| refusal(e, failed))?;
    let status = loop {
        let st = cri
            .container_status(&id, left())
            .await
            .map_err(|e| refusal(e, failed))?;
        if st.state == super::cri::containers::CONTAINER_EXITED {
            break st;
        }
        if Instant::now() >= deadline {
            return Err(failed(format!(
                "still running after {} s (spec.check.container.timeoutSeconds)",
                c.timeout.as_secs()
            )));
        }
        tokio::time::sleep(POLL).await;
    };
    let ended = read_output(&status, log, c, deadline).await;
    judge(c, &ended).map_err(failed)
}

/// What the exited container printed. The log file may still be written for a moment after
/// the exit is reported, so a missing expected output is read again until `deadline` (at most
/// 1 s more).
async fn read_output(
    status: &super::cri::containers::ContainerStatus,
    log: &std::path::Path,
    c: &ContainerCheck,
    deadline: Instant,
) -> Ended {
    let settle = (Instant::now() + Duration::from_secs(1)).min(deadline);
    loop {
        let output = read_log_file(log);
        let complete = c
            .output_contains
            .as_ref()
            .is_none_or(|want| output.contains(want.as_str()));
        if complete || Instant::now() >= settle {
            return Ended {
                exit_code: status.exit_code,
                reason: status.reason.clone(),
                output,
            };
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A CRI log file read back, at most [`output::MAX_LOG_BYTES`] of it (empty when unreadable).
fn read_log_file(path: &std::path::Path) -> String {
    use std::io::Read;
    let mut bytes = Vec::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(output::MAX_LOG_BYTES as u64).read_to_end(&mut bytes);
    }
    read_cri_log(&bytes)
}

/// Whether a pod sandbox can start on this node at all, asked before a restart: the sandbox
/// image containerd names (1.x says which in its status) present or pulled; where containerd
/// does not say (2.x), a sandbox through the default runtime, whose refusal names the image
/// it could not get. `Err`: [`NodeError::NoSandboxImage`], or the CRI is unavailable. The
/// default runtime's own trouble is not an install's, and passes.
pub async fn node_runs_pods(cri: &CriClient, place: &CheckPlace) -> Result<(), NodeError> {
    let status = cri.status_raw(place.sandbox_timeout).await?;
    if super::cri::sandbox_image_from_verbose_info(&status.info).is_some() {
        return ensure_sandbox_image(cri, place.sandbox_timeout)
            .await
            .map(|_| ());
    }
    let id = sandbox_id_for(DEFAULT_RUNTIME);
    let logs_node = format!("{}/{id}", place.logs_node.trim_end_matches('/'));
    let config = check_sandbox_config(DEFAULT_RUNTIME, &id, &logs_node);
    let ran = cri
        .try_run_pod_sandbox(config, "", place.sandbox_timeout)
        .await;
    let swept = sweep_id(cri, &id).await;
    if let Err(CallError::Refused { message, .. }) = &ran
        && let Some(image) = output::sandbox_image_failure(message)
    {
        return Err(NodeError::NoSandboxImage {
            image: clip(&image, 256),
            detail: clip(message, DETAIL_MAX_BYTES),
        });
    }
    swept.map(|_| ())
}

/// How a check through containerd's default runtime names itself.
const DEFAULT_RUNTIME: &str = "default";

/// The sandbox image containerd is configured with, present or pulled; `Err`:
/// [`NodeError::NoSandboxImage`] (or the CRI is unavailable). Empty when containerd's status
/// names none (2.x): `RunPodSandbox` then pulls it, and says when it cannot.
pub async fn ensure_sandbox_image(cri: &CriClient, timeout: Duration) -> Result<String, NodeError> {
    let status = cri.status_raw(timeout).await?;
    let Some(image) = super::cri::sandbox_image_from_verbose_info(&status.info) else {
        return Ok(String::new());
    };
    ensure_image(cri, &image, None, timeout)
        .await
        .map_err(|(e, detail)| match e {
            Some(e) => e,
            None => NodeError::NoSandboxImage {
                image: clip(&image, 256),
                detail,
            },
        })?;
    Ok(image)
}

/// `image` present, else pulled. `Err((Some(e), _))`: the CRI is unavailable;
/// `Err((None, detail))`: the image is not there and the pull failed.
async fn ensure_image(
    cri: &CriClient,
    image: &str,
    sandbox: Option<super::cri::proto::PodSandboxConfig>,
    timeout: Duration,
) -> Result<(), (Option<NodeError>, String)> {
    let split = |e: CallError| match e {
        CallError::Unavailable(e) => (Some(e), String::new()),
        other => (None, clip(&other.to_string(), DETAIL_MAX_BYTES)),
    };
    if cri.image_id(image, timeout).await.map_err(split)?.is_some() {
        return Ok(());
    }
    tracing::info!(image, "pulling an image for the runtime check");
    cri.pull_image(image, sandbox, timeout)
        .await
        .map(|_| ())
        .map_err(split)
}

/// The directory under which each check gets its log directory, as containerd sees it on the
/// node: `<state-dir>/checks`.
pub fn checks_dir(state_dir: &str) -> String {
    format!("{}/checks", state_dir.trim_end_matches('/'))
}

/// Remove every check's log directory under `logs_local` (the [`checks_dir`] as this process
/// reaches it): a check ended by a crash left its own. The names of those removed; none when
/// there is no such directory. One that cannot be removed is logged and left for the next
/// start; `Err`: the directory cannot be read.
pub fn remove_log_dirs(logs_local: &std::path::Path) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(logs_local) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => removed.push(name),
            Err(e) => tracing::warn!(
                dir = %entry.path().display(),
                "cannot remove a runtime check's log directory yet (the next start will): {e}"
            ),
        }
    }
    removed.sort();
    Ok(removed)
}

/// Remove every check sandbox (a crash, a timeout or an older agent left them): how many.
pub async fn sweep(cri: &CriClient) -> Result<usize, NodeError> {
    let labels = HashMap::from([(CHECK_LABEL.to_string(), "true".to_string())]);
    sweep_labelled(cri, labels).await
}

/// Remove the sandboxes of check `id`.
async fn sweep_id(cri: &CriClient, id: &str) -> Result<usize, NodeError> {
    let labels = HashMap::from([(CHECK_ID_LABEL.to_string(), id.to_string())]);
    sweep_labelled(cri, labels).await
}

async fn sweep_labelled(
    cri: &CriClient,
    labels: HashMap<String, String>,
) -> Result<usize, NodeError> {
    let unavailable = |e: CallError| match e {
        CallError::Unavailable(e) => e,
        other => NodeError::CriUnavailable {
            socket: cri.socket().display().to_string(),
            detail: other.to_string(),
            plugin_not_loaded: false,
        },
    };
    let found = cri
        .list_labelled_sandboxes(labels, CLEANUP_CALL)
        .await
        .map_err(unavailable)?;
    let mut first_error = None;
    for s in &found {
        if let Err(e) = remove_sandbox(cri, &s.id).await {
            first_error.get_or_insert(unavailable(e));
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(found.len()),
    }
}

/// Stop and remove sandbox `id`, asked again for a while when containerd refuses: a container
/// a crash interrupted while it started cannot be removed until its start ends ("container is
/// in starting state, can't be removed").
async fn remove_sandbox(cri: &CriClient, id: &str) -> Result<(), CallError> {
    let deadline = Instant::now() + REMOVE_WITHIN;
    loop {
        match cri.stop_and_remove_sandbox(id, CLEANUP_CALL).await {
            Err(CallError::Refused { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(REMOVE_AGAIN_AFTER).await
            }
            other => return other,
        }
    }
}

/// How long a refused removal is asked again, and how often.
const REMOVE_WITHIN: Duration = Duration::from_secs(20);
const REMOVE_AGAIN_AFTER: Duration = Duration::from_millis(200);
