//! The RBAC of `shim-agent manifests`, by role (docs/design.md §7).
//!
//! - **Node agents** run on every node, with the kubelet's credentials (`system:node:<name>`,
//!   group `system:nodes`) or a dedicated identity held to one Node ([`AGENT_GROUP`] users
//!   named [`AGENT_USER_PREFIX`]`<node>`, or node-bound tokens of the [`SERVICE_ACCOUNT`]).
//!   Whatever `system:nodes` is granted, every kubelet of the cluster holds: so node agents get
//!   only what one node's work needs, and nothing a kubelet already holds through the Node
//!   authorizer (its own Node and pods, held there to its own: granted again through RBAC,
//!   every Node and pod). They read Shims, extensions and their own pods; write
//!   their own Node (label, state annotation), Events, their extension hook records, and
//!   update rollout slots (held to their own by an admission policy). No RuntimeClass, no
//!   Shim status or finalizer, no coordinator lease, no creating or deleting slots.
//! - **The coordinator** does the cluster-wide work: the finalizer, the RuntimeClasses, Shim
//!   status, slot creation and retirement, freeing deleted Nodes' slots. Only identities in
//!   [`COORDINATOR_GROUP`] (or the [`COORDINATOR_SERVICE_ACCOUNT`]) hold its verbs: an
//!   operator gives them to the agents of trusted nodes (`kubernetes.coordinator-kubeconfig`)
//!   or runs `shim-agent coordinate` elsewhere. A node's credential never carries them.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};

use super::lease::NAMESPACE;
use super::meta::meta;
use super::names::GROUP;

/// Group of dedicated node-agent identities (instead of the kubelet's).
pub const AGENT_GROUP: &str = "containerd.x-k8s.io:shim-agents";
/// How a dedicated node-agent certificate names its node: `<prefix><node>`.
pub const AGENT_USER_PREFIX: &str = "containerd.x-k8s.io:node:";
/// The node agents' ServiceAccount (in [`NAMESPACE`]): its tokens must be bound to a Node
/// (`kubectl create token shim-agent -n shim-agent-system --bound-object-kind Node
/// --bound-object-name <node>`), which holds them to that Node.
pub const SERVICE_ACCOUNT: &str = "shim-agent";
/// Group of coordinator identities.
pub const COORDINATOR_GROUP: &str = "containerd.x-k8s.io:coordinators";
/// The coordinator's ServiceAccount (in [`NAMESPACE`]), for `shim-agent coordinate` in-cluster.
pub const COORDINATOR_SERVICE_ACCOUNT: &str = "shim-agent-coordinator";
/// Name of the node agents' ClusterRole, Role and bindings.
pub const RBAC_NAME: &str = "shim-agent";
/// Name of the dedicated node identities' ClusterRole and binding (their own Node and pods).
pub const DEDICATED_RBAC_NAME: &str = "shim-agent-dedicated-node";
/// Name of the coordinator's ClusterRole, Role and bindings.
pub const COORDINATOR_RBAC_NAME: &str = "shim-agent-coordinator";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(v(groups)),
        resources: Some(v(resources)),
        verbs: v(verbs),
        ..Default::default()
    }
}

fn subject(kind: &str, name: &str) -> Subject {
    let namespaced = kind == "ServiceAccount";
    Subject {
        kind: kind.to_string(),
        name: name.to_string(),
        api_group: (!namespaced).then(|| "rbac.authorization.k8s.io".to_string()),
        namespace: namespaced.then(|| NAMESPACE.to_string()),
    }
}

/// The node agents: kubelets, dedicated node identities, the node agents' ServiceAccount.
pub fn node_subjects() -> Vec<Subject> {
    vec![
        subject("Group", "system:nodes"),
        subject("Group", AGENT_GROUP),
        subject("ServiceAccount", SERVICE_ACCOUNT),
    ]
}

/// The dedicated node identities: node agents that are not kubelets.
pub fn dedicated_node_subjects() -> Vec<Subject> {
    vec![
        subject("Group", AGENT_GROUP),
        subject("ServiceAccount", SERVICE_ACCOUNT),
    ]
}

/// The coordinators.
pub fn coordinator_subjects() -> Vec<Subject> {
    vec![
        subject("Group", COORDINATOR_GROUP),
        subject("ServiceAccount", COORDINATOR_SERVICE_ACCOUNT),
    ]
}

/// What every node's agent may do, cluster-wide (each verb's risk: docs/design.md §7).
pub fn node_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(RBAC_NAME, None),
        rules: Some(vec![
            // which Shims target this node
            rule(&[GROUP], &["shims"], &["list", "watch"]),
            // lifecycle hooks: a cache of the extensions, and each node hook call's result in
            // its status (the caller writes it); a `service` reference is resolved through
            // the API, as the agent on the host cannot use cluster DNS
            rule(&[GROUP], &["shimextensions"], &["get", "list", "watch"]),
            rule(&[GROUP], &["shimextensions/status"], &["patch", "update"]),
            rule(&[""], &["services"], &["get"]),
            rule(&["discovery.k8s.io"], &["endpointslices"], &["list"]),
            rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        ]),
        ..Default::default()
    }
}

