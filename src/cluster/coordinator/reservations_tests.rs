use super::*;

fn slot(index: u32, holder: Option<&str>, reserved: Option<&str>) -> Slot {
    Slot {
        index,
        holder: holder.map(str::to_string),
        reserved: reserved.map(str::to_string),
        resource_version: format!("rv{index}"),
        ..Slot::default()
    }
}

fn waiter(node: &str, since: &str) -> Waiter {
    Waiter {
        node: node.into(),
        since: since.into(),
        passed_over: 0,
    }
}

fn none() -> BTreeSet<u32> {
    BTreeSet::new()
}

fn reserve(index: u32, node: Option<&str>) -> Reserve {
    Reserve {
        index,
        node: node.map(str::to_string),
        resource_version: format!("rv{index}"),
    }
}

#[test]
fn each_open_slot_is_kept_for_the_next_node_in_the_order_they_began_waiting() {
    // slot 0 held by a, slot 1 free; c began waiting before b
    let slots = [slot(0, Some("a"), None), slot(1, None, None)];
    let waiting = [
        waiter("b", "2026-11-27T08:00:02Z"),
        waiter("c", "2026-11-27T08:00:01Z"),
        waiter("a", "2026-11-27T08:00:00Z"), // a holder waits for nothing
    ];
    let plan = plan_reservations(&slots, &waiting, &none(), &none());
    assert_eq!(plan, vec![reserve(0, Some("c")), reserve(1, Some("b"))]);
    // planned again once written: nothing to do
    let slots = [slot(0, Some("a"), Some("c")), slot(1, None, Some("b"))];
    assert!(plan_reservations(&slots, &waiting, &none(), &none()).is_empty());
}

#[test]
fn a_reservation_moves_on_once_claimed_and_goes_when_nobody_waits() {
    // c took slot 0 (still labelled for it): the label moves to d; b's stands
    let slots = [slot(0, Some("c"), Some("c")), slot(1, None, Some("b"))];
    let waiting = [
        waiter("b", "2026-11-27T08:00:02Z"),
        waiter("c", "2026-11-27T08:00:01Z"),
        waiter("d", "2026-11-27T08:00:03Z"),
    ];
    let plan = plan_reservations(&slots, &waiting, &none(), &none());
    assert_eq!(plan, vec![reserve(0, Some("d"))]);
    // nobody waits any more: both labels go, any node may take the slots
    let plan = plan_reservations(&slots, &[], &none(), &none());
    assert_eq!(plan, vec![reserve(0, None), reserve(1, None)]);
}

#[test]
fn closed_slots_and_slots_kept_by_failed_nodes_are_reserved_for_nobody() {
    let mut closed = slot(0, None, Some("b"));
    closed.closed = Some(crate::cluster::slots::Closed::Halted);
    let mut failed = slot(1, Some("x"), None);
    failed.failed = Some(crate::cluster::slots::Failure {
        generation: 1,
        resume: String::new(),
        reason: "RolledBack".into(),
    });
    let open = slot(2, None, None);
    let waiting = [waiter("b", "1"), waiter("c", "2")];
    let plan = plan_reservations(&[closed, failed, open], &waiting, &none(), &none());
    // b's reservation on the closed slot goes; b is next in line for the open one
    assert_eq!(plan, vec![reserve(0, None), reserve(2, Some("b"))]);
}

#[test]
fn an_expired_reservation_passes_its_node_over_and_untouched_slots_wait() {
    let slots = [slot(0, None, Some("b")), slot(1, None, None)];
    // b's reservation ran out (the coordinator counted it passed over): its slot goes to c,
    // and b, still waiting, queues behind c
    let mut waiting = vec![waiter("b", "1"), waiter("c", "2")];
    waiting[0].passed_over = 1;
    let expired = BTreeSet::from([0]);
    let plan = plan_reservations(&slots, &waiting, &expired, &none());
    assert_eq!(plan, vec![reserve(0, Some("c")), reserve(1, Some("b"))]);
    // behind every node never passed over, too
    waiting.push(waiter("d", "3"));
    let slots = [slot(0, None, None)];
    let plan = plan_reservations(&slots, &waiting, &none(), &none());
    assert_eq!(plan, vec![reserve(0, Some("c"))]);
    // a slot written otherwise this round (or above N) is left for the next round
    let untouched = BTreeSet::from([0]);
    assert!(plan_reservations(&slots, &waiting, &none(), &untouched).is_empty());
}

#[test]
fn one_reservation_per_node_even_if_two_slots_name_it() {
    let slots = [slot(0, None, Some("b")), slot(1, None, Some("b"))];
    let waiting = [waiter("b", "1"), waiter("c", "2")];
    let plan = plan_reservations(&slots, &waiting, &none(), &none());
    assert_eq!(plan, vec![reserve(1, Some("c"))]);
}

#[test]
fn the_coordinator_clock_runs_from_when_a_reserved_slot_came_free() {
    let mut r = Reservations::default();
    let t0 = Instant::now();
    // held: no clock; a holder is held-recently for the cooldown, and the coordinator looks
    // again when it ends (the node may wait again then)
    r.observe(&[slot(0, Some("a"), Some("b"))], t0);
    assert!(r.expired(t0 + CLAIM_WITHIN * 2).is_empty());
    assert_eq!(r.next_due(), Some(t0 + HELD_COOLDOWN));
    assert!(r.held_recently("a"));
    // released: b's clock starts
    let t1 = t0 + Duration::from_secs(1);
    r.observe(&[slot(0, None, Some("b"))], t1);
    assert_eq!(r.next_due(), Some(t1 + CLAIM_WITHIN));
    // seen again later: the clock keeps its start
    r.observe(&[slot(0, None, Some("b"))], t1 + Duration::from_secs(5));
    assert!(r.expired(t1 + Duration::from_secs(5)).is_empty());
    let late = t1 + CLAIM_WITHIN;
    assert_eq!(r.expired(late), BTreeSet::from([0]));
    r.pass_over(&[slot(0, None, Some("b"))], &BTreeSet::from([0]));
    assert_eq!(r.passed_over("b"), 1);
    assert_eq!(r.next_due(), Some(t0 + HELD_COOLDOWN), "a's cooldown");
    // the cooldown ends
    r.observe(&[slot(0, None, Some("c"))], t0 + HELD_COOLDOWN);
    assert!(!r.held_recently("a"));
    // the label moved to c: a new clock for c
    assert_eq!(r.next_due(), Some(t0 + HELD_COOLDOWN + CLAIM_WITHIN));
}
