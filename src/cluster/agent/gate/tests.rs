use super::slot_gate::api_failed;
use crate::cluster::slots::few_rivals;

#[test]
fn a_slot_reserved_for_nobody_is_taken_at_once_only_while_the_targeted_fit_in_n() {
    // 5000 nodes at 250 slots wait for their reservations
    assert!(!few_rivals(250, Some(5000)));
    assert!(few_rivals(250, Some(250)));
    // a small cluster takes a new Shim's slot at once: up to two nodes on one slot
    assert!(few_rivals(1, Some(2)));
    assert!(!few_rivals(1, Some(3)));
    // slots not stamped (made by an older coordinator): at once
    assert!(few_rivals(1, None));
}

#[test]
fn a_slot_request_the_server_was_too_busy_for_may_pass_and_a_refusal_may_not() {
    let api = crate::cluster::api_answer::api_error;
    for (code, reason) in [
        (429, "SlotUnavailable"),
        (503, "SlotUnavailable"),
        (403, "SlotRefused"),
        (422, "SlotRefused"),
    ] {
        assert_eq!(
            api_failed(&api(code), "x".into()).reason(),
            reason,
            "{code}"
        );
    }
}
