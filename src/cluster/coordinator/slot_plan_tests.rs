use super::*;
use crate::cluster::nodestate::NodePhase;
use crate::cluster::slots::halted;
use crate::cluster::slots::tests::{failed, slot};

fn lim(n: u32) -> Limits {
    Limits {
        slots: Some(n),
        max_failures: 0,
    }
}

/// Apply `actions` to `slots` as the API server would (ignoring resourceVersions).
fn apply(slots: &mut Vec<Slot>, actions: &[SlotAction]) {
    for a in actions {
        match a {
            SlotAction::Create { index, closed } => {
                let mut s = slot(*index, None);
                s.closed = *closed;
                slots.push(s);
            }
            SlotAction::Delete { index, .. } => slots.retain(|s| s.index != *index),
            SlotAction::Mark { index, closed, .. } => {
                if let Some(s) = slots.iter_mut().find(|s| s.index == *index) {
                    s.closed = *closed;
                }
            }
            SlotAction::Stamp { .. } => {}
            SlotAction::Reserve { index, node, .. } => {
                if let Some(s) = slots.iter_mut().find(|s| s.index == *index) {
                    s.reserved = node.clone();
                }
            }
            SlotAction::Free { index, .. } => {
                if let Some(s) = slots.iter_mut().find(|s| s.index == *index) {
                    s.holder = None;
                    s.failed = None;
                }
            }
        }
    }
}

/// held + free open slots: the most nodes that can hold a slot at once from here on.
fn capacity(slots: &[Slot]) -> usize {
    slots.iter().filter(|s| !s.is_free() || s.is_open()).count()
}

#[test]
fn the_coordinator_creates_n_open_slots_then_keeps_them() {
    let mut slots = vec![];
    let a = plan_slots(lim(3), false, &slots, |_| false);
    assert_eq!(a.len(), 3);
    apply(&mut slots, &a);
    assert!(slots.iter().all(Slot::is_open));
    assert!(
        plan_slots(lim(3), false, &slots, |_| false).is_empty(),
        "steady"
    );
}

#[test]
fn shrinking_never_leaves_room_for_more_than_the_new_bound() {
    // five nodes hold the five slots of N = 5; N becomes 2
    let mut slots: Vec<Slot> = (0..5).map(|i| slot(i, Some(&format!("n{i}")))).collect();
    let a = plan_slots(lim(2), false, &slots, |_| false);
    apply(&mut slots, &a);
    let retired: Vec<u32> = slots
        .iter()
        .filter(|s| s.closed.as_deref() == Some("retired"))
        .map(|s| s.index)
        .collect();
    assert_eq!(retired, [2, 3, 4]);
    assert!(
        slots[..2]
            .iter()
            .all(|s| s.closed.as_deref() == Some("budget")),
        "held slots below the bound close too while 5 > 2 hold: {slots:?}"
    );
    // holders finish one by one; no free slot may open until fewer than 2 are held
    for done in 0..5u32 {
        slots.iter_mut().find(|s| s.index == done).unwrap().holder = None;
        let a = plan_slots(lim(2), false, &slots, |_| false);
        apply(&mut slots, &a);
        let held = slots.iter().filter(|s| !s.is_free()).count();
        let free_open = slots.iter().filter(|s| s.is_free() && s.is_open()).count();
        assert!(
            free_open <= 2usize.saturating_sub(held),
            "after {done}: {slots:?}"
        );
        assert!(
            slots.iter().all(|s| s.index < 2 || !s.is_free()),
            "free retired slots are deleted"
        );
    }
    assert_eq!(slots.len(), 2);
    assert_eq!(capacity(&slots), 2);
}

#[test]
fn growing_opens_new_slots_at_once() {
    let mut slots: Vec<Slot> = (0..2).map(|i| slot(i, Some("x"))).collect();
    let a = plan_slots(lim(4), false, &slots, |_| false);
    apply(&mut slots, &a);
    assert_eq!(slots.len(), 4);
    assert_eq!(capacity(&slots), 4);
}

