//! A Shim's status, pure: counts and Cluster-API-style conditions from the Nodes' labels and
//! `shim-state` annotations. Only the coordinator writes it (docs/design.md §6).
//!
//! - `targeted`: nodes the Shim selects; `installed`: targeted nodes with the label (they
//!   serve the handler) whose report does not say installing, awaiting verification or
//!   failed (a label set in advance under the startup taint); `updating`: nodes with an install, upgrade, verification or
//!   uninstall under way; `failed`: nodes whose last attempt at the current generation failed.
//! - `Ready`: every targeted node serves the handler and the RuntimeClass is the Shim's.
//! - `Progressing`: some node still has work to do. `Degraded`: some node failed.
//! - `RolloutHalted`: failures holding slots exceed maxFailures ([`with_rollout`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::api::names::{condition, node_label, reason};
use crate::api::{Condition, NodeCounts, RolloutStatus, Shim, ShimStatus};
use crate::cluster::nodestate::{NodePhase, NodeStates};
use crate::cluster::slots::{Limits, RESUME_ANNOTATION, Slot};
use crate::cluster::target::targets;
use crate::hooks::hold::Hold;

/// Most node names quoted in a condition message.
const MAX_NODES_IN_MESSAGE: usize = 5;
/// Longest condition reason (a node's annotation may name any reason).
const REASON_MAX_BYTES: usize = 128;

/// What the coordinator knows of one Node.
#[derive(Debug, Clone, Default)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub states: NodeStates,
}

/// Counts and conditions for `shim`. `rc_problem` is a reason and message when the
/// RuntimeClass cannot be the Shim's (taken by another owner). Conditions keep their
/// `lastTransitionTime` from `previous` while their status does not change.
pub fn compute_status(
    shim: &Shim,
    nodes: &[NodeView],
    rc_problem: Option<(&str, String)>,
    previous: Option<&ShimStatus>,
    now: &Time,
) -> ShimStatus {
    let t = tally(shim, nodes);
    let deleting = shim.metadata.deletion_timestamp.is_some();
    let progress = format!(
        "{}/{} nodes serve the handler",
        t.counts.installed, t.counts.targeted
    );
    let mut ready = ready(&t.counts, deleting, rc_problem, &progress);
    if !t.insecure.is_empty() {
        let note = format!(
            "; fetched from a registry host whose certificate was not verified (skip_verify in containerd's hosts.toml) on {}",
            list(&t.insecure)
        );
        ready.message = Some(ready.message.unwrap_or_default() + &note);
    }
    // what the nodes verified of the signature, once each (at most two different reports)
    for signed in t.signed.iter().take(2) {
        ready.message = Some(format!("{}; {signed}", ready.message.unwrap_or_default()));
    }
    let mut conds = vec![
        ready,
        progressing(&t, deleting, &progress),
        degraded(&t.failures),
    ];
    for c in &mut conds {
        carry_transition_time(c, previous, now);
    }
    ShimStatus {
        observed_generation: shim.metadata.generation,
        nodes: Some(t.counts),
        conditions: Some(conds),
        rollout: None,
        approved_generation: None,
        refused_generation: None,
    }
}

/// The nodes counted for a Shim, with the failed ones (node, reason, message) and those
/// whose uninstall pods block.
struct Tally<'a> {
    counts: NodeCounts,
    failures: Vec<(&'a str, &'a str, &'a str)>,
    blocked: Vec<&'a str>,
    /// Nodes whose artifact came from a host whose certificate was not verified.
    insecure: Vec<&'a str>,
    /// The nodes' reports of the verified signature, each once.
    signed: Vec<&'a str>,
}

fn tally<'a>(shim: &Shim, nodes: &'a [NodeView]) -> Tally<'a> {
    let name = shim.name();
    let label = node_label(name);
    let mut t = Tally {
        counts: NodeCounts::default(),
        failures: Vec::new(),
        blocked: Vec::new(),
        insecure: Vec::new(),
        signed: Vec::new(),
    };
    let current = |g: Option<i64>| g.is_none() || g == shim.metadata.generation;
    for n in nodes {
        if targets(shim, &n.labels) {
            t.counts.targeted += 1;
            // the label, unless the node's own report says it does not serve the handler yet:
            // a label a node provisioner set in advance (kept under the startup taint) is no
            // install
            let reported = n.states.get(name).is_none_or(|s| {
                !matches!(
                    s.phase,
                    NodePhase::Installing | NodePhase::PendingVerification | NodePhase::Failed
                )
            });
            if n.labels.get(&label).map(String::as_str) == Some("true") && reported {
                t.counts.installed += 1;
            }
        }
        let Some(s) = n.states.get(name) else {
            continue;
        };
        if s.insecure_source.is_some() {
            t.insecure.push(&n.name);
        }
        if let Some(signed) = s.signed.as_deref()
            && !t.signed.contains(&signed)
        {
            t.signed.push(signed);
        }
        match s.phase {
            NodePhase::Failed if current(s.generation) => {
                t.counts.failed += 1;
                t.failures.push((
                    &n.name,
                    s.reason.as_deref().unwrap_or(reason::FAILED),
                    s.message.as_deref().unwrap_or(""),
                ));
            }
            NodePhase::Blocked => {
                t.counts.updating += 1;
                t.blocked.push(&n.name);
            }
            NodePhase::Installing
            | NodePhase::Upgrading
            | NodePhase::PendingVerification
            | NodePhase::Uninstalling => t.counts.updating += 1,
            _ => {}
        }
    }
    t
}

