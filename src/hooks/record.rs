//! `status.hooks` of a ShimExtension: the last call's result per hook, written by the caller
//! (a node's agent for `BeforeNodeRestart` and `AfterNodeChange`, the coordinator for
//! `BeforeRollout`).
//!
//! # Guarantees
//! - A write never holds a restart or a rollout: it is spawned beside the call, best effort.
//!   A failure is logged (a warning the first time, then at debug level) and dropped; the
//!   call's Event and metric are the record that always goes out.
//! - A read-modify-write of the `/status` subresource guarded by `resourceVersion`: the
//!   extension is read from the watch cache; a `409 Conflict` reads it again, at most
//!   [`RECORD_ATTEMPTS`] tries in all, then the write is dropped.
//! - No write storm: a write is skipped when the hook's entry would change only its `time`
//!   and this process wrote that same entry less than [`RECORD_QUIET_SECS`] ago (measured on
//!   its own monotonic clock, never against another writer's timestamp). A node that an
//!   extension keeps deferring thus writes at most once per 10 s; a new result, message,
//!   node or Shim is written at once.
//!
//! # Caveats
//! - Calls that end at the same moment on several nodes race: each write is guarded, the last
//!   one wins, and a writer that lost three times drops its entry.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use super::decide::Verdict;
use super::wire::{MAX_MESSAGE, clip};
use crate::api::extension::{
    HookName, HookResult, MAX_RESULT_SHIMS, ShimExtension, ShimExtensionStatus,
};

/// Least time between two writes of the same entry (apart from its time) by one process.
pub const RECORD_QUIET_SECS: u64 = 10;
/// Tries of one write (the first and the retries after a conflict).
pub const RECORD_ATTEMPTS: usize = 3;

/// What one call's entry says: its hook, its result after the failure policy, the message,
/// who called about what. `time` is set by [`entry`].
pub fn entry(
    hook: HookName,
    v: &Verdict,
    node: Option<&str>,
    shims: &[String],
    generation: Option<i64>,
) -> HookResult {
    let message = match v {
        Verdict::Proceed => None,
        Verdict::ProceedIgnoring(m) | Verdict::Fail(m) => Some(m.clone()),
        Verdict::Defer(d, m) if m.is_empty() => Some(format!("retry after {} s", d.as_secs())),
        Verdict::Defer(d, m) => Some(format!("retry after {} s: {m}", d.as_secs())),
    };
    HookResult {
        name: hook,
        result: v.result().into(),
        message: message.map(|m| clip(&m, MAX_MESSAGE)),
        time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        node: node.map(str::to_string),
        shims: shims.iter().take(MAX_RESULT_SHIMS).cloned().collect(),
        generation,
    }
}

/// `a` and `b` say the same, whatever their times.
pub fn same_but_time(a: &HookResult, b: &HookResult) -> bool {
    HookResult {
        time: None,
        ..a.clone()
    } == HookResult {
        time: None,
        ..b.clone()
    }
}

/// `status` with `entry` as its hook's last result (one entry per hook, in hook order).
pub fn merged(status: Option<&ShimExtensionStatus>, entry: HookResult) -> ShimExtensionStatus {
    let mut hooks: Vec<HookResult> = status
        .map(|s| s.hooks.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|h| h.name != entry.name)
        .collect();
    hooks.push(entry);
    hooks.sort_by_key(|h| h.name as u8);
    ShimExtensionStatus { hooks }
}

/// Whether writing `entry` would only move its time, soon after this process wrote it:
/// `current` is the extension's status now, `last` this process's last write of the hook.
pub fn skip(
    current: Option<&ShimExtensionStatus>,
    entry: &HookResult,
    last: Option<&(HookResult, Instant)>,
    now: Instant,
) -> bool {
    let shown = current
        .and_then(|s| s.hooks.iter().find(|h| h.name == entry.name))
        .is_some_and(|h| same_but_time(h, entry));
    let recent = last.is_some_and(|(w, at)| {
        same_but_time(w, entry)
            && now.saturating_duration_since(*at) < Duration::from_secs(RECORD_QUIET_SECS)
    });
    shown && recent
}

/// Writes the entries (the I/O shell of this module).
pub struct StatusRecorder {
    kube: Client,
    store: Store<ShimExtension>,
    /// This process's last write per extension and hook.
    written: Mutex<HashMap<(String, HookName), (HookResult, Instant)>>,
    /// A write failed already (later failures are logged at debug level).
    warned: AtomicBool,
}

impl StatusRecorder {
    pub fn new(kube: Client, store: Store<ShimExtension>) -> StatusRecorder {
        StatusRecorder {
            kube,
            store,
            written: Mutex::new(HashMap::new()),
            warned: AtomicBool::new(false),
        }
    }

    /// Record `entry` as the last result of its hook on extension `ext`; returns at once.
    pub fn record(self: &std::sync::Arc<Self>, ext: &str, entry: HookResult) {
        let this = self.clone();
        let ext = ext.to_string();
        tokio::spawn(async move { this.write(&ext, entry).await });
    }