#[test]
fn a_halt_closes_every_free_slot_and_nodes_mid_update_keep_theirs() {
    let mut slots = vec![
        failed(slot(0, Some("bad")), 3),
        slot(1, Some("busy")),
        slot(2, None),
    ];
    let l = lim(3);
    assert!(halted(&slots, l, 3, ""));
    let a = plan_slots(l, true, &slots, |_| false);
    apply(&mut slots, &a);
    assert_eq!(slots[2].closed.as_deref(), Some("halted"));
    assert_eq!(
        slots[1].holder.as_deref(),
        Some("busy"),
        "mid-update finishes"
    );
    assert_eq!(capacity(&slots), 2, "no new taker");
    // busy finishes: its slot is free now and gets closed too
    slots[1].holder = None;
    let a = plan_slots(l, true, &slots, |_| false);
    apply(&mut slots, &a);
    assert_eq!(capacity(&slots), 1, "only the failed node's slot");
}

#[test]
fn deleted_nodes_slots_are_freed_and_live_ones_never() {
    let slots = vec![slot(0, Some("gone")), failed(slot(1, Some("alive")), 3)];
    let a = plan_slots(lim(2), false, &slots, |s| {
        s.holder.as_deref() == Some("gone")
    });
    assert_eq!(
        a,
        [SlotAction::Free {
            index: 0,
            resource_version: "rv0".into()
        }]
    );
    let a = plan_slots(lim(2), false, &slots, |_| false);
    assert!(a.iter().all(|x| !matches!(x, SlotAction::Free { .. })));
}

#[test]
fn recreate_means_no_slots() {
    let slots = vec![slot(0, None), slot(1, Some("n"))];
    let l = Limits {
        slots: None,
        max_failures: 0,
    };
    let a = plan_slots(l, false, &slots, |_| false);
    assert!(a.contains(&SlotAction::Delete {
        index: 0,
        resource_version: "rv0".into()
    }));
    assert!(a.contains(&SlotAction::Mark {
        index: 1,
        closed: Some("retired".into()),
        resource_version: "rv1".into()
    }));
}

#[test]
fn the_coordinator_stamps_n_on_the_kept_slots_it_does_not_write_anyway() {
    let lim = |n| Limits {
        slots: Some(n),
        max_failures: 0,
    };
    let mut stamped = slot(0, Some("a"));
    stamped.count = Some(3);
    let slots = vec![stamped, slot(1, None), slot(2, Some("b")), slot(3, None)];
    let planned = plan_slots(lim(3), false, &slots, |_| false);
    let stamps = plan_stamps(lim(3), &slots, &planned, |_, _| false);
    let idx: Vec<u32> = stamps
        .iter()
        .map(|a| match a {
            SlotAction::Stamp { index, .. } => *index,
            other => panic!("{other:?}"),
        })
        .collect();
    // slot 0 shows N already; slot 3 is above N (deleted by the plan)
    assert_eq!(idx, vec![1, 2]);
    // N went from 3 to 2: slot 0 shows the old N and gets the new one
    let stamps = plan_stamps(
        lim(2),
        &slots,
        &plan_slots(lim(2), false, &slots, |_| false),
        |_, _| false,
    );
    assert!(
        stamps
            .iter()
            .any(|a| matches!(a, SlotAction::Stamp { index: 0, .. }))
    );
    // recreate: no slots kept, nothing stamped
    let none = Limits {
        slots: None,
        max_failures: 0,
    };
    assert!(plan_stamps(none, &slots, &[], |_, _| true).is_empty());
}

/// The order of the writes, the targeted stamp and orphaned slots, with slots of N = 6.
mod writes {
    use super::*;
    use crate::api::lease::ShimLease;
    use crate::cluster::slots::{Closed, slot_name};
    use kube::ResourceExt;