/// `Ready`: every targeted node serves the handler and the RuntimeClass is the Shim's.
fn ready(
    counts: &NodeCounts,
    deleting: bool,
    rc_problem: Option<(&str, String)>,
    progress: &str,
) -> Condition {
    if deleting {
        cond_false(
            condition::READY,
            "Info",
            reason::DELETING,
            "the Shim is being removed from its nodes".into(),
        )
    } else if let Some((reason, msg)) = rc_problem {
        cond_false(condition::READY, "Error", reason, msg)
    } else if counts.targeted == 0 {
        cond_false(
            condition::READY,
            "Warning",
            reason::NO_TARGETED_NODES,
            "spec.nodeSelector matches no node (without a selector: every node that is not a control plane)".into(),
        )
    } else if counts.installed == counts.targeted && counts.failed == 0 {
        cond_true(
            condition::READY,
            reason::ALL_NODES_READY,
            progress.to_string(),
        )
    } else if counts.failed > 0 {
        cond_false(
            condition::READY,
            "Error",
            reason::NODES_FAILED,
            progress.to_string(),
        )
    } else {
        cond_false(
            condition::READY,
            "Info",
            reason::ROLLING_OUT,
            progress.to_string(),
        )
    }
}

/// `Progressing`: some node still has work to do.
fn progressing(t: &Tally<'_>, deleting: bool, progress: &str) -> Condition {
    let c = &t.counts;
    let busy = c.updating > 0 || (!deleting && c.installed + c.failed < c.targeted);
    if !busy {
        return cond_false(
            condition::PROGRESSING,
            "Info",
            reason::COMPLETE,
            progress.to_string(),
        );
    }
    let msg = if t.blocked.is_empty() {
        progress.to_string()
    } else {
        format!(
            "{progress}; uninstall blocked by pods on {}",
            list(&t.blocked)
        )
    };
    cond_true(condition::PROGRESSING, reason::ROLLING_OUT, msg)
}

/// `Degraded`: some node failed at the current generation (the first few named).
fn degraded(failures: &[(&str, &str, &str)]) -> Condition {
    let Some((_, reason, _)) = failures.first() else {
        return cond_false(
            condition::DEGRADED,
            "Info",
            reason::NO_FAILURES,
            "no node failed".into(),
        );
    };
    let detail: Vec<String> = failures
        .iter()
        .take(MAX_NODES_IN_MESSAGE)
        .map(|(n, r, m)| format!("{n}: {r}: {m}"))
        .collect();
    let more = failures.len().saturating_sub(MAX_NODES_IN_MESSAGE);
    let tail = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    let mut c = cond_true(
        condition::DEGRADED,
        reason,
        format!("{}{tail}", detail.join("; ")),
    );
    c.severity = Some("Error".into());
    c
}

/// Most failed nodes named in the rollout status.
const MAX_FAILED_NODES: usize = 20;

/// `status` with the rollout's slots and the `RolloutHalted` condition (its
/// `lastTransitionTime` kept from `previous` while its status does not change).
pub fn with_rollout(
    mut status: ShimStatus,
    limits: Limits,
    slots: &[Slot],
    halted: bool,
    previous: Option<&ShimStatus>,
    now: &Time,
) -> ShimStatus {
    let in_use = slots.iter().filter(|s| !s.is_free()).count() as i32;
    let failed: Vec<&str> = slots
        .iter()
        .filter(|s| !s.is_free() && s.failed.is_some())
        .filter_map(|s| s.holder.as_deref())
        .collect();
    let n = limits.slots.map(|n| n as i32);
    status.rollout = Some(RolloutStatus {
        slots: n,
        in_use,
        failed_nodes: failed
            .iter()
            .take(MAX_FAILED_NODES)
            .map(|s| s.to_string())
            .collect(),
        halted,
        summary: format!(
            "{in_use}/{}",
            n.map_or_else(|| "-".to_string(), |n| n.to_string())
        ),
    });
    let mut c = if halted {
        let mut c = cond_true(
            condition::ROLLOUT_HALTED,
            reason::TOO_MANY_FAILURES,
            format!(
                "{} failed node(s) exceed maxFailures {} ({}); no node takes a new slot; a new generation or the annotation {RESUME_ANNOTATION} resumes",
                failed.len(),
                limits.max_failures,
                list(&failed)
            ),
        );
        c.severity = Some("Error".into());
        c
    } else {
        cond_false(
            condition::ROLLOUT_HALTED,
            "Info",
            reason::WITHIN_FAILURE_BUDGET,
            format!(
                "{} failed node(s), maxFailures {}",
                failed.len(),
                limits.max_failures
            ),
        )
    };
    carry_transition_time(&mut c, previous, now);
    status.conditions.get_or_insert_with(Vec::new).push(c);
    status
}

