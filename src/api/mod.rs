//! The Kubernetes API of shim-agent: the `Shim` custom resource, its CRD, and the
//! manifests an operator applies (namespace, RBAC); `ShimLease` for coordination.

pub mod extension;
pub mod lease;
pub mod load;
pub mod manifests;
pub mod shim;

pub use shim::*;
