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
//! - **Default runtime kept (1.x).** containerd 1.x replaces its default runtimes map with the
//!   file's `runtimes` table, so for config versions 1 and 2 with no handler at all the agent
//!   also writes `runc` explicitly, as containerd 1.6/1.7 define it by default:
//!   `runtime_type = "io.containerd.runc.v2"` and no `options` table. Unset options are exactly
//!   containerd's default (`SystemdCgroup = false`); a file with no runtimes table states no
//!   per-runtime cgroup setting anywhere, so nothing else is copied. That table is marked
//!   `# shim-agent: default runtime kept for handler <h>` and removed with the last handler that
//!   needs it (`tests/containerd_real.rs` checks with a real containerd 1.6.20 `config dump`
//!   that every handler of every v1/v2 corpus file survives). Existing handlers (whatever `default_runtime_name` is: `nvidia`, `shimpei`, …)
//!   are never touched. Version 3/4 files are only read by 2.x, which deep-merges: no runc.
//! - **Drop-ins only for config version ≥ 3.** On 1.x a drop-in replaces whole plugin sections:
//!   a v2 drop-in holding only `runtimes.spin` would remove runc and every CRI setting of the
//!   main file. A version 1/2 file may be read by 1.x, so it is always edited in place (and an
//!   explicit drop-in dir is refused with `DropinUnsafe`). Version ≥ 3 implies containerd 2.x,
//!   which deep-merges drop-ins; the drop-in carries the main file's version (2.3 refuses a
//!   drop-in newer than its root). In `Auto` mode a drop-in is used when the main file already
//!   imports a directory glob (k0s `/etc/k0s/containerd.d/*.toml`, containerd 2.2+
//!   `/etc/containerd/conf.d/*.toml`, EKS `config.d`, and beside a k3s/rke2 rendered file
//!   that is never edited, `config-v3.toml.d`: `template`); with an explicit dir and no covering
//!   import, the exact file path is imported (created first, import removed first).
//! - **Ownership.** Tables the agent adds carry `# shim-agent: handler <h>` in their header
//!   decor; dotted keys and `<h> = { ... }` lines carry it on a comment line before their first
//!   line; an entry inside an inline table, where no comment fits, on a comment line before the
//!   outermost inline table's line, one per handler (and one for a kept default runtime), so
//!   removal drops exactly the agent's entries, marker lines and separators and gives back the
//!   bytes. Only marked handlers are removed; a user-defined handler is refused (`NotOwned`),
//!   never deleted, and there is no force flag: the node owner removes it by hand. `--replace`
//!   rewrites a conflicting handler where it stands and marks it as the agent's.
//! - **Refusals.** Templates (`{{`, `{%`, `+++` front matter, `${VAR}`), parse errors (line and
//!   column), unknown versions, read-only or generated layouts (Flatcar `/usr`, Talos
//!   `/etc/cri/`, Bottlerocket `shimpei`, k3s/rke2/microk8s generated files, k0s-managed file
//!   edited in place), a disabled CRI plugin, runtime tables under another version's plugin ID,
//!   a non-glob import whose file is missing (containerd would not start). Only drop-ins the
//!   main file imports count as definitions of a handler.
//! - **Bytes.** Edits are rendered by `toml_edit` and spliced line by line into the original
//!   text, so untouched lines keep their bytes even where `toml_edit` would normalise them (a key
//!   quoted two ways, CRLF, a missing final newline). Every edited file is re-parsed and must
//!   read back as the edited document, with the handler exactly as wanted, before the plan is
//!   returned. Idempotence compares parsed values, with unset = default (`options = {}`,
//!   `pod_annotations = []`, `privileged_without_host_devices = false`).
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
mod inline;
mod inspect;
mod io;
mod layout;
mod plan;
mod schema;
mod spec;
pub mod template;

pub use error::ConfigError;
pub use inspect::{HandlerForm, HandlerInfo, Inspection, inspect};
pub use io::{apply, load};
pub use layout::{Current, Layout};
pub use plan::{
    AddOptions, ConfigFile, ConfigSet, DropinPolicy, FileChange, Plan, dropin_file_name, plan_add,
    plan_remove,
};
pub use spec::{RuntimeSpec, item_to_json, validate_handler_name};
