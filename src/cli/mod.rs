//! The command line's library half: what `shim-agent containerd …`, `install --root`,
//! `uninstall --root` and `status` do, kept out of `main.rs` so tests reach them.

pub mod containerd;
pub mod coordinate;
pub mod docs;
pub mod image;
pub mod reference;
pub mod status;
