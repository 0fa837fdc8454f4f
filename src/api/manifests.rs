//! `shim-agent crd` and `shim-agent manifests`: the YAML an operator applies.
//!
//! The CRD is generated from the Rust types; `deploy/crd.yaml` and `deploy/manifests.yaml`
//! are the committed copies, and a test fails when either drifts from what this prints.
//!
//! Least privilege, by role (docs/design.md §7): the node agents' RBAC and the coordinator's
//! ([`super::rbac`]), and the admission policies that hold each identity to its own objects
//! ([`super::policies`]). A node's credential carries no cluster-wide power: whatever
//! `system:nodes` is granted, every kubelet of the cluster holds.

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::CustomResourceExt;
use serde::Serialize;

use super::extension::ShimExtension;
use super::lease::ShimLease;
use super::meta::meta;
use super::rbac::{self, COORDINATOR_SERVICE_ACCOUNT, SERVICE_ACCOUNT};
use super::shim::Shim;

pub use super::policies::{SHIM_WRITES_POLICY, SLOT_WRITES_POLICY};
pub use super::rbac::{AGENT_GROUP, COORDINATOR_GROUP, RBAC_NAME};

pub use super::lease::NAMESPACE;
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

/// A ValidatingAdmissionPolicy and the binding that makes it deny (with `params` from the
/// binding's `paramRef`, when it has them).
fn push_policy(
    out: &mut String,
    name: &str,
    policy: &serde_json::Value,
    params: Option<&serde_json::Value>,
) -> anyhow::Result<()> {
    const API: &str = "admissionregistration.k8s.io/v1";
    push_doc(out, API, "ValidatingAdmissionPolicy", policy)?;
    let mut spec = serde_json::json!({"policyName": name, "validationActions": ["Deny"]});
    if let Some(p) = params {
        spec["paramRef"] = p.clone();
    }
    push_doc(
        out,
        API,
        "ValidatingAdmissionPolicyBinding",
        &serde_json::json!({
            "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "shim-agent"}},
            "spec": spec,
        }),
    )
}

/// CRDs, namespace, ServiceAccounts, RBAC, admission policies and the coordinator's
/// Deployment as one YAML stream.
pub fn manifests_yaml() -> anyhow::Result<String> {
    const RBAC: &str = "rbac.authorization.k8s.io/v1";
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
    for name in [SERVICE_ACCOUNT, COORDINATOR_SERVICE_ACCOUNT] {
        push_doc(
            &mut out,
            "v1",
            "ServiceAccount",
            &ServiceAccount {
                metadata: meta(name, Some(NAMESPACE)),
                ..Default::default()
            },
        )?;
    }
    for role in [
        rbac::node_cluster_role(),
        rbac::dedicated_node_cluster_role(),
        rbac::coordinator_cluster_role(),
    ] {
        push_doc(&mut out, RBAC, "ClusterRole", &role)?;
    }
    for binding in rbac::cluster_role_bindings() {
        push_doc(&mut out, RBAC, "ClusterRoleBinding", &binding)?;
    }
    for role in rbac::lease_roles() {
        push_doc(&mut out, RBAC, "Role", &role)?;
    }
    for binding in rbac::role_bindings() {
        push_doc(&mut out, RBAC, "RoleBinding", &binding)?;
    }
    for (name, policy, params) in super::policies::policies() {
        push_policy(&mut out, name, &policy, params.as_ref())?;
    }
    push_doc(
        &mut out,
        "apps/v1",
        "Deployment",
        &super::deployment::coordinator_deployment(),
    )?;
    push_doc(
        &mut out,
        "policy/v1",
        "PodDisruptionBudget",
        &super::deployment::coordinator_disruption_budget(),
    )?;
    Ok(out)
}
