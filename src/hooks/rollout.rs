//! `BeforeRollout`: the coordinator asks the extensions before it opens slots for a Shim
//! generation. Until they answer `Success` the rollout is held: no slot opens (as during a
//! halt), and a `RolloutDeferred` condition says why; a `Failure` halts the rollout with the
//! extension's message (`RolloutHalted`, reason `ExtensionRefused`) until a new generation.
//!
//! The answer is kept per generation in the coordinator's memory: a new coordinator (a
//! failover) asks again once. A call is bounded by the hook's timeout (at most 30 s).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::time::Instant;

use super::call::Hooks;
use super::decide::{Verdict, apply_policy};
use super::wire::{ChangeKind, Request, ShimChange};
use crate::api::extension::HookName;
use crate::api::{Condition, Shim, ShimStatus};

/// Where a Shim generation's rollout stands with its extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hold {
    /// Slots may open.
    Go,
    /// Ask again at this time.
    Deferred(Instant, String),
    /// Halted with the extension's message.
    Refused(String),
}

/// The coordinator's BeforeRollout answers, per Shim.
pub struct RolloutHooks {
    hooks: Arc<Hooks>,
    recorder: Recorder,
    /// Shim → (generation, its hold).
    held: BTreeMap<String, (i64, Hold)>,
}

impl RolloutHooks {
    pub fn new(hooks: Arc<Hooks>, recorder: Recorder) -> RolloutHooks {
        RolloutHooks {
            hooks,
            recorder,
            held: BTreeMap::new(),
        }
    }

    /// The hold of `shim`'s generation, calling the extensions when it has none yet or a
    /// deferral ran out. Without BeforeRollout extensions for the Shim: `Go`, no request.
    pub async fn check(&mut self, shim: &Shim) -> Hold {
        let name = shim.name_any();
        let generation = shim.metadata.generation.unwrap_or_default();
        match self.held.get(&name) {
            Some((g, h @ (Hold::Go | Hold::Refused(_)))) if *g == generation => {
                return h.clone();
            }
            Some((g, h @ Hold::Deferred(until, _)))
                if *g == generation && *until > Instant::now() =>
            {
                return h.clone();
            }
            _ => {}
        }
        if self.hooks.ready().await.is_err() {
            return Hold::Deferred(
                Instant::now() + Duration::from_secs(5),
                "the ShimExtensions could not be listed".into(),
            );
        }
        let targets = self.hooks.targets(
            HookName::BeforeRollout,
            std::slice::from_ref(&name),
            std::slice::from_ref(shim),
        );
        let mut hold = Hold::Go;
        if !targets.is_empty() {
            let installed = shim
                .status
                .as_ref()
                .and_then(|s| s.nodes.as_ref())
                .is_some_and(|n| n.installed > 0);
            let change = ShimChange {
                name: name.clone(),
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
            req.generation = Some(generation);
            for t in &targets {
                let (outcome, took) = self.hooks.call(t, &req).await;
                let v = apply_policy(&t.name(), t.spec.policy(), outcome);
                self.publish(shim, &t.name(), &v, took).await;
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
        }
        self.held.insert(name, (generation, hold.clone()));
        hold
    }

    async fn publish(&self, shim: &Shim, ext: &str, v: &Verdict, took: Duration) {
        let hook = HookName::BeforeRollout;
        let result = v.result();
        crate::telemetry::hook_called(hook.as_str(), result, took);
        let detail = match v {
            Verdict::Proceed => String::new(),
            Verdict::ProceedIgnoring(m) | Verdict::Fail(m) => format!(": {m}"),
            Verdict::Defer(d, m) => format!(": retry after {} s {m}", d.as_secs()),
        };
        let mut note = format!(
            "BeforeRollout of extension {ext} for generation {}: {result} in {} ms{detail}",
            shim.metadata.generation.unwrap_or_default(),
            took.as_millis()
        );
        note.truncate(1000);
        tracing::info!(shim = %shim.name_any(), extension = ext, result, "{note}");
        let type_ = match v {
            Verdict::Proceed | Verdict::Defer(..) => EventType::Normal,
            _ => EventType::Warning,
        };
        let ev = Event {
            type_,
            reason: format!("BeforeRollout{result}"),
            note: Some(note),
            action: "BeforeRollout".into(),
            secondary: None,
        };
        use kube::Resource;
        if let Err(e) = self.recorder.publish(&ev, &shim.object_ref(&())).await {
            tracing::debug!(error = %e, "cannot publish an Event");
        }
    }
}

/// `status` with the hold shown: `RolloutDeferred` (True while deferred, else False), and a
/// refusal as `RolloutHalted` with the extension's message.
pub fn with_hold(
    mut status: ShimStatus,
    hold: &Hold,
    previous: Option<&ShimStatus>,
    now: &Time,
) -> ShimStatus {
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
    if let Hold::Refused(m) = hold {
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
            &now,
        );
        let c = d.conditions.as_ref().unwrap();
        let deferred = c.iter().find(|c| c.type_ == "RolloutDeferred").unwrap();
        assert_eq!(deferred.status, "True");
        assert!(deferred.message.as_deref().unwrap().contains("busy"));
        assert!(!c.iter().any(|c| c.type_ == "RolloutHalted"));
        let go = with_hold(ShimStatus::default(), &Hold::Go, Some(&d), &now);
        let c = go.conditions.as_ref().unwrap();
        assert_eq!(
            c.iter()
                .find(|c| c.type_ == "RolloutDeferred")
                .unwrap()
                .status,
            "False"
        );
        // never deferred: no condition at all
        let plain = with_hold(ShimStatus::default(), &Hold::Go, None, &now);
        assert!(plain.conditions.unwrap_or_default().is_empty());
    }
}
