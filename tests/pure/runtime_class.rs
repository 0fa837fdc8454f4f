//! `spec.runtimeClass`'s scheduling fields as a node judges a Shim file (client-side CEL, the
//! same rules as the API server's; tests/kube/runtime_class.rs runs the same cases there).

use shim_agent::api::load::parse_shims;

use crate::support::runtime_classes::{BAD, FULL, shim_yaml};

#[test]
fn a_class_with_every_scheduling_field_parses() {
    let shims = parse_shims(&shim_yaml("rc-full", FULL), "shim.yaml").unwrap();
    let rc = &shims[0].spec.runtime_class;
    assert_eq!(rc.tolerations().unwrap().len(), 3);
    assert_eq!(rc.pod_fixed().unwrap().len(), 4);
}

#[test]
fn each_bad_class_is_refused_with_its_rule_message() {
    for (name, runtime_class, message) in BAD {
        let e = match parse_shims(&shim_yaml(name, runtime_class), "shim.yaml") {
            Ok(_) => panic!("accepted {name}: {runtime_class}"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(message), "{name}: expected {message:?} in:\n{e}");
    }
}
