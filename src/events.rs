//! Kubernetes Events, built and published one way: the note clipped on a character boundary
//! ([`crate::text::event_note`]), publishing best effort (a failure is logged at debug level,
//! a write that takes over [`EVENT_WITHIN`] is dropped: Events never hold up what they
//! describe). An agent's round sends its Events through a [`Sender`]: in the background, a
//! few at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

/// Event writes one [`Sender`] has under way at most. A 50-Shim batch's 100 Events, sent all at
/// once, reached the API server just as the next node claimed its slots and patched its
/// labels, and held those back (BENCHMARKS.md, the daemon benchmark).
pub const EVENTS_AT_ONCE: usize = 4;
/// Event writes a [`Sender`] keeps waiting at most; past it, new Events are dropped (an API
/// server that takes none must not grow the agent's memory).
pub const EVENTS_WAITING_MAX: usize = 1000;

/// Publishes the Events of an agent's rounds in the background, [`EVENTS_AT_ONCE`] writes at a
/// time in the order they were sent, so a round neither waits for its Events nor sends them
/// all at once beside the writes other nodes wait on.
#[derive(Clone)]
pub struct Sender {
    recorder: Recorder,
    turns: Arc<tokio::sync::Semaphore>,
    waiting: Arc<AtomicUsize>,
}

impl Sender {
    pub fn new(recorder: Recorder) -> Self {
        Sender {
            recorder,
            turns: Arc::new(tokio::sync::Semaphore::new(EVENTS_AT_ONCE)),
            waiting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Publish each Event of `batch` about each of its references, in a task of its own;
    /// failures are logged and dropped, and so is the batch when [`EVENTS_WAITING_MAX`] writes
    /// wait already.
    pub fn send(&self, batch: Vec<(Event, Vec<ObjectReference>)>) {
        let writes: usize = batch.iter().map(|(_, refs)| refs.len()).sum();
        if writes == 0 {
            return;
        }
        if self.waiting.fetch_add(writes, Ordering::SeqCst) + writes > EVENTS_WAITING_MAX {
            self.waiting.fetch_sub(writes, Ordering::SeqCst);
            tracing::debug!(writes, "too many Event writes waiting; these are dropped");
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            let this = &this;
            let each = batch
                .iter()
                .flat_map(|(ev, refs)| refs.iter().map(move |r| this.publish_in_turn(ev, r)));
            join_all(each).await;
        });
    }

    /// One Event write, once a turn is free (the semaphore is fair: in the order sent).
    async fn publish_in_turn(&self, ev: &Event, r: &ObjectReference) {
        // never closed; were it, the write would go ahead
        let _turn = self.turns.acquire().await;
        publish_one(&self.recorder, ev, r).await;
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Event writes sent and not yet made.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// Publish `ev` about each of `refs`, side by side; failures are logged and dropped.
pub async fn publish(recorder: &Recorder, ev: &Event, refs: &[ObjectReference]) {
    join_all(refs.iter().map(|r| publish_one(recorder, ev, r))).await;
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
