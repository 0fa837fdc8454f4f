//! Rollout slots on the real kube-apiserver: the admission policy holds each node identity (the
//! kubelet's, a dedicated certificate, a node-bound ServiceAccount token) to its own slot and
//! away from what of a slot is the coordinator's, and a deleted Node's slot becomes freeable
//! only through Kubernetes' own garbage collector.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::api::lease::{SLOT_TARGETED, ShimLease, ShimLeaseSpec};
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::lease_edits;
use shim_agent::cluster::slots::{
    Closed, Failure, SLOT_FAILED, SLOT_FREED, SLOT_HOLDER_LABEL, SLOT_SHIM_LABEL, slot_name,
};

use crate::support::kube::{KubeEnv, SERIAL, client_for, eventually, kube_env};
use crate::support::shim_builder::ShimBuilder;

fn shim() -> String {
    ShimBuilder::new("kslots")
        // its own nodes only: a Shim left behind by an interrupted run selects no other test's node
        .node_selector("test", "kslots")
        .artifact(
            "https://example.com/shim.tar.gz",
            "3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0",
        )
        .yaml()
}

fn owner(kind: &str, api_version: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        ..Default::default()
    }
}

/// `slot` with `holder`, its label and the holder's Node among the owners (as an agent takes it).
fn held_by(slot: &ShimLease, holder: Option<(&str, &str)>) -> ShimLease {
    let mut s = slot.clone();
    s.spec.holder_identity = holder.map(|(n, _)| n.to_string());
    let mut owners: Vec<OwnerReference> = s
        .owner_references()
        .iter()
        .filter(|o| o.kind != "Node")
        .cloned()
        .collect();
    if let Some((n, uid)) = holder {
        owners.push(owner("Node", "v1", n, uid));
        s.labels_mut().insert(SLOT_HOLDER_LABEL.into(), n.into());
    } else {
        s.labels_mut().remove(SLOT_HOLDER_LABEL);
    }
    s.metadata.owner_references = Some(owners);
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_may_take_and_free_only_its_own_slot_and_a_deleted_nodes_slot_is_freed_via_gc() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    env.create_node("kslots-a", &[("test", "kslots")]).await;
    env.create_node("kslots-b", &[("test", "kslots")]).await;
    let (ok, out) = env.apply(&shim());
    assert!(ok, "{out}");
    let admin = env.admin_client().await;
    let shim = Api::<Shim>::all(admin.clone()).get("kslots").await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let uid_a = nodes.get("kslots-a").await.unwrap().uid().unwrap();

    let name = slot_name("kslots", 0);
    let leases: Api<ShimLease> = Api::namespaced(admin.clone(), NAMESPACE);
    let _ = leases.delete(&name, &DeleteParams::default()).await;
    let mut slot = ShimLease::new(&name, ShimLeaseSpec::default());
    slot.metadata.namespace = Some(NAMESPACE.into());
    slot.metadata.labels = Some([(SLOT_SHIM_LABEL.to_string(), "kslots".to_string())].into());
    slot.metadata.owner_references = Some(vec![shim.controller_owner_ref(&()).unwrap()]);
    eventually(10, "the old slot gone", || async {
        leases.create(&PostParams::default(), &slot).await.ok()
    })
    .await;

    let as_a: Api<ShimLease> =
        Api::namespaced(client_for(&env.node_identity("kslots-a")).await, NAMESPACE);
    let as_b: Api<ShimLease> =
        Api::namespaced(client_for(&env.node_identity("kslots-b")).await, NAMESPACE);
    let pp = PostParams::default();
    let denied = |r: Result<ShimLease, kube::Error>, what: &str, msg: &str| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what}: allowed"))
            .to_string();
        assert!(e.contains(msg), "{what}: {e}");
    };

    // a takes it for b: no
    let cur = as_a.get(&name).await.unwrap();
    denied(
        as_a.replace(&name, &pp, &held_by(&cur, Some(("kslots-b", "x"))))
            .await,
        "a takes for b",
        "may take a free slot only for itself",
    );
    // a takes it for itself, its Node as an owner: yes
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, Some(("kslots-a", &uid_a))))
        .await
        .expect("a takes its own");
    // b frees it, renews it, marks it, deletes it, or drops a's ownership: no
    denied(
        as_b.replace(&name, &pp, &held_by(&cur, None)).await,
        "b frees a's",
        "free only its own",
    );
    let mut renewed = cur.clone();
    renewed.spec.lease_transitions = Some(7);
    denied(
        as_b.replace(&name, &pp, &renewed).await,
        "b renews a's",
        "may not renew or mark the slot of kslots-a",
    );
    let mut marked = cur.clone();
    marked
        .annotations_mut()
        .insert(SLOT_FAILED.into(), "{}".into());
    denied(
        as_b.replace(&name, &pp, &marked).await,
        "b marks a's failed",
        "may not renew or mark",
    );
    // (no node deletes a slot at all: only the coordinator creates and retires them)
    let e = as_b
        .delete(&name, &DeleteParams::default())
        .await
        .expect_err("b deletes a's slot: allowed")
        .to_string();
    assert!(e.contains("forbidden"), "b deletes: {e}");
    let mut unowned = cur.clone();
    unowned.metadata.owner_references = Some(vec![shim.controller_owner_ref(&()).unwrap()]);
    denied(
        as_b.replace(&name, &pp, &unowned).await,
        "b drops a's ownership",
        "only its own Node as an owner",
    );
    // a marks its failure and frees its own: yes
    let cur = as_a
        .replace(&name, &pp, &marked)
        .await
        .expect("a marks its own");
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, None))
        .await
        .expect("a frees its own");

    // a takes it again, then Node a is deleted: the garbage collector drops the dangling
    // owner, and b may free it (the coordinator's duty)
    let cur = as_a
        .replace(&name, &pp, &held_by(&cur, Some(("kslots-a", &uid_a))))
        .await
        .unwrap();
    denied(
        as_b.replace(&name, &pp, &held_by(&cur, None)).await,
        "b frees a live node's",
        "free only its own",
    );
    nodes
        .delete("kslots-a", &DeleteParams::default())
        .await
        .unwrap();
    let cur = eventually(
        60,
        "the garbage collector to drop the dangling Node owner",
        || async {
            let s = leases.get(&name).await.ok()?;
            (!s.owner_references().iter().any(|o| o.kind == "Node")).then_some(s)
        },
    )
    .await;
    assert_eq!(cur.spec.holder_identity.as_deref(), Some("kslots-a"));
    as_b.replace(&name, &pp, &held_by(&cur, None))
        .await
        .expect("a deleted node's slot is freed");
    let _ = Api::<Shim>::all(admin)
        .delete("kslots", &DeleteParams::default())
        .await;
}

