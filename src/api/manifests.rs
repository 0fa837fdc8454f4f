//! `shim-agent crd` and `shim-agent manifests`: the YAML an operator applies.
//!
//! The CRD is generated from the Rust types; `deploy/crd.yaml` and `deploy/manifests.yaml`
//! are the committed copies, and a test fails when either drifts from what this prints.
//!
//! RBAC is least privilege for the agent identity (docs/design.md §7). The agent runs either with
//! the node's kubelet credentials (user `system:node:<name>`, group `system:nodes`, already
//! confined to its own Node by the NodeRestriction admission plugin) or with a dedicated
//! kubeconfig whose user is in the group [`AGENT_GROUP`]. Every agent may be elected
//! coordinator, so every agent gets the coordinator's verbs; none of them can read Secrets,
//! or write anything outside the Shim API, its own Node, RuntimeClasses, Events and the
//! ShimLeases in [`NAMESPACE`]. Pods are read (list/watch) only to see which pods on the
//! node use a Shim's RuntimeClass; a kubelet identity is further confined to its own node's
//! pods by the Node authorizer.

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResourceExt;
use serde::Serialize;

use super::Shim;
use super::extension::ShimExtension;
use super::lease::ShimLease;

/// Namespace holding the rollout Leases.
pub const NAMESPACE: &str = "shim-agent-system";
/// Group for agents that use a dedicated kubeconfig instead of the kubelet's.
pub const AGENT_GROUP: &str = "containerd.x-k8s.io:shim-agents";
/// Name of the ClusterRole, Role and bindings.
pub const RBAC_NAME: &str = "shim-agent";

/// The CRDs (Shim, ShimLease, ShimExtension) as one YAML stream.
pub fn crd_yaml() -> anyhow::Result<String> {
    let mut out = String::new();
    push_doc(
        &mut out,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        &Shim::crd(),
    )?;
    push_doc(
        &mut out,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        &ShimLease::crd(),
    )?;
    push_doc(
        &mut out,
        "apiextensions.k8s.io/v1",
        "CustomResourceDefinition",
        &ShimExtension::crd(),
    )?;
    Ok(out)
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(v(groups)),
        resources: Some(v(resources)),
        verbs: v(verbs),
        ..Default::default()
    }
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(
            [(
                "app.kubernetes.io/name".to_string(),
                "shim-agent".to_string(),
            )]
            .into(),
        ),
        ..Default::default()
    }
}

/// The dedicated ServiceAccount (in [`NAMESPACE`]) for agents that do not use the kubelet's
/// credentials, e.g. with a token minted by `kubectl create token`.
pub const SERVICE_ACCOUNT: &str = "shim-agent";

fn subjects() -> Vec<Subject> {
    let mut out: Vec<Subject> = [("Group", "system:nodes"), ("Group", AGENT_GROUP)]
        .into_iter()
        .map(|(kind, name)| Subject {
            kind: kind.to_string(),
            name: name.to_string(),
            api_group: Some("rbac.authorization.k8s.io".to_string()),
            ..Default::default()
        })
        .collect();
    out.push(Subject {
        kind: "ServiceAccount".to_string(),
        name: SERVICE_ACCOUNT.to_string(),
        namespace: Some(NAMESPACE.to_string()),
        ..Default::default()
    });
    out
}

