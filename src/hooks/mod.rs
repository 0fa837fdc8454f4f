//! Lifecycle hooks (docs/design.md §10): `ShimExtension`s that other systems serve over HTTPS
//! to defer or block a node's containerd restart, and to hear about its end.
//!
//! - [`wire`]: the request and response JSON, and the strict check of responses;
//! - [`decide`]: the pure core: failure policies and the deferral state machine;
//! - [`call`]: the I/O shell: extensions from a watch cache, HTTPS clients, Service resolution;
//! - [`node_hooks`]: `BeforeNodeRestart` / `AfterNodeChange` around the node's rollout slot
//!   gate;
//! - [`hold`]: `BeforeRollout`'s pure part (the hold, what the status persists, the folding
//!   of answers); [`rollout`]: its task shell, asked by the coordinator before a generation's
//!   slots open;
//! - [`record`]: each hook's last result in the extension's `status.hooks`.

pub mod call;
pub mod decide;
pub mod hold;
pub mod node_hooks;
pub mod record;
pub mod rollout;
pub mod wire;

pub use call::Hooks;
pub use node_hooks::{NodeHooks, Report};