/// The three kinds of node identity, each acting for Node `node`: the kubelet's certificate,
/// a dedicated certificate, and a token of the node agents' ServiceAccount bound to the Node.
fn node_identities(env: &KubeEnv, node: &str) -> Vec<(&'static str, std::path::PathBuf)> {
    vec![
        ("kubelet", env.node_identity(node)),
        ("dedicated certificate", env.dedicated_node_identity(node)),
        (
            "ServiceAccount token bound to the Node",
            env.token_kubeconfig("shim-agent", Some(node)),
        ),
    ]
}

fn at() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `who`, acting for Node `me`, against slot `name` (free and open to begin with): every edit
/// of what is the coordinator's is refused, as is any write to another node's slot; the
/// agent's own edits (take, mark failed, release) are allowed. Leaves the slot free and open.
async fn holds_to_its_own_slot(
    who: &str,
    as_me: &Api<ShimLease>,
    (me, my_uid): (&str, &str),
    (other, other_uid): (&str, &str),
    admin: &Api<ShimLease>,
    name: &str,
) {
    let pp = PostParams::default();
    let denied = |r: Result<ShimLease, kube::Error>, what: &str, msg: &str| {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{who}: {what}: allowed"))
            .to_string();
        assert!(e.contains(msg), "{who}: {what}: {e}");
    };
    let coordinators = "only its holder, the times";
    let cur = admin.get(name).await.unwrap();
    let taken = lease_edits::take(cur.clone(), me, my_uid, at());
    // what belongs to the coordinator: the Shim it is a slot of, its owners, N, the close
    // mark, finalizers
    let mut e = taken.clone();
    e.labels_mut()
        .insert(SLOT_SHIM_LABEL.into(), "another-shim".into());
    denied(
        as_me.replace(name, &pp, &e).await,
        "move it to another Shim",
        coordinators,
    );
    let mut e = taken.clone();
    e.metadata
        .owner_references
        .as_mut()
        .unwrap()
        .retain(|o| o.kind == "Node");
    denied(
        as_me.replace(name, &pp, &e).await,
        "drop its Shim owner",
        coordinators,
    );
    let e = lease_edits::stamp(taken.clone(), Some(50), 0);
    denied(
        as_me.replace(name, &pp, &e).await,
        "stamp N = 50",
        coordinators,
    );
    // a node that shrinks the fleet others see sizes their claim windows to its advantage
    let mut e = taken.clone();
    e.annotations_mut().insert(SLOT_TARGETED.into(), "1".into());
    denied(
        as_me.replace(name, &pp, &e).await,
        "stamp 1 targeted node",
        coordinators,
    );
    let e = lease_edits::close(cur.clone(), Some(Closed::Budget));
    denied(as_me.replace(name, &pp, &e).await, "close it", coordinators);
    let mut e = taken.clone();
    e.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    denied(
        as_me.replace(name, &pp, &e).await,
        "add a finalizer",
        coordinators,
    );
    // the holder label names the holder; the freed-from mark is the coordinator's
    let mut e = taken.clone();
    e.labels_mut()
        .insert(SLOT_HOLDER_LABEL.into(), other.into());
    denied(
        as_me.replace(name, &pp, &e).await,
        "label it held by another",
        "must label a slot with its holder",
    );
    let mut e = taken.clone();
    e.annotations_mut().insert(SLOT_FREED.into(), other.into());
    denied(
        as_me.replace(name, &pp, &e).await,
        "write freed-from",
        "may remove but not write",
    );
    // a closed slot (a halt) is nobody's to take or to reopen
    let closed = admin
        .replace(name, &pp, &lease_edits::close(cur, Some(Closed::Halted)))
        .await
        .unwrap();
    denied(
        as_me
            .replace(
                name,
                &pp,
                &lease_edits::take(closed.clone(), me, my_uid, at()),
            )
            .await,
        "take a halted slot",
        "may not take a closed slot (containerd.x-k8s.io/slot-closed: halted)",
    );
    denied(
        as_me
            .replace(name, &pp, &lease_edits::close(closed.clone(), None))
            .await,
        "reopen a halted slot",
        coordinators,
    );
    let open = admin
        .replace(name, &pp, &lease_edits::close(closed, None))
        .await
        .unwrap();
    // another node's slot: not its to free, renew or mark
    let theirs = admin
        .replace(name, &pp, &held_by(&open, Some((other, other_uid))))
        .await
        .unwrap();
    denied(
        as_me
            .replace(name, &pp, &lease_edits::release(theirs.clone(), other))
            .await,
        "free another's",
        "free only its own",
    );
    // a patch is held to the same: the policy sees the slot before and after
    let freed = lease_edits::release(theirs.clone(), other);
    let patch = kube::api::Patch::<()>::Json(lease_edits::own_patch(&theirs, &freed, other));
    let e = as_me
        .patch(name, &kube::api::PatchParams::default(), &patch)
        .await
        .err()
        .unwrap_or_else(|| panic!("{who}: patch another's free: allowed"))
        .to_string();
    assert!(
        e.contains("free only its own"),
        "{who}: patch another's free: {e}"
    );
    denied(
        as_me
            .replace(
                name,
                &pp,
                &lease_edits::take(theirs.clone(), me, my_uid, at()),
            )
            .await,
        "take another's",
        "may take a free slot only for itself",
    );
    let f = Failure {
        generation: 1,
        resume: String::new(),
        reason: "forged".into(),
    };
    denied(
        as_me
            .replace(name, &pp, &lease_edits::mark_failed(theirs.clone(), &f))
            .await,
        "mark another's failed",
        &format!("may not renew or mark the slot of {other}"),
    );
    let open = admin
        .replace(name, &pp, &lease_edits::release(theirs, other))
        .await
        .unwrap();
    // a reservation is the coordinator's: no node writes, moves or drops it, and nobody
    // takes a slot reserved for another (a reservation cannot be used to steal)
    denied(
        as_me
            .replace(name, &pp, &lease_edits::reserve(open.clone(), Some(me)))
            .await,
        "reserve a slot for itself",
        coordinators,
    );
    let theirs = admin
        .replace(name, &pp, &lease_edits::reserve(open, Some(other)))
        .await
        .unwrap();
    denied(
        as_me
            .replace(
                name,
                &pp,
                &lease_edits::take(theirs.clone(), me, my_uid, at()),
            )
            .await,
        "take a slot reserved for another",
        &format!("may not take a slot reserved for {other}"),
    );
    denied(
        as_me
            .replace(
                name,
                &pp,
                &lease_edits::take(lease_edits::reserve(theirs.clone(), None), me, my_uid, at()),
            )
            .await,
        "drop another's reservation and take the slot",
        coordinators,
    );
    denied(
        as_me
            .replace(name, &pp, &lease_edits::reserve(theirs.clone(), Some(me)))
            .await,
        "move another's reservation to itself",
        coordinators,
    );
    let reserved = admin
        .replace(name, &pp, &lease_edits::reserve(theirs, Some(me)))
        .await
        .unwrap();
    let mine = as_me
        .replace(name, &pp, &lease_edits::take(reserved, me, my_uid, at()))
        .await
        .unwrap_or_else(|e| panic!("{who}: take the slot reserved for it: {e}"));
    let open = as_me
        .replace(name, &pp, &lease_edits::release(mine, me))
        .await
        .unwrap_or_else(|e| panic!("{who}: release it: {e}"));
    let open = admin
        .replace(name, &pp, &lease_edits::reserve(open, None))
        .await
        .unwrap();
    // what the agent does to its own: take, mark failed, release
    let mine = as_me
        .replace(name, &pp, &lease_edits::take(open, me, my_uid, at()))
        .await
        .unwrap_or_else(|e| panic!("{who}: take its own: {e}"));
    let mine = as_me
        .replace(name, &pp, &lease_edits::mark_failed(mine, &f))
        .await
        .unwrap_or_else(|e| panic!("{who}: mark its own failed: {e}"));
    let free = as_me
        .replace(name, &pp, &lease_edits::release(mine, me))
        .await
        .unwrap_or_else(|e| panic!("{who}: release its own: {e}"));
    assert_eq!(free.spec.holder_identity, None, "{who}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_node_identity_changes_what_of_a_slot_is_the_coordinators() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    env.create_node("kslots-a", &[("test", "kslots")]).await;
    env.create_node("kslots-b", &[("test", "kslots")]).await;
    let (ok, out) = env.apply(&shim());
    assert!(ok, "{out}");
    let admin_client = env.admin_client().await;
    let shim = Api::<Shim>::all(admin_client.clone())
        .get("kslots")
        .await
        .unwrap();
    let uid = |n: &'static str| {
        let nodes = Api::<Node>::all(admin_client.clone());
        async move { nodes.get(n).await.unwrap().uid().unwrap() }
    };
    let (uid_a, uid_b) = (uid("kslots-a").await, uid("kslots-b").await);
    let admin: Api<ShimLease> = Api::namespaced(admin_client.clone(), NAMESPACE);
    let name = slot_name("kslots", 1);
    let _ = admin.delete(&name, &DeleteParams::default()).await;
    let slot = lease_edits::create(&shim, 1, None, Some(2), 2);
    eventually(10, "the old slot gone", || async {
        admin.create(&PostParams::default(), &slot).await.ok()
    })
    .await;
    for (who, kubeconfig) in node_identities(env, "kslots-a") {
        let as_a: Api<ShimLease> = Api::namespaced(client_for(&kubeconfig).await, NAMESPACE);
        let (me, other) = (("kslots-a", uid_a.as_str()), ("kslots-b", uid_b.as_str()));
        holds_to_its_own_slot(who, &as_a, me, other, &admin, &name).await;
    }
    // a token bound to no Node acts for none, and writes no slot
    let unbound = client_for(&env.token_kubeconfig("shim-agent", None)).await;
    let cur = admin.get(&name).await.unwrap();
    let e = Api::<ShimLease>::namespaced(unbound, NAMESPACE)
        .replace(
            &name,
            &PostParams::default(),
            &lease_edits::take(cur, "kslots-a", &uid_a, at()),
        )
        .await
        .expect_err("an unbound token took a slot")
        .to_string();
    assert!(e.contains("acts for no node"), "{e}");
    let _ = Api::<Shim>::all(admin_client)
        .delete("kslots", &DeleteParams::default())
        .await;
}