fn cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(RBAC_NAME, None),
        rules: Some(vec![
            // every agent watches every Shim; the coordinator patches the finalizer in and out
            rule(
                &["containerd.x-k8s.io"],
                &["shims"],
                &["list", "watch", "patch"],
            ),
            // only the coordinator writes status, at most every few seconds
            rule(&["containerd.x-k8s.io"], &["shims/status"], &["patch"]),
            // lifecycle hooks: every agent keeps a cache of the extensions (one watch, no
            // request per restart) and resolves a `service` reference through the API, as
            // the agent on the host cannot use cluster DNS (api::extension)
            rule(
                &["containerd.x-k8s.io"],
                &["shimextensions"],
                &["get", "list", "watch"],
            ),
            // ...and records each call's result in its status (`status.hooks`: the caller
            // writes it, a node for its node hooks); the spec stays the operator's
            rule(
                &["containerd.x-k8s.io"],
                &["shimextensions/status"],
                &["patch", "update"],
            ),
            rule(&[""], &["services"], &["get"]),
            rule(&["discovery.k8s.io"], &["endpointslices"], &["list"]),
            // own Node: label and state annotation (NodeRestriction confines kubelet
            // identities to it); the coordinator watches all Nodes to count targets
            rule(&[""], &["nodes"], &["list", "watch", "patch"]),
            // pods on the agent's own node (field selector spec.nodeName): uninstalls wait
            // for the pods that use the Shim's RuntimeClass
            rule(&[""], &["pods"], &["list", "watch"]),
            // the coordinator applies (create/patch) and deletes the Shims' RuntimeClasses
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

fn lease_role() -> Role {
    Role {
        metadata: meta(RBAC_NAME, Some(NAMESPACE)),
        // ShimLeases, not coordination.k8s.io Leases: NodeRestriction lets a kubelet
        // identity write no Lease outside kube-node-lease (see api::lease).
        rules: Some(vec![rule(
            &["containerd.x-k8s.io"],
            &["shimleases"],
            &["get", "list", "watch", "create", "update", "delete"],
        )]),
    }
}

fn role_ref(kind: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".to_string(),
        kind: kind.to_string(),
        name: RBAC_NAME.to_string(),
    }
}

fn push_doc<T: Serialize>(
    out: &mut String,
    api_version: &str,
    kind: &str,
    obj: &T,
) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(obj)?;
    if let Some(m) = v.as_object_mut() {
        // k8s-openapi types serialize apiVersion/kind themselves; set them explicitly anyway
        // so the output does not depend on that.
        let mut ordered = serde_json::Map::new();
        ordered.insert("apiVersion".into(), api_version.into());
        ordered.insert("kind".into(), kind.into());
        for (k, val) in m.iter() {
            if k != "apiVersion" && k != "kind" {
                ordered.insert(k.clone(), val.clone());
            }
        }
        v = serde_json::Value::Object(ordered);
    }
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(&v)?);
    Ok(())
}

/// Name of the ValidatingAdmissionPolicy (and its binding) on agents' writes to Shims.
pub const SHIM_WRITES_POLICY: &str = "shim-agent-shim-writes";

/// RBAC cannot tell a finalizer patch from a spec patch, so this policy confines agent
/// identities (kubelets in `system:nodes`, or [`AGENT_GROUP`]) to adding and removing the
/// `containerd.x-k8s.io/cleanup` finalizer: spec, labels and annotations stay the operator's.
/// Status is a subresource and is not matched.
fn shim_writes_policy() -> serde_json::Value {
    let finalizers = |o: &str| {
        format!(
            "{o}.metadata.?finalizers.orValue([]).filter(f, f != 'containerd.x-k8s.io/cleanup')"
        )
    };
    serde_json::json!({
        "metadata": {"name": SHIM_WRITES_POLICY, "labels": {"app.kubernetes.io/name": "shim-agent"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["containerd.x-k8s.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["UPDATE"],
                "resources": ["shims"],
            }]},
            "matchConditions": [{
                "name": "shim-agent-identity",
                "expression": format!("request.userInfo.groups.exists(g, g == 'system:nodes' || g == '{AGENT_GROUP}') || request.userInfo.username == 'system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}'"),
            }],
            "validations": [
                {
                    "expression": "object.spec == oldObject.spec",
                    "message": "shim-agent identities may not change a Shim's spec",
                },
                {
                    "expression": "object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({}) && object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({})",
                    "message": "shim-agent identities may not change a Shim's labels or annotations",
                },
                {
                    "expression": format!("{} == {}", finalizers("object"), finalizers("oldObject")),
                    "message": "shim-agent identities may only add or remove the containerd.x-k8s.io/cleanup finalizer",
                },
            ],
        },
    })
}

/// Name of the ValidatingAdmissionPolicy (and its binding) on kubelet identities' writes to
/// rollout slots.
pub const SLOT_WRITES_POLICY: &str = "shim-agent-slot-writes";

