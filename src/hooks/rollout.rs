//! `BeforeRollout`: the coordinator asks the extensions before it opens slots for a Shim
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

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::Recorder;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::call::{Hooks, Target};
use super::decide::{Verdict, apply_policy};
use super::wire::{ChangeKind, Request, ShimChange};
use crate::api::extension::HookName;
use crate::api::{Condition, Shim, ShimStatus};

/// How long a generation may stay [`Hold::Asking`] before it is asked again (a lost task):
/// the wait for the extensions' cache and one call, each at most 30 s, and some slack.
pub const ASK_LIMIT: Duration = Duration::from_secs(90);

/// Where a Shim generation's rollout stands with its extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Slots may open.
    Go,
    /// The extensions are being asked (since then): held, as a deferral, without a condition
    /// of its own.
    Asking(Instant),
    /// Ask again at this time.
    Deferred(Instant, String),
    /// Halted with the extension's message.
    Refused(String),
}

impl Hold {
    /// When the coordinator should look at the Shim again for this hold.
    pub fn due(&self) -> Option<Instant> {
        match self {
            Hold::Deferred(until, _) => Some(*until),
            Hold::Asking(since) => Some(*since + ASK_LIMIT),
            _ => None,
        }
    }
}

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
        match known.map(|e| e.hold) {
            Some(h @ (Hold::Go | Hold::Refused(_))) => return h,
            Some(h @ (Hold::Deferred(..) | Hold::Asking(_)))
                if h.due().is_some_and(|d| d > now) =>
            {
                return h;
            }
            _ => {}
        }
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
        let hold = Hold::Asking(now);
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

/// The answer `shim`'s status records for its current generation: approved (`Go`), or refused
/// with the message of its `RolloutHalted` condition. A coordinator trusts it, so a failover
/// neither asks again for an approved generation nor lets a refused one through.
pub fn persisted(shim: &Shim) -> Option<Hold> {
    let generation = shim.metadata.generation.unwrap_or_default();
    let status = shim.status.as_ref()?;
    if status.approved_generation == Some(generation) {
        return Some(Hold::Go);
    }
    if status.refused_generation != Some(generation) {
        return None;
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| {
            c.type_ == "RolloutHalted"
                && c.status == "True"
                && c.reason.as_deref() == Some("ExtensionRefused")
        })
        .map(|c| Hold::Refused(c.message.clone().unwrap_or_default()))
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
    let mut hold = Hold::Go;
    for v in verdicts {
        hold = match (hold, v) {
            (h @ Hold::Refused(_), _) => h,
            (_, Verdict::Fail(m)) => Hold::Refused(m),
            (Hold::Deferred(u, m), Verdict::Defer(d, m2)) => {
                let u2 = Instant::now() + d;
                if u2 > u {
                    Hold::Deferred(u2, m2)
                } else {
                    Hold::Deferred(u, m)
                }
            }
            (_, Verdict::Defer(d, m)) => Hold::Deferred(Instant::now() + d, m),
            (h, _) => h,
        };
    }
    tracing::debug!(shim = %name, generation, ?hold, "BeforeRollout answered");
    let approved = hold == Hold::Go;
    (hold, approved)
}

