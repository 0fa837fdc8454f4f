//! The pure parsers of a CRI `Status` reply: a [`CriStatus`], containerd 1.x's handlers from
//! its verbose config, and the sandbox image containerd is configured with.

use std::collections::HashMap;

use super::proto;
use crate::node::error::NodeError;
use crate::node::ports::{CriStatus, HandlerSource};

/// Turn a `Status` reply into a [`CriStatus`] (pure).
pub fn status_from_response(resp: &proto::StatusResponse) -> Result<CriStatus, NodeError> {
    let conditions = resp
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let find = |t: &str| conditions.iter().find(|c| c.r#type == t);
    let runtime = find("RuntimeReady");
    let runtime_ready = runtime.is_some_and(|c| c.status);
    let runtime_detail = match runtime {
        None => "no RuntimeReady condition".to_string(),
        Some(c) if !c.status => format!("{}: {}", c.reason, c.message),
        Some(_) => String::new(),
    };
    let (handlers, handler_source) = if resp.runtime_handlers.is_empty() {
        (
            handlers_from_verbose_info(&resp.info)?,
            HandlerSource::VerboseConfig,
        )
    } else {
        let mut names: Vec<String> = resp
            .runtime_handlers
            .iter()
            .filter(|h| !h.name.is_empty())
            .map(|h| h.name.clone())
            .collect();
        names.sort();
        names.dedup();
        (names, HandlerSource::RuntimeHandlers)
    };
    Ok(CriStatus {
        runtime_ready,
        runtime_detail,
        network_ready: find("NetworkReady").is_some_and(|c| c.status),
        handlers,
        handler_source,
    })
}

/// Handler names (sorted) from containerd 1.x's verbose info: the keys of
/// `info["config"]` → `containerd` → `runtimes` (pure).
pub fn handlers_from_verbose_info(
    info: &HashMap<String, String>,
) -> Result<Vec<String>, NodeError> {
    let raw = info.get("config").ok_or_else(|| NodeError::CriInfo {
        detail: "no `config` key in the verbose info (was verbose=true sent?)".to_string(),
    })?;
    let config: serde_json::Value = serde_json::from_str(raw).map_err(|e| NodeError::CriInfo {
        detail: format!("`config` is not JSON: {e}"),
    })?;
    let runtimes = config
        .get("containerd")
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.as_object())
        .ok_or_else(|| NodeError::CriInfo {
            detail: "`config` has no `containerd.runtimes` object".to_string(),
        })?;
    let mut names: Vec<String> = runtimes.keys().cloned().collect();
    names.sort();
    Ok(names)
}

/// The sandbox (pause) image containerd starts every pod sandbox from, from its verbose
/// `Status` info (pure): containerd 1.x's `config.sandboxImage`, containerd 2.x's
/// `config.pinnedImages.sandbox`. `None` when the info names none.
pub fn sandbox_image_from_verbose_info(info: &HashMap<String, String>) -> Option<String> {
    let config: serde_json::Value = serde_json::from_str(info.get("config")?).ok()?;
    [
        config.get("sandboxImage"),
        config.pointer("/pinnedImages/sandbox"),
        config.pointer("/PinnedImages/sandbox"),
    ]
    .into_iter()
    .flatten()
    .find_map(|v| v.as_str().filter(|s| !s.is_empty()).map(str::to_string))
}
