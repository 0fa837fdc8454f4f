//! Lifecycle hooks (docs/design.md §10): `ShimExtension`s that other systems serve over HTTPS
//! to defer or block a node's containerd restart, and to hear about its end.
//!
//! - [`wire`]: the request and response JSON, and the strict check of responses;
//! - [`decide`]: the pure core: failure policies and the deferral state machine;
//! - [`call`]: the I/O shell: extensions from a watch cache, HTTPS clients, Service resolution;
//! - [`gate`]: `BeforeNodeRestart` / `AfterNodeChange` around the node's rollout slot;
//! - [`rollout`]: `BeforeRollout`, asked by the coordinator before a generation's slots open;
//! - [`record`]: each hook's last result in the extension's `status.hooks`.

pub mod call;
pub mod decide;
pub mod gate;
pub mod record;
pub mod rollout;
pub mod wire;

pub use call::Hooks;
pub use gate::{HookGate, Report};
