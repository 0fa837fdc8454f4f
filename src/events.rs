//! Kubernetes Events, built and published one way: the note clipped on a character boundary
//! ([`crate::text::event_note`]), publishing best effort (a failure is logged at debug level,
//! a write that takes over [`EVENT_WITHIN`] is dropped: Events never hold up what they
//! describe).

use std::time::Duration;

use futures_util::future::join_all;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// An Event with `reason` (also its action) and `note`, clipped to what the API accepts.
pub fn event(type_: EventType, reason: &str, action: &str, note: &str) -> Event {
    Event {
        type_,
        reason: reason.into(),
        note: Some(crate::text::event_note(note)),
        action: action.into(),
        secondary: None,
    }
}

/// How long one Event write may take. Past it the Event is dropped (Events are best effort),
/// so an API server that holds Event writes holds up nothing: not the agent's next round, not
/// a BeforeRollout verdict.
pub const EVENT_WITHIN: Duration = Duration::from_secs(5);

/// Publish `ev` about each of `refs`, side by side; failures are logged and dropped.
pub async fn publish(recorder: &Recorder, ev: &Event, refs: &[ObjectReference]) {
    join_all(refs.iter().map(|r| publish_one(recorder, ev, r))).await;
}

/// Each Event of `batch` about each of its references, all side by side; failures are
/// logged and dropped.
pub async fn publish_all(recorder: &Recorder, batch: &[(Event, Vec<ObjectReference>)]) {
    let each = batch
        .iter()
        .flat_map(|(ev, refs)| refs.iter().map(move |r| publish_one(recorder, ev, r)));
    join_all(each).await;
}

/// One Event write, within [`EVENT_WITHIN`].
async fn publish_one(recorder: &Recorder, ev: &Event, r: &ObjectReference) {
    match tokio::time::timeout(EVENT_WITHIN, recorder.publish(ev, r)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "cannot publish an Event"),
        Err(_) => tracing::debug!(
            reason = %ev.reason,
            "an Event write took over {} s; dropped",
            EVENT_WITHIN.as_secs()
        ),
    }
}

/// [`publish`] in a task of its own, beside whatever the caller does next.
pub fn publish_beside(recorder: Recorder, ev: Event, refs: Vec<ObjectReference>) {
    tokio::spawn(async move { publish(&recorder, &ev, &refs).await });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_unicode_note_is_clipped_not_a_panic() {
        let note = "ü".repeat(999) + "🎉";
        let ev = event(EventType::Warning, "InstallFailed", "InstallFailed", &note);
        let n = ev.note.unwrap_or_default();
        assert!(n.len() <= crate::text::EVENT_NOTE_MAX_BYTES);
        assert!(n.ends_with('ü'));
    }
}
