use super::*;
use std::collections::BTreeMap;

fn shim(yaml_rollout: &str) -> Shim {
    let y = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, generation: 3}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n{yaml_rollout}",
        "a".repeat(64)
    );
    crate::api::load::parse_shims(&y, "t.yaml")
        .unwrap()
        .remove(0)
}

fn slot(index: u32, holder: Option<&str>) -> Slot {
    Slot {
        index,
        holder: holder.map(str::to_string),
        resource_version: format!("rv{index}"),
        ..Slot::default()
    }
}

fn failed(mut s: Slot, generation: i64) -> Slot {
    s.failed = Some(Failure {
        generation,
        resume: String::new(),
        reason: "VerifyFailed".into(),
    });
    s
}

#[test]
fn max_update_is_an_integer_or_a_percentage_rounded_down_at_least_one() {
    let l = |r: &str, t| limits(&shim(r), t);
    let rolling = |m: &str| {
        format!(
            "  rolloutStrategy: {{type: rolling, rolling: {{maxUpdate: {m}, maxFailures: 2}}}}\n"
        )
    };
    assert_eq!(
        l(&rolling("10"), 1000),
        Limits {
            slots: Some(10),
            max_failures: 2
        }
    );
    assert_eq!(l(&rolling("\"5%\""), 1000).slots, Some(50));
    assert_eq!(l(&rolling("\"5%\""), 5000).slots, Some(250));
    assert_eq!(
        l(&rolling("\"5%\""), 39).slots,
        Some(1),
        "rounded down, at least 1"
    );
    assert_eq!(l(&rolling("\"50%\""), 3).slots, Some(1));
    assert_eq!(l(&rolling("\"100%\""), 7).slots, Some(7));
    assert_eq!(l(&rolling("\"5%\""), 0).slots, Some(1));
    assert_eq!(
        l("  rolloutStrategy: {type: recreate}\n", 1000),
        Limits {
            slots: None,
            max_failures: 0
        }
    );
    assert_eq!(
        l("", 1000),
        Limits {
            slots: Some(1),
            max_failures: 0
        },
        "the default"
    );
}

