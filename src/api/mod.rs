//! The Kubernetes API of shim-agent: the `Shim` custom resource, its CRD, and the
//! manifests an operator applies (namespace, RBAC by role, admission policies); `ShimLease`
//! for coordination.

pub mod deployment;
pub mod extension;
pub mod lease;
pub mod load;
pub mod manifests;
pub mod names;
pub mod policies;
pub mod rbac;
pub mod runtime_class;
pub mod shim;
pub mod signature;

pub use runtime_class::*;
pub use shim::*;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Metadata with the project's name label.
pub(super) fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
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
