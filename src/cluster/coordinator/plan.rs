//! The coordinator's decision for one Shim, pure (docs/design.md §6): from the Shim, the Nodes'
//! reports, its RuntimeClass as it is, the rollout hold and the clock, what to write
//! ([`ShimActions`]). The executor ([`super::shim_writes`]) only carries it out.
//!
//! Two paths, as kube's finalizer helper has them: **apply** (the Shim lives: the finalizer
//! in, the RuntimeClass applied as soon as the Shim exists, its nodeSelector on the Shim's
//! node label keeping pods away until a node serves the handler, status) and **cleanup** (the
//! Shim is being deleted: the RuntimeClass it owns deleted, status, and the finalizer out once
//! every node is clean and the RuntimeClass gone).

use std::time::Duration;

use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use tokio::time::Instant;

use super::class::{runtime_class, same_class};
use super::status::{NodeView, compute_status, with_hold};
use crate::api::names::{FINALIZER, node_label};
use crate::api::{Shim, ShimStatus};
use crate::hooks::hold::Hold;

/// What the coordinator knows when it decides about one Shim.
pub struct ShimFacts<'a> {
    pub shim: &'a Shim,
    pub nodes: &'a [NodeView],
    /// The RuntimeClass named by the Shim, as the coordinator's watch has it.
    pub runtime_class: Option<&'a RuntimeClass>,
    /// The other live Shims that name the same RuntimeClass
    /// ([`rivals_for_class`](super::class::rivals_for_class)).
    pub rivals: &'a [String],
    /// The status the rollout part (slots, halts) adds to the node-derived one.
    pub with_rollout: &'a dyn Fn(ShimStatus) -> ShimStatus,
    /// The BeforeRollout hold of this generation, and the generation approved now.
    pub hold: &'a Hold,
    pub approved: Option<i64>,
    /// When this Shim's status was last written, and the least time between two writes.
    pub last_status_write: Option<Instant>,
    pub status_interval: Duration,
    pub now: Instant,
    pub time: &'a Time,
}

/// What to do with the Shim's RuntimeClass.
#[derive(Debug, Clone, PartialEq)]
pub enum ClassAction {
    Keep,
    /// Server-side apply this one.
    Apply(Box<RuntimeClass>),
    /// Delete it: the Shim is going, or its handler changed (the handler is immutable: the
    /// next round applies the new one).
    Delete,
}

/// What to do with the Shim's status.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusAction {
    Keep,
    Write(Box<ShimStatus>),
    /// Changed, but written less than the interval ago: look again then.
    Later(Instant),
}

/// The coordinator's writes for one Shim, in the order the executor makes them.
#[derive(Debug, Clone, PartialEq)]
pub struct ShimActions {
    pub add_finalizer: bool,
    pub runtime_class: ClassAction,
    pub status: StatusAction,
    pub remove_finalizer: bool,
    /// When to look at the Shim again (a deferral, a throttled status), if nothing else
    /// changes before.
    pub due: Option<Instant>,
}

/// The Shim's actions: the cleanup path while it is being deleted, else the apply path.
pub fn plan_shim(f: &ShimFacts<'_>) -> ShimActions {
    if f.shim.metadata.deletion_timestamp.is_some() {
        plan_cleanup(f)
    } else {
        plan_apply(f)
    }
}

/// Whether the existing RuntimeClass is the Shim's: `None` when there is none.
fn ours(f: &ShimFacts<'_>) -> Option<bool> {
    let uid = f.shim.uid().unwrap_or_default();
    f.runtime_class
        .map(|rc| rc.owner_references().iter().any(|o| o.uid == uid))
}

fn plan_apply(f: &ShimFacts<'_>) -> ShimActions {
    let rc_name = &f.shim.spec.runtime_class.name;
    let conflict = match ours(f) {
        Some(false) => Some((
            crate::api::names::reason::RUNTIME_CLASS_CONFLICT,
            format!(
                "RuntimeClass {rc_name:?} already exists and does not belong to this Shim; delete it or set another spec.runtimeClass.name"
            ),
        )),
        None if !f.rivals.is_empty() => Some((
            crate::api::names::reason::RUNTIME_CLASS_CONFLICT,
            format!(
                "RuntimeClass {rc_name:?} is named by Shim {} too, and a RuntimeClass belongs to one Shim; set another spec.runtimeClass.name",
                crate::text::clip(&f.rivals.join(", "), 512)
            ),
        )),
        _ => None,
    };
    // Applied before any node serves the handler: its nodeSelector keeps pods on the nodes
    // that do, and a pod of the class waits Pending, where an autoscaler sees it, rather
    // than being refused at admission for want of a RuntimeClass.
    let runtime_class = if conflict.is_some() {
        ClassAction::Keep
    } else {
        let desired = runtime_class(f.shim);
        match f.runtime_class {
            Some(rc) if rc.handler != desired.handler => ClassAction::Delete,
            Some(rc) if same_class(rc, &desired) => ClassAction::Keep,
            _ => ClassAction::Apply(Box::new(desired)),
        }
    };
    let (status, due) = plan_status(f, conflict);
    ShimActions {
        add_finalizer: !f.shim.finalizers().iter().any(|x| x == FINALIZER),
        runtime_class,
        status,
        remove_finalizer: false,
        due,
    }
}