/// What a dedicated node identity (not a kubelet) may do besides [`node_cluster_role`]: its
/// own Node and pods. A kubelet has these from the Node authorizer, which holds it to its own
/// Node and the pods bound to it (its lists and watches included); granted to `system:nodes`
/// through RBAC, which the API server asks as well, they let every kubelet list and watch
/// every Node and every pod of the cluster.
pub fn dedicated_node_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(DEDICATED_RBAC_NAME, None),
        rules: Some(vec![
            // its own Node: the Shim labels and the state annotation (the node-writes policy
            // holds it to its own Node)
            rule(&[""], &["nodes"], &["list", "watch", "patch"]),
            // its own Node's ShimsReady condition (the node-status policy holds it to that)
            rule(&[""], &["nodes/status"], &["patch"]),
            // pods on its own node (field selector spec.nodeName): uninstalls wait for the
            // pods that use the Shim's RuntimeClass (RBAC cannot hold a read to a selector)
            rule(&[""], &["pods"], &["list", "watch"]),
        ]),
        ..Default::default()
    }
}

/// What the coordinator may do, cluster-wide.
pub fn coordinator_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(COORDINATOR_RBAC_NAME, None),
        rules: Some(vec![
            // the finalizer in and out (the shim-writes policy allows nothing else)
            rule(&[GROUP], &["shims"], &["list", "watch", "patch"]),
            rule(&[GROUP], &["shims/status"], &["patch"]),
            // BeforeRollout: the extensions, their records, their Services
            rule(&[GROUP], &["shimextensions"], &["get", "list", "watch"]),
            rule(&[GROUP], &["shimextensions/status"], &["patch", "update"]),
            rule(&[""], &["services"], &["get"]),
            rule(&["discovery.k8s.io"], &["endpointslices"], &["list"]),
            // targets and the nodes' reports; startup taints off ready nodes (the node-taints
            // policy allows nothing else)
            rule(&[""], &["nodes"], &["list", "watch", "patch"]),
            // the Shims' RuntimeClasses (the runtimeclass policies hold it to those)
            rule(
                &["node.k8s.io"],
                &["runtimeclasses"],
                &["list", "watch", "create", "patch", "delete"],
            ),
            rule(&["", "events.k8s.io"], &["events"], &["create", "patch"]),
        ]),
        ..Default::default()
    }
}

/// ShimLeases, not coordination.k8s.io Leases: NodeRestriction lets a kubelet identity write
/// no Lease outside kube-node-lease (see api::lease). Nodes update slots (take) and patch
/// their own (renew, release, mark failed: a JSON Patch that tests the holder); the
/// coordinator also creates, retires and elects.
pub fn lease_roles() -> [Role; 2] {
    [
        Role {
            metadata: meta(RBAC_NAME, Some(NAMESPACE)),
            rules: Some(vec![rule(
                &[GROUP],
                &["shimleases"],
                &["get", "list", "watch", "update", "patch"],
            )]),
        },
        Role {
            metadata: meta(COORDINATOR_RBAC_NAME, Some(NAMESPACE)),
            rules: Some(vec![rule(
                &[GROUP],
                &["shimleases"],
                &["get", "list", "watch", "create", "update", "delete"],
            )]),
        },
    ]
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
    }
}

/// The three ClusterRoleBindings: node agents, dedicated node identities, coordinators.
pub fn cluster_role_bindings() -> [ClusterRoleBinding; 3] {
    [
        ClusterRoleBinding {
            metadata: meta(RBAC_NAME, None),
            role_ref: role_ref("ClusterRole", RBAC_NAME),
            subjects: Some(node_subjects()),
        },
        ClusterRoleBinding {
            metadata: meta(DEDICATED_RBAC_NAME, None),
            role_ref: role_ref("ClusterRole", DEDICATED_RBAC_NAME),
            subjects: Some(dedicated_node_subjects()),
        },
        ClusterRoleBinding {
            metadata: meta(COORDINATOR_RBAC_NAME, None),
            role_ref: role_ref("ClusterRole", COORDINATOR_RBAC_NAME),
            subjects: Some(coordinator_subjects()),
        },
    ]
}

/// The two RoleBindings in [`NAMESPACE`].
pub fn role_bindings() -> [RoleBinding; 2] {
    [
        RoleBinding {
            metadata: meta(RBAC_NAME, Some(NAMESPACE)),
            role_ref: role_ref("Role", RBAC_NAME),
            subjects: Some(node_subjects()),
        },
        RoleBinding {
            metadata: meta(COORDINATOR_RBAC_NAME, Some(NAMESPACE)),
            role_ref: role_ref("Role", COORDINATOR_RBAC_NAME),
            subjects: Some(coordinator_subjects()),
        },
    ]
}
