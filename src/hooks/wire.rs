//! The JSON of hook calls: `apiVersion: hooks.containerd.x-k8s.io/v1alpha1` and one kind per
//! hook and direction (`BeforeNodeRestartRequest` / `BeforeNodeRestartResponse`, …), so a
//! later version can be served beside this one. Responses are checked strictly: a wrong
//! version or kind, an unknown field or a negative `retryAfterSeconds` is an error, which the
//! hook's failure policy then decides about.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::extension::HookName;

pub const API_VERSION: &str = "hooks.containerd.x-k8s.io/v1alpha1";
/// Longest message kept from a response (Events and errors carry it).
pub const MAX_MESSAGE: usize = 1024;
/// Longest response body read.
pub const MAX_BODY: usize = 64 * 1024;

/// What a node's change does to one Shim.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Install,
    Upgrade,
    Uninstall,
}

/// One Shim in a node's change.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ShimChange {
    pub name: String,
    pub change: ChangeKind,
    /// sha256 of the installed artifact, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_digest: Option<String>,
    /// sha256 the change installs (as the Shim pins it), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_digest: Option<String>,
}

/// How a node's change ended (AfterNodeChange).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeResult {
    Committed,
    RolledBack,
}

/// A hook's request body.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub api_version: String,
    pub kind: String,
    /// The node (BeforeNodeRestart, AfterNodeChange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub shims: Vec<ShimChange>,
    /// The Shim generation a rollout opens slots for (BeforeRollout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// AfterNodeChange only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<ChangeResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Request {
    pub fn new(hook: HookName, node: Option<&str>, shims: Vec<ShimChange>) -> Request {
        Request {
            api_version: API_VERSION.into(),
            kind: request_kind(hook),
            node: node.map(str::to_string),
            shims,
            generation: None,
            result: None,
            message: None,
        }
    }
}

pub fn request_kind(hook: HookName) -> String {
    format!("{}Request", hook.as_str())
}

pub fn response_kind(hook: HookName) -> String {
    format!("{}Response", hook.as_str())
}

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Success,
    Failure,
}

#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Response {
    api_version: String,
    kind: String,
    status: Status,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    retry_after_seconds: Option<i64>,
}

/// What a well-formed response says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Success,
    /// `Success` with `retryAfterSeconds > 0`: ask again later (a `Failure` never defers).
    Defer(Duration, String),
    Failure(String),
}

/// Longest deferral one answer may ask for.
pub const MAX_RETRY_AFTER_SECS: i64 = 3600;

/// The response of `hook` in `body`, or why it is malformed.
pub fn parse_response(hook: HookName, body: &[u8]) -> Result<Answer, String> {
    if body.len() > MAX_BODY {
        return Err(format!("response larger than {MAX_BODY} bytes"));
    }
    let r: Response =
        serde_json::from_slice(body).map_err(|e| format!("malformed response: {e}"))?;
    if r.api_version != API_VERSION {
        return Err(format!(
            "response apiVersion {:?}, expected {API_VERSION}",
            clip(&r.api_version, 100)
        ));
    }
    let want = response_kind(hook);
    if r.kind != want {
        return Err(format!(
            "response kind {:?}, expected {want}",
            clip(&r.kind, 100)
        ));
    }
    let retry = r.retry_after_seconds.unwrap_or(0);
    if !(0..=MAX_RETRY_AFTER_SECS).contains(&retry) {
        return Err(format!(
            "retryAfterSeconds {retry} out of range 0..={MAX_RETRY_AFTER_SECS}"
        ));
    }
    let message = clip(r.message.as_deref().unwrap_or(""), MAX_MESSAGE);
    Ok(match r.status {
        Status::Failure => Answer::Failure(message),
        Status::Success if retry > 0 => Answer::Defer(Duration::from_secs(retry as u64), message),
        Status::Success => Answer::Success,
    })
}

pub use crate::text::clip;

#[cfg(test)]
mod tests {
    use super::*;

    const H: HookName = HookName::BeforeNodeRestart;

    fn parse(v: serde_json::Value) -> Result<Answer, String> {
        parse_response(H, v.to_string().as_bytes())
    }

    #[test]
    fn requests_carry_version_and_kind() {
        let r = Request::new(H, Some("n1"), vec![]);
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], "BeforeNodeRestartRequest");
        assert_eq!(v["node"], "n1");
    }

    #[test]
    fn success_defer_and_failure() {
        let ok = serde_json::json!({"apiVersion": API_VERSION, "kind": "BeforeNodeRestartResponse", "status": "Success"});
        assert_eq!(parse(ok), Ok(Answer::Success));
        let defer = serde_json::json!({"apiVersion": API_VERSION, "kind": "BeforeNodeRestartResponse", "status": "Success", "retryAfterSeconds": 7, "message": "busy"});
        assert_eq!(
            parse(defer),
            Ok(Answer::Defer(Duration::from_secs(7), "busy".into()))
        );
        let fail = serde_json::json!({"apiVersion": API_VERSION, "kind": "BeforeNodeRestartResponse", "status": "Failure", "message": "no\nway", "retryAfterSeconds": 0});
        assert_eq!(parse(fail), Ok(Answer::Failure("no way".into())));
    }

    #[test]
    fn malformed_responses_are_errors() {
        let base = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = serde_json::json!({"apiVersion": API_VERSION, "kind": "BeforeNodeRestartResponse", "status": "Success"});
            f(&mut v);
            parse(v)
        };
        let e = base(&|v| v["kind"] = "AfterNodeChangeResponse".into()).unwrap_err();
        assert!(e.contains("kind"), "{e}");
        let e = base(&|v| v["apiVersion"] = "hooks.containerd.x-k8s.io/v2".into()).unwrap_err();
        assert!(e.contains("apiVersion"), "{e}");
        let e = base(&|v| v["extra"] = 1.into()).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
        let e = base(&|v| v["retryAfterSeconds"] = (-1).into()).unwrap_err();
        assert!(e.contains("retryAfterSeconds"), "{e}");
        let e = base(&|v| v["status"] = "Maybe".into()).unwrap_err();
        assert!(e.contains("malformed"), "{e}");
        assert!(parse_response(H, b"not json").is_err());
        assert!(parse_response(H, &vec![b' '; MAX_BODY + 1]).is_err());
    }

    #[test]
    fn clip_keeps_char_boundaries() {
        assert_eq!(clip("ééé", 3), "é");
        assert_eq!(clip("abc", 10), "abc");
    }
}
