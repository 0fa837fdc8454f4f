//! Every edit of a rollout slot Lease, written once (docs/design.md §5): what a node does to
//! its own slot (take, release, mark failed) and what the coordinator does (create, close,
//! free, stamp). Pure: each takes a Lease and returns it edited; the caller writes it,
//! guarded by the resourceVersion it read. The admission policy `shim-agent-slot-writes`
//! checks exactly these edits for node identities.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::{Resource, ResourceExt};

use super::slots::{
    Closed, Failure, SLOT_CLOSED, SLOT_COUNT, SLOT_FAILED, SLOT_FREED, SLOT_HOLDER_LABEL,
    SLOT_RESERVED_LABEL, SLOT_SHIM_LABEL, slot_name,
};
use crate::api::Shim;
use crate::api::lease::{SLOT_TARGETED, ShimLease, ShimLeaseSpec};
use crate::api::names::NAMESPACE;

/// A new slot `index` of `shim`: labelled with its Shim, owned by it (deleted with it),
/// closed with `closed` when set, stamped with `count` and with the `targeted` nodes.
pub fn create(
    shim: &Shim,
    index: u32,
    closed: Option<Closed>,
    count: Option<u32>,
    targeted: u32,
) -> ShimLease {
    let mut l = ShimLease::new(
        &slot_name(&shim.name_any(), index),
        ShimLeaseSpec::default(),
    );
    l.metadata.namespace = Some(NAMESPACE.into());
    l.metadata.labels = Some([(SLOT_SHIM_LABEL.to_string(), shim.name_any())].into());
    l.metadata.owner_references = shim.controller_owner_ref(&()).map(|o| vec![o]);
    stamp(close(l, closed), count, targeted)
}

/// The slot kept for `node` next (`None`: for nobody), by the coordinator.
pub fn reserve(mut lease: ShimLease, node: Option<&str>) -> ShimLease {
    match node {
        Some(n) => {
            lease
                .labels_mut()
                .insert(SLOT_RESERVED_LABEL.into(), n.to_string());
        }
        None => {
            lease.labels_mut().remove(SLOT_RESERVED_LABEL);
        }
    }
    lease
}

/// The slot taken (or renewed) by node `me` (its Node's UID `my_uid`) at `now`: the holder and
/// its times, the holder label, and its Node as an owner (the garbage collector removes that
/// owner when the Node goes, which is what lets the coordinator free the slot).
pub fn take(mut lease: ShimLease, me: &str, my_uid: &str, now: MicroTime) -> ShimLease {
    if lease.spec.holder_identity.as_deref() != Some(me) {
        lease.spec.holder_identity = Some(me.to_string());
        lease.spec.acquire_time = Some(now.clone());
        lease.spec.lease_transitions = Some(lease.spec.lease_transitions.unwrap_or(0) + 1);
    }
    lease.spec.renew_time = Some(now);
    lease.annotations_mut().remove(SLOT_FREED);
    lease
        .labels_mut()
        .insert(SLOT_HOLDER_LABEL.into(), me.to_string());
    let refs = lease.metadata.owner_references.get_or_insert_with(Vec::new);
    if !refs.iter().any(|o| o.kind == "Node" && o.name == me) {
        refs.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: me.to_string(),
            uid: my_uid.to_string(),
            ..OwnerReference::default()
        });
    }
    lease
}

/// The slot given back by its holder `me`: no holder, no failure mark, no holder label, its
/// Node no longer an owner.
pub fn release(mut lease: ShimLease, me: &str) -> ShimLease {
    lease.spec.holder_identity = None;
    lease.annotations_mut().remove(SLOT_FAILED);
    lease.labels_mut().remove(SLOT_HOLDER_LABEL);
    if let Some(refs) = lease.metadata.owner_references.as_mut() {
        refs.retain(|o| !(o.kind == "Node" && o.name == me));
    }
    lease
}

/// The slot kept by its holder, marked with its failure (counted against maxFailures).
pub fn mark_failed(mut lease: ShimLease, failure: &Failure) -> ShimLease {
    let mark = serde_json::to_string(failure).unwrap_or_default();
    lease.annotations_mut().insert(SLOT_FAILED.into(), mark);
    lease
}

/// The slot of a deleted Node, freed by the coordinator: no holder, no failure, and who held
/// it kept in the freed-from mark.
pub fn free(mut lease: ShimLease) -> ShimLease {
    let holder = lease.spec.holder_identity.take().unwrap_or_default();
    lease.annotations_mut().remove(SLOT_FAILED);
    lease.annotations_mut().insert(SLOT_FREED.into(), holder);
    lease.labels_mut().remove(SLOT_HOLDER_LABEL);
    lease
}

/// The close mark set (`Some`) or cleared (`None`).
pub fn close(mut lease: ShimLease, closed: Option<Closed>) -> ShimLease {
    match closed {
        Some(c) => {
            lease
                .annotations_mut()
                .insert(SLOT_CLOSED.into(), c.as_str().into());
        }
        None => {
            lease.annotations_mut().remove(SLOT_CLOSED);
        }
    }
    lease
}

/// N stamped on the slot (nothing without a limit), and the nodes its Shim targets.
pub fn stamp(mut lease: ShimLease, count: Option<u32>, targeted: u32) -> ShimLease {
    if let Some(n) = count {
        lease
            .annotations_mut()
            .insert(SLOT_COUNT.into(), n.to_string());
    }
    lease
        .annotations_mut()
        .insert(SLOT_TARGETED.into(), targeted.to_string());
    lease
}