    fn slot(index: u32, holder: Option<&str>) -> Slot {
        Slot {
            index,
            holder: holder.map(str::to_string),
            resource_version: format!("rv{index}"),
            count: Some(6),
            ..Slot::default()
        }
    }

    #[test]
    fn a_shrink_deletes_and_closes_before_it_stamps_the_new_n() {
        // N 6 -> 2 with slot 0 held: slots 2..5 go (a delete each), slot 1 stays open
        let slots: Vec<Slot> = (0..6).map(|i| slot(i, (i == 0).then_some("a"))).collect();
        let limits = Limits {
            slots: Some(2),
            max_failures: 0,
        };
        let mut actions = plan_slots(limits, false, &slots, |_| false);
        actions.extend(plan_stamps(limits, &slots, &actions, |_, _| false));
        let (first, then): (Vec<_>, Vec<_>) = actions.into_iter().partition(narrows);
        assert_eq!(first.len(), 4, "{first:?}");
        assert!(first.iter().all(|a| matches!(a, SlotAction::Delete { .. })));
        assert_eq!(then.len(), 2, "the stamps of slots 0 and 1: {then:?}");
        assert!(then.iter().all(|a| matches!(a, SlotAction::Stamp { .. })));
        // a closing mark narrows, an opening one does not
        let mark = |closed| SlotAction::Mark {
            index: 0,
            closed,
            resource_version: "r".into(),
        };
        assert!(narrows(&mark(Some(Closed::Budget))));
        assert!(!narrows(&mark(None)));
    }

    #[test]
    fn the_targeted_stamp_follows_the_fleet_when_it_changes_who_may_take_an_unreserved_slot() {
        // slots made while the coordinator saw 3 nodes (N = 5: few rivals, any node takes a
        // free slot at once); the fleet is 5000 now: restamped, or 5000 nodes rush every free
        // slot
        let limits = Limits {
            slots: Some(5),
            max_failures: 0,
        };
        let stamped = |i, t| Slot {
            count: Some(5),
            targeted: Some(t),
            ..slot(i, None)
        };
        let stamps = |slots: &[Slot], targeted| {
            plan_stamps(limits, slots, &[], |n, s| retarget(n, s, targeted))
        };
        let few: Vec<Slot> = (0..5).map(|i| stamped(i, 3)).collect();
        let s = stamps(&few, 5000);
        assert_eq!(s.len(), 5, "{s:?}");
        assert!(s.iter().all(|a| matches!(a, SlotAction::Stamp { .. })));
        // the fleet changed without changing the verdict: no write
        let many: Vec<Slot> = (0..5).map(|i| stamped(i, 4000)).collect();
        assert!(stamps(&many, 5000).is_empty());
        assert!(stamps(&few, 4).is_empty());
        // and back: the fleet shrank to fit its slots
        assert_eq!(stamps(&many, 2).len(), 5);
    }

    #[test]
    fn a_lease_labelled_for_the_shim_that_no_shim_owns_is_an_orphan() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, uid: new}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n",
            "a".repeat(64)
        );
        let shim = crate::api::load::parse_shims(&y, "t.yaml")
            .unwrap()
            .remove(0);
        let lease = |label: &str, index: u32, owners: &[(&str, &str)]| {
            let mut l = ShimLease::new(&slot_name(label, index), Default::default());
            l.metadata.labels = Some(
                [(
                    crate::cluster::slots::SLOT_SHIM_LABEL.to_string(),
                    label.to_string(),
                )]
                .into(),
            );
            l.metadata.owner_references = Some(
                owners
                    .iter()
                    .map(|(kind, uid)| OwnerReference {
                        kind: kind.to_string(),
                        uid: uid.to_string(),
                        ..OwnerReference::default()
                    })
                    .collect(),
            );
            l
        };
        let leases = [
            lease("s", 0, &[("Shim", "new"), ("Node", "n1")]),
            // another UID: the garbage collector's (this coordinator's Shim may be stale)
            lease("s", 1, &[("Shim", "old"), ("Node", "n2")]),
            // the garbage collector took the gone Shim's reference, its holder's Node stayed
            lease("s", 2, &[("Node", "n3")]),
            lease("t", 0, &[("Node", "n4")]),
        ];
        let orphans: Vec<String> = orphan_slots(&shim, &leases)
            .iter()
            .map(|l| l.name_any())
            .collect();
        assert_eq!(orphans, vec![slot_name("s", 2)]);
    }
}

