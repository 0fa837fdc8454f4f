//! `BeforeRollout`, the task shell (the pure part: [`super::hold`]): the coordinator asks the
//! extensions before it opens slots for a Shim
//! generation. Until they answer `Success` the rollout is held: no slot opens (as during a
//! halt), and a `RolloutDeferred` condition says why; a `Failure` halts the rollout with the
//! extension's message (`RolloutHalted`, reason `ExtensionRefused`) until a new generation.
//!
//! # Guarantees
//! - The calls run beside the coordinator's loop (a task per Shim generation; all the
//!   generation's extensions at once, each bounded by its timeout): a slow extension holds
//!   only its Shim's rollout ([`Hold::Asking`]), never the other Shims' slots, the freeing
//!   of deleted Nodes' slots or status. The answer comes back through the loop's nudge.
//! - An approval is persisted: the coordinator writes the approved generation into the
//!   Shim's `status.approvedGeneration` (with the rest of its status), and a coordinator
//!   that finds it there for the current generation trusts it without asking again (a
//!   failover does not ask twice). A new generation is asked again. A refusal is persisted
//!   the same way (`status.refusedGeneration`, its message in the `RolloutHalted`
//!   condition): a new coordinator keeps that generation halted without asking ([`persisted`]).
//! - Without BeforeRollout extensions for a Shim: [`Hold::Go`] at once, no request, no task.
//!
//! # Caveats
//! - A deferral lives in memory: a new coordinator asks again. An answer the old coordinator
//!   had not yet written (its status writes are throttled) is asked again too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::events::Recorder;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::call::{Hooks, Target};
use super::decide::{Verdict, apply_policy};
pub use super::hold::{ASK_LIMIT, Hold, persisted};
use super::hold::{fold, request};
use crate::api::Shim;
use crate::api::extension::HookName;

/// One Shim's generation and its hold; `approved`: extensions said Go (to persist).
#[derive(Clone, Debug)]
struct Entry {
    generation: i64,
    hold: Hold,
    approved: bool,
}

type Held = Arc<Mutex<BTreeMap<String, Entry>>>;

/// The coordinator's BeforeRollout answers, per Shim.
pub struct RolloutHooks {
    hooks: Arc<Hooks>,
    recorder: Recorder,
    /// Shim → its generation's hold; written by the calls' tasks too.
    held: Held,
    /// Wakes the coordinator's loop when an answer came in.
    nudge: mpsc::Sender<()>,
    /// The calls under way; aborted when the coordinator stops leading.
    calls: JoinSet<()>,
}

impl RolloutHooks {
    pub fn new(hooks: Arc<Hooks>, recorder: Recorder, nudge: mpsc::Sender<()>) -> RolloutHooks {
        RolloutHooks {
            hooks,
            recorder,
            held: Arc::default(),
            nudge,
            calls: JoinSet::new(),
        }
    }

    /// The hold of `shim`'s generation; never waits for an extension. Calls the extensions
    /// (beside the loop) when the generation has no answer yet or a deferral ran out, unless
    /// the Shim's status records this generation as approved.
    pub fn check(&mut self, shim: &Shim) -> Hold {
        while self.calls.try_join_next().is_some() {}
        let name = shim.name_any();
        let generation = shim.metadata.generation.unwrap_or_default();
        let now = Instant::now();
        let known = self.entry(&name).filter(|e| e.generation == generation);
        let deferred = match known.map(|e| e.hold) {
            Some(h @ (Hold::Go | Hold::Refused(_))) => return h,
            Some(h @ (Hold::Deferred(..) | Hold::Asking(..)))
                if h.due().is_some_and(|d| d > now) =>
            {
                return h;
            }
            // asked again: still deferred, with the last answer's message, until they answer
            Some(Hold::Deferred(_, m) | Hold::Asking(_, Some(m))) => Some(m),
            _ => None,
        };
        if let Some(hold) = persisted(shim) {
            tracing::debug!(shim = %name, generation, ?hold, "BeforeRollout answered this generation already (status)");
            let approved = hold == Hold::Go;
            self.set(&name, generation, hold.clone(), approved);
            return hold;
        }
        // the cache synced (or there is no CRD): no extension, no task
        if self.hooks.known()
            && self
                .hooks
                .targets(
                    HookName::BeforeRollout,
                    std::slice::from_ref(&name),
                    std::slice::from_ref(shim),
                )
                .is_empty()
        {
            self.set(&name, generation, Hold::Go, false);
            return Hold::Go;
        }
        let hold = Hold::Asking(now, deferred);
        self.set(&name, generation, hold.clone(), false);
        let (hooks, recorder, held, nudge) = (
            self.hooks.clone(),
            self.recorder.clone(),
            self.held.clone(),
            self.nudge.clone(),
        );
        let shim = shim.clone();
        self.calls.spawn(async move {
            let (hold, approved) = ask(&hooks, &recorder, &shim).await;
            if let Ok(mut h) = held.lock()
                && let Some(e) = h.get_mut(&name)
                && e.generation == generation
            {
                *e = Entry {
                    generation,
                    hold,
                    approved,
                };
            }
            let _ = nudge.try_send(());
        });
        hold
    }