/// The BeforeRollout request for `shim`'s generation.
fn request(shim: &Shim) -> Request {
    let installed = shim
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .is_some_and(|n| n.installed > 0);
    let change = ShimChange {
        name: shim.name_any(),
        change: if installed {
            ChangeKind::Upgrade
        } else {
            ChangeKind::Install
        },
        old_digest: None,
        new_digest: shim
            .spec
            .fetch_strategy
            .anon_http
            .as_ref()
            .and_then(|a| a.sha256.clone()),
    };
    let mut req = Request::new(HookName::BeforeRollout, None, vec![change]);
    req.generation = Some(shim.metadata.generation.unwrap_or_default());
    req
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

/// `status` with the hold shown: `RolloutDeferred` (True while deferred, else False), and a
/// refusal as `RolloutHalted` with the extension's message.
///
/// `approved`: the generation the extensions approved now, if any; the last approved one
/// is kept in `approvedGeneration` (a new coordinator trusts it).
/// `generation`: the one `hold` is about (a refusal is kept in `refusedGeneration`, trusted
/// likewise).
pub fn with_hold(
    mut status: ShimStatus,
    hold: &Hold,
    approved: Option<i64>,
    generation: i64,
    previous: Option<&ShimStatus>,
    now: &Time,
) -> ShimStatus {
    status.approved_generation = approved.or(previous.and_then(|p| p.approved_generation));
    let conds = status.conditions.get_or_insert_with(Vec::new);
    let set = |conds: &mut Vec<Condition>, mut c: Condition| {
        crate::cluster::status::carry_transition_time(&mut c, previous, now);
        conds.retain(|x| x.type_ != c.type_);
        conds.push(c);
    };
    let cond = |type_: &str, status: &str, reason: &str, message: String| Condition {
        type_: type_.into(),
        status: status.into(),
        severity: (status == "False").then(|| "Info".to_string()),
        last_transition_time: None,
        reason: Some(reason.into()),
        message: Some(message),
    };
    match hold {
        Hold::Deferred(_, m) => set(
            conds,
            cond(
                "RolloutDeferred",
                "True",
                "ExtensionDeferred",
                format!("a BeforeRollout extension defers the rollout: {m}"),
            ),
        ),
        // while asking, the condition stays as it was
        Hold::Asking(_) => {
            if let Some(c) = previous
                .and_then(|p| p.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "RolloutDeferred"))
            {
                conds.retain(|x| x.type_ != c.type_);
                conds.push(c.clone());
            }
        }
        // shown False once it was True; never added to a Shim no extension deferred
        _ if previous
            .and_then(|p| p.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "RolloutDeferred")) =>
        {
            set(
                conds,
                cond(
                    "RolloutDeferred",
                    "False",
                    "NotDeferred",
                    "no extension defers the rollout".into(),
                ),
            )
        }
        _ => {}
    }
    status.refused_generation = previous.and_then(|p| p.refused_generation);
    if let Hold::Refused(m) = hold {
        status.refused_generation = Some(generation);
        let mut c = cond("RolloutHalted", "True", "ExtensionRefused", m.clone());
        c.severity = Some("Error".into());
        set(conds, c);
        if let Some(r) = status.rollout.as_mut() {
            r.halted = true;
        }
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_halts_with_the_message_and_a_deferral_is_a_condition() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let s = with_hold(
            ShimStatus::default(),
            &Hold::Refused("freeze".into()),
            None,
            1,
            None,
            &now,
        );
        let c = s.conditions.as_ref().unwrap();
        let halted = c.iter().find(|c| c.type_ == "RolloutHalted").unwrap();
        assert_eq!(halted.status, "True");
        assert_eq!(halted.message.as_deref(), Some("freeze"));
        let d = with_hold(
            ShimStatus::default(),
            &Hold::Deferred(Instant::now(), "busy".into()),
            None,
            1,
            None,
            &now,
        );
        let c = d.conditions.as_ref().unwrap();
        let deferred = c.iter().find(|c| c.type_ == "RolloutDeferred").unwrap();
        assert_eq!(deferred.status, "True");
        assert!(deferred.message.as_deref().unwrap().contains("busy"));
        assert!(!c.iter().any(|c| c.type_ == "RolloutHalted"));
        let go = with_hold(ShimStatus::default(), &Hold::Go, None, 1, Some(&d), &now);
        let c = go.conditions.as_ref().unwrap();
        assert_eq!(
            c.iter()
                .find(|c| c.type_ == "RolloutDeferred")
                .unwrap()
                .status,
            "False"
        );
        // never deferred: no condition at all
        let plain = with_hold(ShimStatus::default(), &Hold::Go, None, 1, None, &now);
        assert!(plain.conditions.unwrap_or_default().is_empty());
    }

    #[test]
    fn asking_keeps_the_condition_as_it_was_and_the_approved_generation_is_kept() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let deferred = with_hold(
            ShimStatus::default(),
            &Hold::Deferred(Instant::now(), "busy".into()),
            None,
            1,
            None,
            &now,
        );
        let asking = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now()),
            None,
            1,
            Some(&deferred),
            &now,
        );
        assert_eq!(asking.conditions, deferred.conditions);
        let fresh = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now()),
            None,
            1,
            None,
            &now,
        );
        assert!(fresh.conditions.unwrap_or_default().is_empty());
        // approved now: recorded; later statuses keep it until another is approved
        let approved = with_hold(ShimStatus::default(), &Hold::Go, Some(4), 1, None, &now);
        assert_eq!(approved.approved_generation, Some(4));
        let later = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now()),
            None,
            1,
            Some(&approved),
            &now,
        );
        assert_eq!(later.approved_generation, Some(4));
        let next = with_hold(
            ShimStatus::default(),
            &Hold::Go,
            Some(5),
            1,
            Some(&later),
            &now,
        );
        assert_eq!(next.approved_generation, Some(5));
    }

    #[test]
    fn a_refusal_is_persisted_for_its_generation_and_trusted_as_an_approval_is() {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let refused = with_hold(
            ShimStatus::default(),
            &Hold::Refused("change freeze".into()),
            None,
            3,
            None,
            &now,
        );
        assert_eq!(refused.refused_generation, Some(3));
        let shim = |generation: i64, status: &ShimStatus| {
            let y = format!(
                "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, generation: {generation}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n",
                "a".repeat(64)
            );
            let mut s = crate::api::load::parse_shims(&y, "t.yaml")
                .unwrap()
                .remove(0);
            s.status = Some(status.clone());
            s
        };
        assert_eq!(
            persisted(&shim(3, &refused)),
            Some(Hold::Refused("change freeze".into()))
        );
        // a new generation is asked again
        assert_eq!(persisted(&shim(4, &refused)), None);
        // approved: trusted; an approval of another generation is not
        let approved = with_hold(ShimStatus::default(), &Hold::Go, Some(4), 4, None, &now);
        assert_eq!(persisted(&shim(4, &approved)), Some(Hold::Go));
        assert_eq!(persisted(&shim(5, &approved)), None);
        // the refusal is kept through later statuses (asking, going) of other generations
        let later = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now()),
            None,
            4,
            Some(&refused),
            &now,
        );
        assert_eq!(later.refused_generation, Some(3));
    }
}