/// A Node labelled `labels` whose state shows the Shim `s` in `phase` since `since`.
fn node(name: &str, labels: &[(&str, &str)], phase: NodePhase, since: &str) -> NodeView {
    let state = crate::cluster::nodestate::ShimNodeState {
        phase,
        digest: None,
        reason: None,
        message: None,
        generation: None,
        version: None,
        insecure_source: None,
        signed: None,
        since: since.into(),
        retained: Vec::new(),
    };
    NodeView {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        states: [("s".to_string(), state)].into(),
    }
}

#[test]
fn the_nodes_waiting_for_a_slot_change_the_shim_and_held_none_just_now() {
    let shim = crate::cluster::slots::tests::shim("");
    let plane = [(crate::api::names::CONTROL_PLANE_LABEL, "")];
    let nodes = [
        node("installing", &[], NodePhase::Installing, "t1"),
        node("upgrading", &[], NodePhase::Upgrading, "t2"),
        // no longer targeted: its install is not a change the Shim wants
        node("untargeted", &plane, NodePhase::Installing, "t3"),
        // an uninstall waits wherever it runs
        node("leaving", &plane, NodePhase::Uninstalling, "t4"),
        node("installed", &[], NodePhase::Installed, "t5"),
        node("failed", &[], NodePhase::Failed, "t6"),
        // held a slot a moment ago: still shows its old phase
        node("just-done", &[], NodePhase::Installing, "t7"),
    ];
    let mut memory = Reservations::default();
    memory.observe(&[slot(0, Some("just-done"))], Instant::now());
    let waiting: Vec<(String, String)> = waiters(&shim, &nodes, &memory)
        .into_iter()
        .map(|w| (w.node, w.since))
        .collect();
    let names: Vec<(&str, &str)> = waiting
        .iter()
        .map(|(n, s)| (n.as_str(), s.as_str()))
        .collect();
    assert_eq!(
        names,
        [("installing", "t1"), ("upgrading", "t2"), ("leaving", "t4")]
    );
}

#[test]
fn a_rollout_with_few_rivals_keeps_nobody_waiting_and_one_with_many_does() {
    let shim = crate::cluster::slots::tests::shim("");
    let nodes: Vec<NodeView> = (0..4)
        .map(|i| node(&format!("n{i}"), &[], NodePhase::Installing, "t"))
        .collect();
    let now = Instant::now();
    // stamped when the Shim targeted `targeted` nodes, on its one slot
    let rollout = |targeted: u32| {
        let lease = crate::cluster::lease_edits::create(&shim, 0, None, Some(1), targeted);
        let slots = vec![(slot(0, Some("n0")), lease)];
        let mut memory = Reservations::default();
        rollout_of(&shim, &nodes, slots, [], &mut memory, now)
    };
    let few = rollout(2);
    assert_eq!(few.targeted, 4);
    assert_eq!(few.limits.slots, Some(1));
    assert!(!few.halted);
    assert!(few.waiting.is_empty(), "few rivals: nodes take free slots");
    let many = rollout(4);
    // n0 holds the slot; the others wait for it
    let waiting: Vec<String> = many.waiting.into_iter().map(|w| w.node).collect();
    assert_eq!(waiting, ["n1", "n2", "n3"]);
    assert!(many.expired.is_empty() && many.orphans.is_empty());
}
