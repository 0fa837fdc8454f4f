use super::*;
use std::collections::BTreeMap;

pub(crate) fn shim(yaml_rollout: &str) -> Shim {
    let y = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, generation: 3}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n{yaml_rollout}",
        "a".repeat(64)
    );
    crate::api::load::parse_shims(&y, "t.yaml")
        .unwrap()
        .remove(0)
}

pub(crate) fn slot(index: u32, holder: Option<&str>) -> Slot {
    Slot {
        index,
        holder: holder.map(str::to_string),
        resource_version: format!("rv{index}"),
        ..Slot::default()
    }
}

pub(crate) fn failed(mut s: Slot, generation: i64) -> Slot {
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
fn a_restarted_agent_adopts_its_own_slot_before_taking_another() {
    let mut mine = slot(4, Some("me"));
    mine.closed = Some("halted".into());
    let slots = vec![slot(0, None), mine];
    assert_eq!(claim("me", &slots, &[0], true), Claim::Adopt(4));
    assert_eq!(claim("you", &slots, &[0, 4], true), Claim::Take(vec![0]));
    let mut closed = slot(0, None);
    closed.closed = Some("budget".into());
    assert_eq!(claim("you", &[closed], &[0], true), Claim::Wait);
}

/// A claim a rival wins (a 409) moves on to the next free slot the list showed: the node's
/// watch from that list's version would never bring a slot nobody touched since.
#[test]
fn with_few_rivals_a_node_may_try_every_free_open_slot_in_its_own_order() {
    let mut closed = slot(1, None);
    closed.closed = Some("budget".into());
    let slots = vec![slot(0, None), closed, slot(2, Some("x")), slot(3, None)];
    assert_eq!(
        claim("me", &slots, &[3, 2, 1, 0], true),
        Claim::Take(vec![3, 0])
    );
    assert_eq!(
        claim("me", &slots, &[0, 1, 2, 3], true),
        Claim::Take(vec![0, 3])
    );
    assert_eq!(claim("me", &slots, &[0, 1, 2, 3], false), Claim::Wait);
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
    assert_eq!(claim("me", &slots, &[0, 2, 1], false), Claim::Take(vec![1]));
    assert_eq!(
        claim("me", &slots, &[0, 2, 1], true),
        Claim::Take(vec![1, 2])
    );
    // an unreserved slot only with few rivals, and never another's
    assert_eq!(claim("you", &slots, &[0, 2], true), Claim::Take(vec![2]));
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

#[test]
fn the_coordinator_and_the_nodes_judge_few_rivals_by_the_stamps_on_the_slots() {
    use crate::api::lease::{SLOT_COUNT, SLOT_TARGETED, ShimLease, ShimLeaseSpec};
    use kube::ResourceExt;
    let stamped = |count: Option<&str>, targeted: Option<&str>| {
        let mut l = ShimLease::new("s-slot-0", ShimLeaseSpec::default());
        if let Some(c) = count {
            l.annotations_mut().insert(SLOT_COUNT.into(), c.into());
        }
        if let Some(t) = targeted {
            l.annotations_mut().insert(SLOT_TARGETED.into(), t.into());
        }
        l
    };
    // N = 3 stamped on the one slot listed so far, 3 targeted: few, whatever was listed
    assert!(slots_have_few_rivals(&[stamped(Some("3"), Some("3"))]));
    // 5000 targeted, N = 250: many
    let big = [stamped(Some("250"), Some("5000")), stamped(None, None)];
    assert!(!slots_have_few_rivals(&big));
    // nothing stamped (or no slot yet): few
    assert!(slots_have_few_rivals(&[stamped(None, None)]));
    assert!(slots_have_few_rivals(&[]));
}
