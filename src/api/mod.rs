//! The Kubernetes API of shim-agent: the `Shim` custom resource, its CRD, and the
//! manifests an operator applies (namespace, RBAC by role, admission policies); `ShimLease`
//! for coordination.

pub mod extension;
pub mod lease;
pub mod load;
pub mod manifests;
pub mod policies;
pub mod rbac;
pub mod shim;

pub use shim::*;
