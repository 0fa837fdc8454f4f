//! Fetching, verifying and unpacking shim artifacts, the content-addressed store, and
//! placing the shim binary on the host.
//!
//! The flow, one call each:
//! 1. [`FetchSpec::resolve`] picks the source for the node's [`Platform`]
//!    ([`node_platform`]) and the [`ContainerdVersion`] it runs;
//! 2. [`Fetcher::fetch`] (or [`Fetcher::fetch_into_store`] /
//!    [`Fetcher::fetch_oci_into_store`]) downloads, hashes and unpacks in one streaming
//!    pass into [`Store`] `<state>/store/sha256/<digest>/`, once per node;
//! 3. [`find_shim_binary`] picks the shim in the tree and checks its ELF header;
//! 4. [`place_tree`] installs the whole tree at `/opt/shim-agent/shims/<shim>/<sha256>/`,
//!    the shim inside it ([`place_binary`] places a lone binary there).
//!
//! [`configure`] applies the agent's fetch settings to a [`Fetcher`] and a Shim's
//! `fetchStrategy` to a [`FetchSpec`].
//!
//! Every failure is an [`ArtifactError`] with a stable [`reason`](ArtifactError::reason),
//! and leaves nothing new in the store or under `/opt`.

mod builds;
pub mod configure;
pub mod credential_exec;
pub mod credentials;
mod elf;
mod error;
mod fetch;
mod fetcher;
mod format;
mod links;
mod oci;
pub mod oci_attached;
pub mod oci_signature;
mod paths;
mod pipeline;
mod place;
mod progress;
mod proxy;
pub mod registry_hosts;
pub mod signed;
mod source;
mod store;
mod tree;
pub mod unpack;

pub use builds::{ContainerdRange, ContainerdVersion, VersionError};
pub use elf::{check_elf, machine_for_arch};
pub use error::ArtifactError;
pub use fetcher::{Fetcher, Limits, RetryPolicy};
pub use links::{LinkReport, ResolvedLibrary, check_links};
pub use place::{PlacedBinary, SHIMS_DIR, find_shim_binary, is_shim_name, place_binary};
pub use source::{
    ArtifactSource, FetchSpec, OciAuth, OciSource, Platform, PlatformSource, ResolvedSource,
    node_platform, parse_sha256,
};
pub use store::{Store, StoredArtifact};
pub use tree::{PlacedTree, place_tree, relative_in, resolve_option_paths, version_dir};