#[test]
fn slot_names_round_trip() {
    assert_eq!(slot_name("spin-v1", 7), "spin-v1-slot-7");
    assert_eq!(slot_index("spin-v1", "spin-v1-slot-7"), Some(7));
    assert_eq!(slot_index("spin", "spin-v1-slot-7"), None);
    assert_eq!(slot_index("spin-v1", "spin-v1-slot-x"), None);
}

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
fn failures_count_for_the_current_generation_since_the_last_resume() {
    let l = Limits {
        slots: Some(3),
        max_failures: 1,
    };
    let slots = vec![failed(slot(0, Some("a")), 3), failed(slot(1, Some("b")), 3)];
    assert!(halted(&slots, l, 3, ""), "two failures > maxFailures 1");
    assert!(!halted(&slots, l, 4, ""), "a new generation reopens");
    assert!(!halted(&slots, l, 3, "resume-1"), "a resume reopens");
    assert!(!halted(&slots[..1], l, 3, ""), "one failure is tolerated");
    let freed = vec![failed(slot(0, None), 3), failed(slot(1, None), 3)];
    assert!(
        !halted(&freed, l, 3, ""),
        "a freed slot's old mark does not count"
    );
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
fn waiting_nodes_spread_over_candidates_and_skip_failed_slots() {
    let none = BTreeSet::new();
    let mut first = BTreeMap::<u32, u32>::new();
    for n in 0..1000 {
        let c = candidates(&format!("uid-{n}"), "spin", 10, 2, &none);
        assert_eq!(c.len(), 2);
        assert_ne!(c[0], c[1]);
        *first.entry(c[0]).or_default() += 1;
    }
    assert_eq!(first.len(), 10, "every slot is someone's first choice");
    assert!(first.values().all(|v| (50..=150).contains(v)), "{first:?}");
    let skip: BTreeSet<u32> = [3, 4].into();
    let c = candidates("uid-1", "spin", 5, 5, &skip);
    assert_eq!(c.len(), 3);
    assert!(c.iter().all(|i| !skip.contains(i)));
    // the same node always watches the same slots
    assert_eq!(
        candidates("uid-9", "spin", 10, 2, &none),
        candidates("uid-9", "spin", 10, 2, &none)
    );
}

#[test]
fn claim_delays_are_drawn_anew_for_every_version_of_the_slot() {
    let w = Duration::from_millis(200);
    let d = |uid: &str, seen: &str| claim_delay(uid, "spin", seen, w);
    assert!((0..100).all(|i| d(&format!("uid-{i}"), "7") < w));
    // the same node, the same free slot: the same delay (a re-read does not re-draw)
    assert_eq!(d("uid-9", "7"), d("uid-9", "7"));
    // 50 nodes over 20 hand-offs: which node claims first changes from hand-off to hand-off,
    // so no node is always last (a delay fixed per node made the late ones wait every time)
    let firsts: BTreeSet<usize> = (0..20)
        .map(|v| {
            (0..50)
                .min_by_key(|i| d(&format!("uid-{i}"), &v.to_string()))
                .unwrap()
        })
        .collect();
    assert!(firsts.len() > 10, "{firsts:?}");
    // and the first claim comes early in the window: the least of 50 draws
    let mean_first = (0..20)
        .map(|v| {
            (0..50)
                .map(|i| d(&format!("uid-{i}"), &v.to_string()))
                .min()
                .unwrap()
        })
        .sum::<Duration>()
        / 20;
    assert!(mean_first < w / 10, "{mean_first:?}");
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

#[test]
fn a_restarted_agent_adopts_its_own_slot_before_taking_another() {
    let mut mine = slot(4, Some("me"));
    mine.closed = Some("halted".into());
    let slots = vec![slot(0, None), mine];
    assert_eq!(claim("me", &slots, &[0], true), Claim::Adopt(4));
    assert_eq!(claim("you", &slots, &[0, 4], true), Claim::Take(0));
    let mut closed = slot(0, None);
    closed.closed = Some("budget".into());
    assert_eq!(claim("you", &[closed], &[0], true), Claim::Wait);
}

#[test]
fn a_node_takes_the_slot_reserved_for_it_and_never_one_reserved_for_another() {
    let reserved = |i, holder, r: &str| {
        let mut s = slot(i, holder);
        s.reserved = Some(r.into());
        s
    };
    let slots = vec![
        reserved(0, None, "other"),
        reserved(1, None, "me"),
        slot(2, None),
    ];
    // its own reservation first, whatever its rendezvous order
    assert_eq!(claim("me", &slots, &[0, 2, 1], false), Claim::Take(1));
    // an unreserved slot only with few rivals, and never another's
    assert_eq!(claim("you", &slots, &[0, 2], true), Claim::Take(2));
    assert_eq!(claim("you", &slots, &[0, 2], false), Claim::Wait);
    assert_eq!(claim("you", &slots[..1], &[0], true), Claim::Wait);
    // reserved for it but still held: wait for the release
    assert_eq!(
        claim("me", &[reserved(1, Some("x"), "me")], &[1], true),
        Claim::Wait
    );
}

#[test]
fn a_shim_created_again_under_its_name_does_not_inherit_the_old_ones_slots() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let mut now = shim("");
    now.metadata.uid = Some("uid-new".into());
    let lease = |owner_uid: Option<&str>| {
        let mut l = ShimLease::new(&slot_name("s", 0), Default::default());
        l.metadata.labels = Some([(SLOT_SHIM_LABEL.to_string(), "s".to_string())].into());
        l.metadata.owner_references = owner_uid.map(|u| {
            vec![OwnerReference {
                api_version: "containerd.x-k8s.io/v1alpha1".into(),
                kind: "Shim".into(),
                name: "s".into(),
                uid: u.into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]
        });
        l.spec.holder_identity = Some("node-a".into());
        l
    };
    // the deleted Shim's slot, not yet collected: not this Shim's
    assert_eq!(slot_of(&now, &lease(Some("uid-old"))), None);
    let ours = slot_of(&now, &lease(Some("uid-new"))).expect("its own slot");
    assert_eq!((ours.index, ours.holder.as_deref()), (0, Some("node-a")));
    // a Lease without a Shim owner: the garbage collector stripped a gone Shim's reference
    // and kept the Lease for its holder's Node; it is no slot of the Shim created again
    assert_eq!(slot_of(&now, &lease(None)), None);
    // another Shim's label: never
    let mut other = shim("");
    other.metadata.name = Some("t".into());
    assert_eq!(slot_of(&other, &lease(Some("uid-new"))), None);
}
