use super::*;
use crate::api::{NodeCounts, ShimStatus};

fn shim_with(targeted: i32, installed: i32, failed: i32) -> Shim {
    let y = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n",
        "a".repeat(64)
    );
    let mut s = crate::api::load::parse_shims(&y, "t.yaml")
        .unwrap()
        .remove(0);
    s.status = Some(ShimStatus {
        nodes: Some(NodeCounts {
            targeted,
            installed,
            updating: 0,
            failed,
        }),
        ..ShimStatus::default()
    });
    s
}

#[test]
fn a_slot_reserved_for_nobody_is_taken_at_once_only_while_the_waiting_fit_in_n() {
    // 20 targeted, 5 installed: 15 still to do in 5 slots, or in 20
    assert!(!few_rivals(&shim_with(20, 5, 0), 5, None));
    assert!(few_rivals(&shim_with(20, 5, 0), 20, None));
    // done and failed nodes do not wait
    assert!(few_rivals(&shim_with(1000, 900, 95), 10, None));
    assert!(!few_rivals(&shim_with(1000, 900, 60), 10, None));
    // no status yet: the nodes stamped on the slots wait (5000 nodes, 250 slots)
    let mut new = shim_with(0, 0, 0);
    new.status = None;
    assert!(!few_rivals(&new, 250, Some(5000)));
    assert!(few_rivals(&new, 250, None));
    // the status wins once there is one
    assert!(few_rivals(&shim_with(5000, 4990, 0), 250, Some(5000)));
    // a small cluster still takes a new Shim's slot at once
    assert!(few_rivals(&new, 1, Some(2)));
    assert!(!few_rivals(&new, 1, Some(3)));
}

#[test]
fn a_slot_request_the_server_was_too_busy_for_may_pass_and_a_refusal_may_not() {
    let api = |code: u16| {
        kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        )
    };
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