    /// The generation of `shim` its extensions approved, to persist in its status.
    pub fn approved(&self, shim: &Shim) -> Option<i64> {
        self.entry(&shim.name_any())
            .filter(|e| e.approved && e.hold == Hold::Go)
            .map(|e| e.generation)
    }

    /// Forget Shims that are gone.
    pub fn retain(&mut self, exists: impl Fn(&str) -> bool) {
        if let Ok(mut h) = self.held.lock() {
            h.retain(|name, _| exists(name));
        }
    }

    fn entry(&self, name: &str) -> Option<Entry> {
        self.held.lock().ok().and_then(|h| h.get(name).cloned())
    }

    fn set(&self, name: &str, generation: i64, hold: Hold, approved: bool) {
        if let Ok(mut h) = self.held.lock() {
            h.insert(
                name.to_string(),
                Entry {
                    generation,
                    hold,
                    approved,
                },
            );
        }
    }
}

/// Ask `shim`'s BeforeRollout extensions (all at once): the hold, and whether extensions
/// approved it.
async fn ask(hooks: &Hooks, recorder: &Recorder, shim: &Shim) -> (Hold, bool) {
    let name = shim.name_any();
    let generation = shim.metadata.generation.unwrap_or_default();
    if hooks.ready().await.is_err() {
        return (
            Hold::Deferred(
                Instant::now() + Duration::from_secs(5),
                "the ShimExtensions could not be listed".into(),
            ),
            false,
        );
    }
    let targets = hooks.targets(
        HookName::BeforeRollout,
        std::slice::from_ref(&name),
        std::slice::from_ref(shim),
    );
    if targets.is_empty() {
        return (Hold::Go, false);
    }
    let req = &request(shim);
    let calls = targets.iter().map(|t: &Target| async move {
        let (outcome, took) = hooks.call(t, req).await;
        let v = apply_policy(&t.name(), t.spec.policy(), outcome);
        publish(recorder, shim, &t.name(), &v, took).await;
        hooks.record(t, req, &v);
        v
    });
    let verdicts = futures_util::future::join_all(calls).await;
    let hold = fold(verdicts, Instant::now());
    tracing::debug!(shim = %name, generation, ?hold, "BeforeRollout answered");
    let approved = hold == Hold::Go;
    (hold, approved)
}

async fn publish(recorder: &Recorder, shim: &Shim, ext: &str, v: &Verdict, took: Duration) {
    use kube::Resource;
    let hook = HookName::BeforeRollout;
    let result = v.result();
    crate::telemetry::hook_called(hook.as_str(), result, took);
    let note = format!(
        "BeforeRollout of extension {ext} for generation {}: {result} in {} ms{}",
        shim.metadata.generation.unwrap_or_default(),
        took.as_millis(),
        v.detail()
    );
    let ev = crate::events::event(
        v.event_type(),
        &format!("BeforeRollout{result}"),
        "BeforeRollout",
        &note,
    );
    tracing::info!(shim = %shim.name_any(), extension = ext, result, "{}", ev.note.as_deref().unwrap_or_default());
    crate::events::publish(recorder, &ev, &[shim.object_ref(&())]).await;
}
