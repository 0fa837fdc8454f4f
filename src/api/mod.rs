//! The Kubernetes API of shim-agent: the `Shim` custom resource, its CRD, and the
//! manifests an operator applies (namespace, RBAC by role, admission policies); `ShimLease`
//! for coordination.

pub mod deployment;
pub mod extension;
pub mod lease;
pub mod load;
pub mod manifests;
mod meta;
pub mod names;
pub mod policies;
pub mod rbac;
pub mod runtime_class;
pub mod shim;
pub mod signature;

pub use runtime_class::*;
pub use shim::*;
