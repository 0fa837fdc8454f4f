//! The agent's rollout rules as tables: one row per situation a node meets, what it saw and
//! what it must do. A change to a rule changes a row here.

use super::*;
use crate::cluster::slots::Failure;

const ME: &str = "node-a";

/// A slot of a fleet of `targeted` nodes with N = `count` (`None`: not stamped).
fn slot(index: u32, count: Option<u32>, targeted: Option<u32>) -> Slot {
    Slot {
        index,
        count,
        targeted,
        resource_version: format!("rv{index}"),
        ..Slot::default()
    }
}

/// The slots of a large fleet: 3 slots, 5000 nodes (many rivals, reservations rule).
fn large(index: u32) -> Slot {
    slot(index, Some(3), Some(5000))
}

/// The slots of a small cluster: 2 slots, 2 nodes (few rivals, free slots taken at once).
fn small(index: u32) -> Slot {
    slot(index, Some(2), Some(2))
}

fn held(mut s: Slot, by: &str) -> Slot {
    s.holder = Some(by.into());
    s
}

fn reserved(mut s: Slot, by: &str) -> Slot {
    s.reserved = Some(by.into());
    s
}

fn closed(mut s: Slot, why: Closed) -> Slot {
    s.closed = Some(why);
    s
}

fn failed(s: Slot) -> Slot {
    let mut s = held(s, "node-z");
    s.failed = Some(Failure {
        generation: 1,
        resume: String::new(),
        reason: "VerifyFailed".into(),
    });
    s
}

/// What a row expects of [`after_list`]: the claim, as its kind and the slots it names in
/// order (`Take` in rendezvous order: checked as a set, with the reserved one first).
#[derive(Debug)]
enum Next {
    Adopt(u32),
    Take {
        first: Option<u32>,
        all: &'static [u32],
    },
    Wait,
}

/// A row: why, the slots listed, the next step, few rivals, the slot reserved for this node.
type Row = (&'static str, Vec<Slot>, Next, bool, Option<u32>);

#[test]
fn after_one_list_a_node_adopts_takes_or_waits_as_the_rules_say() {
    use Next::*;
    #[rustfmt::skip]
    let rows: Vec<Row> = vec![
        ("a restarted agent adopts the slot it holds, reserved elsewhere or not",
            vec![large(0), held(reserved(large(1), "node-b"), ME)], Adopt(1), false, None),
        ("many rivals: only the slot reserved for this node is taken",
            vec![large(0), reserved(large(1), ME), large(2)], Take { first: Some(1), all: &[1] }, false, Some(1)),
        ("many rivals, nothing reserved for it: it waits, free slots or not",
            vec![large(0), large(1), large(2)], Wait, false, None),
        ("a reservation on a slot another node holds is not taken",
            vec![held(reserved(large(0), ME), "node-b")], Wait, false, Some(0)),
        ("a closed slot reserved for it is neither taken nor waited on",
            vec![closed(reserved(large(0), ME), Closed::Budget)], Wait, false, None),
        ("few rivals: every free open slot reserved for nobody, in rendezvous order",
            vec![small(0), small(1)], Take { first: None, all: &[0, 1] }, true, None),
        ("few rivals: its own reservation first, then the free ones",
            vec![small(0), reserved(small(1), ME)], Take { first: Some(1), all: &[0, 1] }, true, Some(1)),
        ("few rivals: a slot reserved for another node is left to it",
            vec![reserved(small(0), "node-b"), held(small(1), "node-c")], Wait, true, None),
        ("few rivals: a slot held by a failed node is never tried",
            vec![failed(small(0)), small(1)], Take { first: None, all: &[1] }, true, None),
        ("few rivals: a retired slot is not counted and not taken",
            vec![small(0), closed(small(1), Closed::Retired)], Take { first: None, all: &[0] }, true, None),
        ("no slots yet (the coordinator has not made them): it waits",
            vec![], Wait, true, None),
        ("slots not stamped (an older coordinator): taken at once",
            vec![slot(0, None, None)], Take { first: None, all: &[0] }, true, None),
        ("the largest stamp counts: one slot restamped for a large fleet makes all wait",
            vec![small(0), large(1)], Wait, false, None),
    ];
    for (why, slots, next, few, mine) in rows {
        let got = after_list(ME, "uid-a", "wasm", &slots);
        assert_eq!(got.few_rivals, few, "{why}: few rivals");
        assert_eq!(got.reserved, mine, "{why}: reserved");
        match (next, &got.claim) {
            (Adopt(i), Claim::Adopt(j)) => assert_eq!(i, *j, "{why}"),
            (Take { first, all }, Claim::Take(tries)) => {
                if let Some(f) = first {
                    assert_eq!(tries.first(), Some(&f), "{why}: reserved first");
                }
                let mut sorted = tries.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, all, "{why}: the slots tried");
            }
            (Wait, Claim::Wait) => {}
            (want, got) => panic!("{why}: want {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn nodes_claiming_at_once_try_free_slots_in_different_orders() {
    let slots: Vec<Slot> = (0..8).map(small).collect();
    let slots: Vec<Slot> = slots
        .into_iter()
        .map(|mut s| {
            s.count = Some(8);
            s.targeted = Some(8);
            s
        })
        .collect();
    let first = |uid: &str| match after_list(ME, uid, "wasm", &slots).claim {
        Claim::Take(t) => t[0],
        other => panic!("{other:?}"),
    };
    let firsts: BTreeSet<u32> = (0..16).map(|i| first(&format!("uid-{i}"))).collect();
    assert!(firsts.len() >= 4, "16 nodes start on {firsts:?}");
    assert_eq!(first("uid-3"), first("uid-3"), "one node, one order");
}

#[test]
fn a_watched_slot_is_taken_passed_or_makes_the_node_list_again() {
    use Watched::*;
    #[rustfmt::skip]
    let rows: Vec<(&str, Option<Slot>, bool, Watched)> = vec![
        ("another Shim's slot", None, true, Pass),
        ("its reservation, free", Some(reserved(large(0), ME)), false, Take),
        ("its reservation, still held by the node before it", Some(held(reserved(large(0), ME), "node-b")), false, Pass),
        ("a free slot reserved for nobody, while it waits for a reservation", Some(large(0)), false, Pass),
        ("a free slot reserved for another node", Some(reserved(large(0), "node-b")), false, Pass),
        ("a slot it holds already (the coordinator wrote it first)", Some(held(large(0), ME)), false, Take),
        ("few rivals: a free slot reserved for nobody", Some(small(0)), true, Take),
        ("few rivals: a free slot closed by the budget", Some(closed(small(0), Closed::Budget)), true, Pass),
        ("few rivals: a free slot reserved for another node", Some(reserved(small(0), "node-b")), true, Pass),
        ("few rivals no more: the slot restamped for a large fleet", Some(large(0)), true, Relist),
    ];
    for (why, slot, unreserved, want) in rows {
        assert_eq!(on_watched(ME, slot.as_ref(), unreserved), want, "{why}");
    }
}
