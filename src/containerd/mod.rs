//! The containerd config engine: register and unregister CRI runtime handlers in containerd's
//! TOML configuration without disturbing anything else.
//!
//! A **pure core** ([`plan_add`], [`plan_remove`], [`inspect`]: bytes in, an ordered [`Plan`] of
//! file changes out) and a **thin I/O shell** ([`load`], [`apply`]) that goes through
//! [`HostRoot`](crate::hostroot::HostRoot) and [`fsutil`](crate::fsutil) (temp file, fsync,
//! rename, fsync of the directory; mode and owner kept). The transaction engine can therefore
//! back up every file a plan touches before touching any.
//!
//! # Schema
//! `version` is read from the root table wherever it stands; missing means 1. Handler tables:
//! v1 `plugins.cri.containerd.runtimes.<h>`, v2 `plugins."io.containerd.grpc.v1.cri"…`, v3/v4
//! `plugins."io.containerd.cri.v1.runtime"…`. Other versions are refused. A handler is found
//! whatever its quoting or form (header, dotted keys, inline table): lookups go through
//! `toml_edit`'s key model, never through text search, and no header is ever added for a table
//! that exists (missing parents are created *implicit*, so they get no header either).
//! Each table on the path may be a header, dotted keys or an inline table; a handler is added
//! in the form of the deepest one that exists (`forms`): `[header]` tables, dotted keys next
//! to the existing ones, a `<h> = { ... }` line, or one more entry of the inline table (TOML
//! forbids extending an inline table from outside it; `inline`).
//!
//! # Decisions
//! Each decision is written down in the file that carries it out: keeping containerd 1.x's
//! default runtime, drop-ins only for config version ≥ 3, and what is refused in `plan.rs`;
//! who owns a handler (the marker comments) in `marks.rs`; how untouched bytes are kept in
//! `doc.rs`.
//!
//! # Caveats
//! A table on the path that is written as something else (a value, an array of tables) is
//! refused with `UnsupportedLayout` naming the key: containerd cannot read it either. Entries
//! the agent writes into an inline table are on its one line (containerd reads TOML 1.0); an
//! inline table written over several lines (TOML 1.1, refused by containerd 2.x) keeps its
//! layout. `--replace` of a user-defined handler is not undone by removal.

mod doc;
mod edit;
mod error;
mod forms;
pub mod images;
mod inline;
mod inspect;
mod io;
mod layout;
mod marks;
mod plan;
mod register;
mod schema;
mod spec;
pub mod template;

pub use error::ConfigError;
pub use inspect::{HandlerForm, HandlerInfo, Inspection, inspect};
pub use io::{apply, load};
pub use layout::{Current, Layout};
pub use plan::{
    AddOptions, ConfigFile, ConfigSet, DropinPolicy, FileChange, Plan, dropin_file_name,
};
pub use register::{plan_add, plan_adds, plan_remove, plan_removes};
pub use spec::{RuntimeSpec, item_to_json, validate_handler_name};