fn plan_cleanup(f: &ShimFacts<'_>) -> ShimActions {
    let name = f.shim.name_any();
    let label = node_label(&name);
    let ours = ours(f);
    let clean = f
        .nodes
        .iter()
        .all(|n| !n.labels.contains_key(&label) && !n.states.contains_key(&name));
    let has_finalizer = f.shim.finalizers().iter().any(|x| x == FINALIZER);
    let (status, due) = plan_status(f, None);
    ShimActions {
        add_finalizer: false,
        runtime_class: if ours == Some(true) {
            ClassAction::Delete
        } else {
            ClassAction::Keep
        },
        status,
        remove_finalizer: has_finalizer && clean && ours != Some(true),
        due,
    }
}

/// The status the Shim should have, written now or later (throttled).
fn plan_status(
    f: &ShimFacts<'_>,
    rc_problem: Option<(&str, String)>,
) -> (StatusAction, Option<Instant>) {
    let previous = f.shim.status.as_ref();
    let base = compute_status(f.shim, f.nodes, rc_problem, previous, f.time);
    let status = with_hold(
        (f.with_rollout)(base),
        f.hold,
        f.approved,
        f.shim.metadata.generation.unwrap_or_default(),
        previous,
        f.time,
    );
    let due = f.hold.due();
    let since_write = f
        .last_status_write
        .map(|t| f.now.saturating_duration_since(t));
    if previous == Some(&status) {
        return (StatusAction::Keep, due);
    }
    if previous.is_some_and(|p| progress_only(p, &status)) {
        // progress within a step: written when the step is reached or a minute has passed
        let at = match (f.last_status_write, since_write) {
            (Some(t), Some(age)) if age < PROGRESS_AT_LEAST => t + PROGRESS_AT_LEAST,
            _ => return (StatusAction::Write(Box::new(status)), due),
        };
        return (StatusAction::Later(at), Some(due.map_or(at, |d| d.min(at))));
    }
    match f.last_status_write {
        Some(t) if since_write.is_some_and(|age| age < f.status_interval) => {
            let at = t + f.status_interval;
            (StatusAction::Later(at), Some(due.map_or(at, |d| d.min(at))))
        }
        _ => (StatusAction::Write(Box::new(status)), due),
    }
}

/// Status writes per rollout: a rollout's progress is written at each step of this share of
/// the targeted nodes (20 %), and at least once a minute while it moves, so a rollout costs
/// every watching agent a handful of status events, and one a minute, however many nodes it
/// has.
const PROGRESS_STEPS: i32 = 5;

/// Progress within a step is written once it is this old.
const PROGRESS_AT_LEAST: Duration = Duration::from_secs(60);

/// Whether `new` differs from `previous` (the status as written) only by a rollout's
/// progress that has not yet gone a step further: the counts of installed and updating nodes,
/// the slots in use, and the condition messages that say them. Anything else that changes
/// (a condition's status or reason, a failure, a halt, a generation, the targets) and the
/// rollout's end are written at once.
pub fn progress_only(previous: &ShimStatus, new: &ShimStatus) -> bool {
    let counts = |s: &ShimStatus| s.nodes.clone().unwrap_or_default();
    let (was, now) = (counts(previous), counts(new));
    let step = now.targeted / PROGRESS_STEPS;
    if step < 2 {
        return false; // a small fleet: every change is written
    }
    let done = now.installed + now.failed >= now.targeted;
    let stepped = now.installed / step != was.installed / step;
    !done && !stepped && essentials(previous) == essentials(new)
}