/// A kubelet identity (`system:node:<name>`) may take a free slot only for itself and free
/// only its own; it adds or removes only its own Node as the slot's owner, and leaves another
/// holder's renewals and failure mark alone. The one exception is how a deleted Node's slot
/// is freed: the holder takes the slot with its Node as an owner; when that Node is deleted,
/// Kubernetes' garbage collector (not a node) removes the dangling owner reference, and a
/// slot whose holder is no longer among its owners may be freed by the coordinator.
/// Slots are the ShimLeases labelled `containerd.x-k8s.io/slot-of`; the coordinator's own
/// Lease follows client-go's election rules and is not matched.
fn slot_writes_policy() -> serde_json::Value {
    let label = crate::cluster::slots::SLOT_SHIM_LABEL;
    let failed = crate::cluster::slots::SLOT_FAILED;
    serde_json::json!({
        "metadata": {"name": SLOT_WRITES_POLICY, "labels": {"app.kubernetes.io/name": "shim-agent"}},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": ["containerd.x-k8s.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE", "DELETE"],
                "resources": ["shimleases"],
            }]},
            "matchConditions": [
                {"name": "kubelet-identity", "expression": "request.userInfo.username.startsWith('system:node:')"},
                {"name": "rollout-slot", "expression": format!("'{label}' in (request.operation == 'DELETE' ? oldObject : object).metadata.?labels.orValue({{}})")},
            ],
            "variables": [
                {"name": "me", "expression": "request.userInfo.username.substring(12)"},
                {"name": "was", "expression": "request.operation == 'CREATE' ? '' : oldObject.spec.?holderIdentity.orValue('')"},
                {"name": "now", "expression": "request.operation == 'DELETE' ? '' : object.spec.?holderIdentity.orValue('')"},
                {"name": "oldOwners", "expression": "request.operation == 'CREATE' ? [] : oldObject.metadata.?ownerReferences.orValue([]).filter(r, r.kind == 'Node').map(r, r.name)"},
                {"name": "newOwners", "expression": "request.operation == 'DELETE' ? [] : object.metadata.?ownerReferences.orValue([]).filter(r, r.kind == 'Node').map(r, r.name)"},
            ],
            "validations": [
                {
                    "expression": "variables.was == variables.now || (variables.was == '' && variables.now == variables.me) || (variables.was == variables.me && variables.now == '') || (variables.now == '' && !(variables.was in variables.oldOwners))",
                    "messageExpression": "'node ' + variables.me + ' may take a free slot only for itself and free only its own: holder ' + (variables.was == '' ? '(none)' : variables.was) + ' -> ' + (variables.now == '' ? '(none)' : variables.now)",
                },
                {
                    "expression": "variables.newOwners.filter(n, n != variables.me) == variables.oldOwners.filter(n, n != variables.me)",
                    "messageExpression": "'node ' + variables.me + ' may add or remove only its own Node as an owner of a slot'",
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || variables.was == '' || variables.was == variables.me || variables.was != variables.now || (object.spec == oldObject.spec && object.metadata.?annotations[?'{failed}'].orValue('') == oldObject.metadata.?annotations[?'{failed}'].orValue(''))"),
                    "messageExpression": "'node ' + variables.me + ' may not renew or mark the slot of ' + variables.was",
                },
            ],
        },
    })
}

/// A ValidatingAdmissionPolicy and the binding that makes it deny.
fn push_policy(out: &mut String, name: &str, policy: &serde_json::Value) -> anyhow::Result<()> {
    const API: &str = "admissionregistration.k8s.io/v1";
    push_doc(out, API, "ValidatingAdmissionPolicy", policy)?;
    push_doc(
        out,
        API,
        "ValidatingAdmissionPolicyBinding",
        &serde_json::json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "shim-agent"}},
            "spec": {"policyName": name, "validationActions": ["Deny"]},
        }),
    )
}

/// CRD, namespace and RBAC as one multi-document YAML stream.
pub fn manifests_yaml() -> anyhow::Result<String> {
    let mut out = String::new();
    out.push_str(&crd_yaml()?);
    push_doc(
        &mut out,
        "v1",
        "Namespace",
        &Namespace {
            metadata: meta(NAMESPACE, None),
            ..Default::default()
        },
    )?;
    push_doc(
        &mut out,
        "v1",
        "ServiceAccount",
        &k8s_openapi::api::core::v1::ServiceAccount {
            metadata: meta(SERVICE_ACCOUNT, Some(NAMESPACE)),
            ..Default::default()
        },
    )?;
    push_doc(
        &mut out,
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        &cluster_role(),
    )?;
    push_doc(
        &mut out,
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        &ClusterRoleBinding {
            metadata: meta(RBAC_NAME, None),
            role_ref: role_ref("ClusterRole"),
            subjects: Some(subjects()),
        },
    )?;
    push_doc(
        &mut out,
        "rbac.authorization.k8s.io/v1",
        "Role",
        &lease_role(),
    )?;
    push_doc(
        &mut out,
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        &RoleBinding {
            metadata: meta(RBAC_NAME, Some(NAMESPACE)),
            role_ref: role_ref("Role"),
            subjects: Some(subjects()),
        },
    )?;
    push_policy(&mut out, SHIM_WRITES_POLICY, &shim_writes_policy())?;
    push_policy(&mut out, SLOT_WRITES_POLICY, &slot_writes_policy())?;
    Ok(out)
}