    /// The write itself: read-modify-write guarded by resourceVersion, skipped by [`skip`].
    pub async fn write(&self, ext: &str, entry: HookResult) {
        let api = Api::<ShimExtension>::all(self.kube.clone());
        let key = (ext.to_string(), entry.name);
        let mut cached = self.store.get(&ObjectRef::new(ext)).map(|o| (*o).clone());
        for _ in 0..RECORD_ATTEMPTS {
            let obj = match cached.take() {
                Some(o) => o,
                None => match api.get_opt(ext).await {
                    Ok(Some(o)) => o,
                    // deleted meanwhile: nothing to record on
                    Ok(None) => return,
                    Err(e) => return self.failed(ext, entry.name, &e),
                },
            };
            let last = self.written.lock().ok().and_then(|w| w.get(&key).cloned());
            if skip(obj.status.as_ref(), &entry, last.as_ref(), Instant::now()) {
                return;
            }
            let status = merged(obj.status.as_ref(), entry.clone());
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": obj.resource_version()},
                "status": status,
            });
            match api
                .patch_status(ext, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    if let Ok(mut w) = self.written.lock() {
                        w.insert(key, (entry, Instant::now()));
                    }
                    return;
                }
                // someone wrote first: read it again
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => return,
                Err(e) => return self.failed(ext, entry.name, &e),
            }
        }
        tracing::debug!(
            extension = ext,
            hook = entry.name.as_str(),
            "status.hooks not written: conflicts on every try"
        );
    }

    fn failed(&self, ext: &str, hook: HookName, e: &kube::Error) {
        let msg = "cannot write the hook's result into the ShimExtension's status (the call went on; its Event and metric have it)";
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(extension = ext, hook = hook.as_str(), error = %e, "{msg}");
        } else {
            tracing::warn!(extension = ext, hook = hook.as_str(), error = %e, "{msg}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(hook: HookName, v: Verdict, node: &str) -> HookResult {
        entry(hook, &v, Some(node), &["spin".into()], None)
    }

    #[test]
    fn an_entry_replaces_only_its_hooks_result_in_hook_order() {
        let a = e(HookName::AfterNodeChange, Verdict::Proceed, "n1");
        let b = e(
            HookName::BeforeNodeRestart,
            Verdict::Fail("no".into()),
            "n1",
        );
        let s = merged(None, a.clone());
        let s = merged(Some(&s), b.clone());
        assert_eq!(s.hooks, vec![b, a.clone()]);
        let b2 = e(HookName::BeforeNodeRestart, Verdict::Proceed, "n2");
        let s = merged(Some(&s), b2.clone());
        assert_eq!(s.hooks, vec![b2, a]);
    }

    #[test]
    fn a_deferral_message_says_how_long_and_long_messages_are_clipped() {
        let d = e(
            HookName::BeforeNodeRestart,
            Verdict::Defer(Duration::from_secs(5), "busy".into()),
            "n",
        );
        assert_eq!(d.result, "Deferred");
        assert_eq!(d.message.as_deref(), Some("retry after 5 s: busy"));
        let long = e(
            HookName::BeforeNodeRestart,
            Verdict::Fail("x".repeat(5000)),
            "n",
        );
        assert!(long.message.unwrap().len() <= MAX_MESSAGE);
        let many: Vec<String> = (0..40).map(|i| format!("s{i}")).collect();
        let m = entry(
            HookName::BeforeRollout,
            &Verdict::Proceed,
            None,
            &many,
            Some(3),
        );
        assert_eq!(m.shims.len(), MAX_RESULT_SHIMS);
        assert_eq!(m.node, None);
    }

    #[test]
    fn only_a_repeat_of_a_recent_write_that_is_still_shown_is_skipped() {
        let now = Instant::now();
        let defer = || {
            e(
                HookName::BeforeNodeRestart,
                Verdict::Defer(Duration::from_secs(2), "not now".into()),
                "n1",
            )
        };
        let first = defer();
        let shown = merged(None, first.clone());
        let again = defer();
        let recent = (first.clone(), now);
        assert!(skip(
            Some(&shown),
            &again,
            Some(&recent),
            now + Duration::from_secs(3)
        ));
        // 10 s on: written again, with its new time
        assert!(!skip(
            Some(&shown),
            &again,
            Some(&recent),
            now + Duration::from_secs(10)
        ));
        // another result, node or message: written at once
        let ok = e(HookName::BeforeNodeRestart, Verdict::Proceed, "n1");
        assert!(!skip(Some(&shown), &ok, Some(&recent), now));
        let other = e(
            HookName::BeforeNodeRestart,
            Verdict::Defer(Duration::from_secs(2), "not now".into()),
            "n2",
        );
        assert!(!skip(Some(&shown), &other, Some(&recent), now));
        // someone else's entry is shown now: ours goes in again
        let theirs = merged(None, other);
        assert!(!skip(Some(&theirs), &again, Some(&recent), now));
        // never written by this process: written
        assert!(!skip(Some(&shown), &again, None, now));
    }
}
