//! Reservation hints (docs/design.md §5), pure: how a waiting node learns which slot the
//! coordinator keeps for it.
//!
//! The coordinator writes, on each Node, the slots reserved for it
//! ([`SLOT_RESERVATIONS_ANNOTATION`]: Shim name -> slot index), from the slots'
//! `slot-reserved-for` labels as its cache shows them. The node reads the annotation through
//! the watch of its own Node it has anyway, and watches the one slot it names, by name. The
//! API server's watch cache hands an event only to the watchers of that object's name; a
//! label selector on the slots has no such index, so 5000 nodes each watching "the slots
//! reserved for me" were all handed every slot event, and fell behind.
//!
//! The hint decides nothing: the node claims a slot only when the slot itself shows it free,
//! open and reserved for it, and the admission policy checks the same label. A stale hint
//! costs a watch of the wrong slot until the next one; a forged one gains nothing.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::api::lease::{SLOT_RESERVATIONS_ANNOTATION, SLOT_RESERVED_LABEL, ShimLease};
use crate::cluster::slots::{SLOT_SHIM_LABEL, slot_index};

/// A node's reservations: Shim name -> the index of the slot kept for the node.
pub type Hints = BTreeMap<String, u32>;

/// The hints each node should carry, from the slots as read: node -> its reservations. A
/// node with two slots of one Shim reserved (a moment between two coordinator rounds) is
/// pointed at the lower index.
pub fn wanted<'l>(leases: impl IntoIterator<Item = &'l ShimLease>) -> BTreeMap<String, Hints> {
    let mut out: BTreeMap<String, Hints> = BTreeMap::new();
    for l in leases {
        let labels = l.labels();
        let (Some(shim), Some(node)) =
            (labels.get(SLOT_SHIM_LABEL), labels.get(SLOT_RESERVED_LABEL))
        else {
            continue;
        };
        let Some(index) = slot_index(shim, &l.name_any()) else {
            continue;
        };
        let hints = out.entry(node.clone()).or_default();
        let at = hints.entry(shim.clone()).or_insert(index);
        *at = (*at).min(index);
    }
    out
}

/// The hints a Node carries. Anything but a JSON object of Shim names to slot indexes reads
/// as none (a hint only saves a node a wait; it never grants a slot).
pub fn of_node(node: &Node) -> Hints {
    node.annotations()
        .get(SLOT_RESERVATIONS_ANNOTATION)
        .map(|v| parse(v))
        .unwrap_or_default()
}

/// [`of_node`]'s reading of an annotation's value.
pub fn parse(value: &str) -> Hints {
    serde_json::from_str(value).unwrap_or_default()
}

/// The merge patch that makes `node`'s hints `wanted` (none: the annotation goes), or `None`
/// when it carries them already.
pub fn patch(node: &Node, wanted: Option<&Hints>) -> Option<serde_json::Value> {
    let wanted = wanted.filter(|h| !h.is_empty());
    let present = node.annotations().get(SLOT_RESERVATIONS_ANNOTATION);
    let value = match (wanted, present) {
        (None, None) => return None,
        (Some(w), Some(p)) if parse(p) == *w => return None,
        (None, Some(_)) => serde_json::Value::Null,
        (Some(w), _) => serde_json::Value::String(serde_json::to_string(w).ok()?),
    };
    Some(serde_json::json!({"metadata": {"annotations": {SLOT_RESERVATIONS_ANNOTATION: value}}}))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::slots::slot_name;

    fn slot(shim: &str, index: u32, reserved: Option<&str>) -> ShimLease {
        let mut l = ShimLease::new(&slot_name(shim, index), Default::default());
        let mut labels = BTreeMap::from([(SLOT_SHIM_LABEL.to_string(), shim.to_string())]);
        if let Some(r) = reserved {
            labels.insert(SLOT_RESERVED_LABEL.to_string(), r.to_string());
        }
        l.metadata.labels = Some(labels);
        l
    }

    fn node(hint: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.annotations = hint
            .map(|h| BTreeMap::from([(SLOT_RESERVATIONS_ANNOTATION.to_string(), h.to_string())]));
        n
    }

    #[test]
    fn each_node_is_pointed_at_the_slot_of_each_shim_reserved_for_it() {
        let leases = [
            slot("wasm", 0, Some("n1")),
            slot("wasm", 1, Some("n2")),
            slot("wasm", 2, None),
            slot("gvisor", 3, Some("n1")),
            // two of one Shim for one node, between two rounds: the lower
            slot("gvisor", 1, Some("n1")),
            // a label that names another Shim than the Lease's name: no slot of it
            slot("kata", 0, Some("n3")),
        ];
        let mut odd = slot("kata", 0, Some("n3"));
        odd.metadata.name = Some("wasm-slot-9".into());
        let w = wanted(leases.iter().chain([&odd]));
        assert_eq!(
            w,
            BTreeMap::from([
                (
                    "n1".to_string(),
                    Hints::from([("wasm".into(), 0), ("gvisor".into(), 1)])
                ),
                ("n2".to_string(), Hints::from([("wasm".into(), 1)])),
                ("n3".to_string(), Hints::from([("kata".into(), 0)])),
            ])
        );
    }

    #[test]
    fn a_node_is_patched_only_when_its_hints_differ_and_loses_the_annotation_when_it_has_none() {
        let want = Hints::from([("wasm".into(), 2)]);
        let set = patch(&node(None), Some(&want)).unwrap();
        let value = set["metadata"]["annotations"][SLOT_RESERVATIONS_ANNOTATION]
            .as_str()
            .unwrap();
        assert_eq!(parse(value), want);
        // the same hints, written by another serializer: no write
        assert_eq!(patch(&node(Some("{ \"wasm\" : 2 }")), Some(&want)), None);
        assert!(patch(&node(Some("{\"wasm\":1}")), Some(&want)).is_some());
        // none wanted: the annotation goes, once
        let drop = patch(&node(Some("{\"wasm\":2}")), None).unwrap();
        assert!(drop["metadata"]["annotations"][SLOT_RESERVATIONS_ANNOTATION].is_null());
        assert_eq!(patch(&node(None), None), None);
        assert_eq!(patch(&node(None), Some(&Hints::new())), None);
    }

    #[test]
    fn a_hint_that_is_not_shim_names_to_indexes_reads_as_none_whatever_its_text() {
        for v in [
            "",
            "null",
            "[1,2]",
            "{\"wasm\":-1}",
            "{\"wasm\":\"0\"}",
            "{\"wasm\":99999999999}",
            "\u{feff}{\"wasm\":0}",
            "{\"ü\u{0}\": 1.5}",
            &"{".repeat(10_000),
        ] {
            assert_eq!(parse(v), Hints::new(), "{v:.40}");
        }
        assert_eq!(
            of_node(&node(Some("{\"wasm\":0,\"日本\":7}"))),
            Hints::from([("wasm".into(), 0), ("日本".into(), 7)])
        );
        // a garbled hint is rewritten
        assert!(
            patch(
                &node(Some("garbage")),
                Some(&Hints::from([("w".into(), 0)]))
            )
            .is_some()
        );
        assert!(patch(&node(Some("garbage")), None).is_some());
    }
}