/// The JSON Patch that makes `before` into `after` (an edit of this node's own slot: a
/// renewal, a release, a failure mark) on the slot as the API server holds it now, only while
/// `me` still holds it: a `test` of the holder first, then the edit's own changes. The
/// resourceVersion is not a condition: the coordinator's reservation writes move it while a
/// node holds the slot, and a replace guarded by it cost every holder a 409, a read and a
/// second write at each release. Owner references are replaced whole (their index may move).
pub fn own_patch(before: &ShimLease, after: &ShimLease, me: &str) -> json_patch::Patch {
    use json_patch::{PatchOperation, ReplaceOperation, TestOperation};
    let to_value = |l: &ShimLease| serde_json::to_value(l).unwrap_or_default();
    let (b, a) = (to_value(before), to_value(after));
    let owners = "/metadata/ownerReferences";
    let mut ops = vec![PatchOperation::Test(TestOperation {
        path: pointer("/spec/holderIdentity"),
        value: serde_json::Value::String(me.to_string()),
    })];
    let mut owners_changed = false;
    for op in json_patch::diff(&b, &a).0 {
        let path = op.path().to_string();
        if path.starts_with(owners) {
            owners_changed = true;
        } else if !path.starts_with("/metadata/resourceVersion") {
            ops.push(op);
        }
    }
    if owners_changed {
        let value = a
            .pointer(owners)
            .cloned()
            .unwrap_or_else(|| serde_json::Value::Array(Vec::new()));
        ops.push(PatchOperation::Replace(ReplaceOperation {
            path: pointer(owners),
            value,
        }));
    }
    json_patch::Patch(ops)
}

fn pointer(p: &str) -> json_patch::jsonptr::PointerBuf {
    json_patch::jsonptr::PointerBuf::parse(p).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim() -> Shim {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: s, uid: u1}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {{name: s}}\n",
            "a".repeat(64)
        );
        crate::api::load::parse_shims(&y, "t.yaml")
            .unwrap()
            .remove(0)
    }

    fn now() -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn take_then_release_gives_the_slot_back_as_it_was() {
        let fresh = create(&shim(), 0, None, Some(3), 7);
        assert_eq!(
            fresh.annotations().get(SLOT_TARGETED).map(String::as_str),
            Some("7")
        );
        assert_eq!(fresh.metadata.name.as_deref(), Some("s-slot-0"));
        assert_eq!(
            fresh.annotations().get(SLOT_COUNT).map(String::as_str),
            Some("3")
        );
        let held = take(fresh.clone(), "n1", "uid-n1", now());
        assert_eq!(held.spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(
            held.labels().get(SLOT_HOLDER_LABEL).map(String::as_str),
            Some("n1")
        );
        assert!(
            held.owner_references()
                .iter()
                .any(|o| o.kind == "Node" && o.uid == "uid-n1")
        );
        // a renewal keeps the acquire time and the transitions
        let renewed = take(held.clone(), "n1", "uid-n1", now());
        assert_eq!(renewed.spec.lease_transitions, Some(1));
        let back = release(renewed, "n1");
        assert_eq!(back.spec.holder_identity, None);
        assert_eq!(back.owner_references(), fresh.owner_references());
        assert_eq!(back.labels(), fresh.labels());
    }

    #[test]
    fn a_freed_slot_remembers_its_holder_and_drops_the_failure() {
        let f = Failure {
            generation: 2,
            resume: String::new(),
            reason: "x".into(),
        };
        let l = mark_failed(
            take(create(&shim(), 1, None, None, 0), "n1", "u", now()),
            &f,
        );
        assert!(l.annotations().contains_key(SLOT_FAILED));
        let freed = free(l);
        assert_eq!(freed.spec.holder_identity, None);
        assert_eq!(
            freed.annotations().get(SLOT_FREED).map(String::as_str),
            Some("n1")
        );
        assert!(!freed.annotations().contains_key(SLOT_FAILED));
        let closed = close(freed, Some(Closed::Halted));
        assert_eq!(
            closed.annotations().get(SLOT_CLOSED).map(String::as_str),
            Some("halted")
        );
        assert!(!close(closed, None).annotations().contains_key(SLOT_CLOSED));
    }

    #[test]
    fn a_holders_own_patch_tests_the_holder_and_keeps_what_the_coordinator_wrote_since() {
        let held = take(create(&shim(), 0, None, Some(3), 7), "n1", "uid-n1", now());
        let patch = own_patch(&held, &release(held.clone(), "n1"), "n1");
        // the slot as the API server holds it now: reserved for the next node meanwhile
        let mut server = reserve(held.clone(), Some("n2"));
        server.metadata.resource_version = Some("42".into());
        let mut doc = serde_json::to_value(&server).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        let released: ShimLease = serde_json::from_value(doc).unwrap();
        assert_eq!(released.spec.holder_identity, None);
        assert!(!released.labels().contains_key(SLOT_HOLDER_LABEL));
        assert!(!released.owner_references().iter().any(|o| o.kind == "Node"));
        assert!(released.owner_references().iter().any(|o| o.kind == "Shim"));
        assert_eq!(
            released
                .labels()
                .get(SLOT_RESERVED_LABEL)
                .map(String::as_str),
            Some("n2"),
            "the reservation written meanwhile stays"
        );
        // another node holds it now: the patch does not apply
        let mut theirs =
            serde_json::to_value(take(release(server, "n1"), "n3", "uid-n3", now())).unwrap();
        assert!(json_patch::patch(&mut theirs, &patch).is_err());
    }
}