/// A status without what a rollout's progress changes.
fn essentials(s: &ShimStatus) -> ShimStatus {
    let mut e = s.clone();
    if let Some(n) = e.nodes.as_mut() {
        n.installed = 0;
        n.updating = 0;
    }
    if let Some(r) = e.rollout.as_mut() {
        r.in_use = 0;
        r.summary.clear();
    }
    for c in e.conditions.iter_mut().flatten() {
        c.message = None;
        c.last_transition_time = None;
    }
    e
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn shim(extra_meta: &str) -> Shim {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, uid: u1, generation: 1{extra_meta}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: rc-s, handler: h}}\n",
            "a".repeat(64)
        );
        crate::api::load::parse_shims(&y, "t.yaml")
            .unwrap()
            .remove(0)
    }

    fn node(labelled: bool, state: bool) -> NodeView {
        let mut v = NodeView {
            name: "n".into(),
            labels: BTreeMap::new(),
            states: BTreeMap::new(),
        };
        if labelled {
            v.labels.insert(node_label("s"), "true".into());
        }
        if state {
            let st: crate::cluster::nodestate::ShimNodeState =
                serde_json::from_value(serde_json::json!({"phase": "Uninstalling", "since": "t"}))
                    .unwrap();
            v.states.insert("s".into(), st);
        }
        v
    }

    fn plan(
        s: &Shim,
        nodes: &[NodeView],
        rc: Option<&RuntimeClass>,
        last: Option<Instant>,
    ) -> ShimActions {
        let time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let keep = |st: ShimStatus| st;
        plan_shim(&ShimFacts {
            shim: s,
            nodes,
            runtime_class: rc,
            rivals: &[],
            with_rollout: &keep,
            hold: &Hold::Go,
            approved: None,
            last_status_write: last,
            status_interval: Duration::from_secs(2),
            now: Instant::now(),
            time: &time,
        })
    }

    #[test]
    fn a_new_shim_gets_its_finalizer_and_its_class_before_any_node_serves_it() {
        let s = shim("");
        let a = plan(&s, &[node(false, false)], None, None);
        assert!(a.add_finalizer);
        assert!(matches!(a.status, StatusAction::Write(_)));
        let ClassAction::Apply(rc) = a.runtime_class else {
            panic!("{a:?}")
        };
        assert_eq!(rc.handler, "h");
        assert_eq!(rc.metadata.name.as_deref(), Some("rc-s"));
        // the same class again: nothing to do; another handler: delete, then apply again
        let again = plan(&s, &[node(true, false)], Some(&rc), None);
        assert_eq!(again.runtime_class, ClassAction::Keep);
        let mut old = (*rc).clone();
        old.handler = "old".into();
        let swap = plan(&s, &[node(true, false)], Some(&old), None);
        assert_eq!(swap.runtime_class, ClassAction::Delete);
    }

    #[test]
    fn someone_elses_class_is_left_alone_and_reported() {
        let s = shim("");
        let mut theirs = runtime_class(&s);
        theirs.metadata.owner_references = None;
        let a = plan(&s, &[node(true, false)], Some(&theirs), None);
        assert_eq!(a.runtime_class, ClassAction::Keep);
        let StatusAction::Write(st) = a.status else {
            panic!("{a:?}")
        };
        let ready = st
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.reason.as_deref(), Some("RuntimeClassConflict"));
    }

    #[test]
    fn a_status_written_a_moment_ago_waits_its_interval() {
        let s = shim("");
        let a = plan(&s, &[node(false, false)], None, Some(Instant::now()));
        let StatusAction::Later(at) = a.status else {
            panic!("{a:?}")
        };
        assert_eq!(a.due, Some(at));
    }

    #[test]
    fn cleanup_deletes_our_class_then_drops_the_finalizer_once_every_node_is_clean() {
        let s = shim(
            ", deletionTimestamp: '2026-01-01T00:00:00Z', finalizers: ['containerd.x-k8s.io/cleanup']",
        );
        let rc = runtime_class(&s);
        let a = plan(&s, &[node(false, false)], Some(&rc), None);
        assert_eq!(a.runtime_class, ClassAction::Delete);
        assert!(!a.remove_finalizer, "the class first");
        assert!(!a.add_finalizer);
        let a = plan(&s, &[node(false, true)], None, None);
        assert!(!a.remove_finalizer, "a node still reports it");
        let a = plan(&s, &[node(false, false)], None, None);
        assert!(a.remove_finalizer);
        assert_eq!(a.runtime_class, ClassAction::Keep);
    }

    fn progress(targeted: i32, installed: i32, updating: i32, reason: &str) -> ShimStatus {
        ShimStatus {
            nodes: Some(crate::api::NodeCounts {
                targeted,
                installed,
                updating,
                failed: 0,
            }),
            conditions: Some(vec![crate::api::Condition {
                type_: "Progressing".into(),
                status: "True".into(),
                reason: Some(reason.into()),
                message: Some(format!("{installed} of {targeted} nodes")),
                ..serde_json::from_value(serde_json::json!({"type": "x", "status": "x"})).unwrap()
            }]),
            ..ShimStatus::default()
        }
    }

    #[test]
    fn a_big_rollouts_progress_is_written_every_fifth_and_anything_else_at_once() {
        let was = progress(1000, 100, 10, "RollingOut");
        // 1000 nodes: a step is 200 nodes
        assert!(progress_only(&was, &progress(1000, 150, 10, "RollingOut")));
        assert!(progress_only(&was, &progress(1000, 199, 7, "RollingOut")));
        assert!(!progress_only(&was, &progress(1000, 200, 10, "RollingOut")));
        assert!(
            !progress_only(&was, &progress(1000, 110, 10, "Halted")),
            "a reason"
        );
        assert!(
            !progress_only(&was, &progress(1001, 110, 10, "RollingOut")),
            "the targets"
        );
        assert!(
            !progress_only(
                &progress(1000, 999, 1, "RollingOut"),
                &progress(1000, 1000, 0, "RollingOut")
            ),
            "the end"
        );
        // fewer than 10 nodes: every change
        assert!(!progress_only(
            &progress(9, 4, 1, "RollingOut"),
            &progress(9, 5, 0, "RollingOut")
        ));
        assert!(progress_only(
            &progress(10, 4, 1, "RollingOut"),
            &progress(10, 5, 0, "RollingOut")
        ));
    }

    #[test]
    fn progress_within_a_step_is_written_once_a_minute() {
        let mut s = shim("");
        s.status = Some(progress(1000, 100, 10, "RollingOut"));
        let moved = |_: ShimStatus| progress(1000, 150, 10, "RollingOut");
        let time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let now = Instant::now();
        let at = |ago: u64| {
            plan_shim(&ShimFacts {
                shim: &s,
                nodes: &[],
                runtime_class: None,
                rivals: &[],
                with_rollout: &moved,
                hold: &Hold::Go,
                approved: None,
                last_status_write: Some(now - Duration::from_secs(ago)),
                status_interval: Duration::from_secs(2),
                now,
                time: &time,
            })
        };
        let soon = at(10);
        let StatusAction::Later(when) = soon.status else {
            panic!("{soon:?}")
        };
        assert_eq!(
            when,
            now + Duration::from_secs(50),
            "a minute after the last write"
        );
        assert_eq!(soon.due, Some(when));
        assert!(
            matches!(at(60).status, StatusAction::Write(_)),
            "a minute on"
        );
    }

    #[test]
    fn shims_naming_one_class_that_does_not_exist_all_report_the_conflict_and_none_applies_it() {
        let named = |name: &str, extra: &str| {
            let mut s = shim(extra);
            s.metadata.name = Some(name.into());
            s
        };
        let (a, b) = (named("a", ""), named("b", ""));
        let going = named("c", ", deletionTimestamp: '2026-01-02T00:00:00Z'");
        let mut other = named("d", "");
        other.spec.runtime_class.name = "rc-d".into();
        let rivals = super::super::class::rivals_for_class(&[&a, &b, &going, &other]);
        // a Shim being deleted names nothing any more; a Shim alone with its class has none
        assert_eq!(rivals.get("a").cloned(), Some(vec!["b".to_string()]));
        assert_eq!(rivals.get("b").cloned(), Some(vec!["a".to_string()]));
        assert_eq!(rivals.get("c"), None);
        assert_eq!(rivals.get("d"), None);
        let time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let keep = |st: ShimStatus| st;
        let facts = |s, rivals, rc| ShimFacts {
            shim: s,
            nodes: &[],
            runtime_class: rc,
            rivals,
            with_rollout: &keep,
            hold: &Hold::Go,
            approved: None,
            last_status_write: None,
            status_interval: Duration::from_secs(2),
            now: Instant::now(),
            time: &time,
        };
        let b_rivals = ["b".to_string()];
        let held = plan_shim(&facts(&a, &b_rivals, None));
        assert_eq!(held.runtime_class, ClassAction::Keep);
        let StatusAction::Write(st) = held.status else {
            panic!("{held:?}")
        };
        let said = format!("{st:?}");
        assert!(
            said.contains("RuntimeClassConflict") && said.contains("named by Shim b"),
            "{said}"
        );
        // the class exists and is a's: a keeps it, whoever else names it
        let ClassAction::Apply(rc) = plan_shim(&facts(&a, &[], None)).runtime_class else {
            panic!("a alone applies its class")
        };
        assert!(rc.owner_references().iter().any(|o| o.uid == "u1"));
        let kept = plan_shim(&facts(&a, &b_rivals, Some(&rc)));
        assert_eq!(kept.runtime_class, ClassAction::Keep);
        assert!(!format!("{:?}", kept.status).contains("RuntimeClassConflict"));
    }
}