/// `lastTransitionTime`: kept from the previous status while the condition's status stays,
/// `now` when it changes (or is new).
pub(crate) fn carry_transition_time(c: &mut Condition, previous: Option<&ShimStatus>, now: &Time) {
    let before = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|x| x.type_ == c.type_));
    c.last_transition_time = match before {
        Some(b) if b.status == c.status => b.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
}

fn list(names: &[&str]) -> String {
    let shown: Vec<&str> = names.iter().take(MAX_NODES_IN_MESSAGE).copied().collect();
    match names.len().saturating_sub(MAX_NODES_IN_MESSAGE) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    }
}

fn cond_true(type_: &str, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: "True".into(),
        severity: None,
        last_transition_time: None,
        reason: Some(crate::text::clip(reason, REASON_MAX_BYTES)),
        message: Some(crate::text::clip(&message, crate::text::MESSAGE_MAX_BYTES)),
    }
}

fn cond_false(type_: &str, severity: &str, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.into(),
        status: "False".into(),
        severity: Some(severity.into()),
        last_transition_time: None,
        reason: Some(crate::text::clip(reason, REASON_MAX_BYTES)),
        message: Some(crate::text::clip(&message, crate::text::MESSAGE_MAX_BYTES)),
    }
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
        carry_transition_time(&mut c, previous, now);
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
        Hold::Deferred(_, m) | Hold::Asking(_, Some(m)) => set(
            conds,
            cond(
                condition::ROLLOUT_DEFERRED,
                "True",
                reason::EXTENSION_DEFERRED,
                format!("a BeforeRollout extension defers the rollout: {m}"),
            ),
        ),
        // asked first: the condition stays as it was
        Hold::Asking(_, None) => {
            if let Some(c) = previous
                .and_then(|p| p.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == condition::ROLLOUT_DEFERRED))
            {
                conds.retain(|x| x.type_ != c.type_);
                conds.push(c.clone());
            }
        }
        // shown False once it was True; never added to a Shim no extension deferred
        _ if previous
            .and_then(|p| p.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == condition::ROLLOUT_DEFERRED)) =>
        {
            set(
                conds,
                cond(
                    condition::ROLLOUT_DEFERRED,
                    "False",
                    reason::NOT_DEFERRED,
                    "no extension defers the rollout".into(),
                ),
            )
        }
        _ => {}
    }
    status.refused_generation = previous.and_then(|p| p.refused_generation);
    if let Hold::Refused(m) = hold {
        status.refused_generation = Some(generation);
        let mut c = cond(
            condition::ROLLOUT_HALTED,
            "True",
            reason::EXTENSION_REFUSED,
            m.clone(),
        );
        c.severity = Some("Error".into());
        set(conds, c);
        if let Some(r) = status.rollout.as_mut() {
            r.halted = true;
        }
    }
    status
}

#[cfg(test)]
mod hold_tests {
    use super::*;
    use crate::hooks::hold::{Hold, persisted};
    use tokio::time::Instant;

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
            &Hold::Asking(Instant::now(), None),
            None,
            1,
            Some(&deferred),
            &now,
        );
        assert_eq!(asking.conditions, deferred.conditions);
        let fresh = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now(), None),
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
            &Hold::Asking(Instant::now(), None),
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
    fn asked_again_after_a_deferral_the_rollout_is_shown_deferred_though_it_was_not_written() {
        // the deferral's own status write was throttled; when the write is due the extensions
        // are being asked again: the status still says deferred, with the last message
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let asking = with_hold(
            ShimStatus::default(),
            &Hold::Asking(Instant::now(), Some("busy".into())),
            None,
            1,
            None,
            &now,
        );
        let c = asking.conditions.unwrap_or_default();
        let deferred = c.iter().find(|c| c.type_ == "RolloutDeferred");
        assert_eq!(deferred.map(|c| c.status.as_str()), Some("True"), "{c:?}");
        assert!(
            deferred
                .and_then(|c| c.message.as_deref())
                .is_some_and(|m| m.contains("busy"))
        );
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
            &Hold::Asking(Instant::now(), None),
            None,
            4,
            Some(&refused),
            &now,
        );
        assert_eq!(later.refused_generation, Some(3));
    }
}
