//! Read-only view of a config set: what `shim-agent containerd show` prints.

use std::path::PathBuf;

use toml_edit::Item;

use super::edit;
use super::error::ConfigError;
use super::marks::Mark;
use super::plan::{self, ConfigSet, dropin_file_name};
use super::schema;

/// How a handler table is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerForm {
    /// `[...runtimes.<h>]` header.
    Table,
    /// `runtimes.<h>.key = ...` dotted keys.
    Dotted,
    /// `<h> = { ... }` inline table.
    Inline,
}

/// One runtime handler found in the config set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerInfo {
    /// Handler name (the CRI RuntimeHandler).
    pub name: String,
    /// Its `runtime_type`, when set.
    pub runtime_type: Option<String>,
    /// File that defines it.
    pub file: PathBuf,
    /// How it is written.
    pub form: HandlerForm,
    /// Added by shim-agent (`# shim-agent: handler`), kept by it as the default
    /// (`# shim-agent: default runtime kept`), or user-defined.
    pub owner: &'static str,
}

/// What the engine sees in a config set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspection {
    /// Config version (1 when the key is missing).
    pub version: i64,
    /// TOML path of the runtimes table for that version.
    pub plugin_path: String,
    /// `default_runtime_name`, when set.
    pub default_runtime: Option<String>,
    /// Handlers of the main file, then of each drop-in.
    pub handlers: Vec<HandlerInfo>,
    /// The main file's `imports`.
    pub imports: Vec<String>,
    /// The drop-in directory a new handler would go to (`None`: the main file, in place).
    pub dropin_dir: Option<PathBuf>,
}

/// Inspect a config set (the same checks as planning: templates etc. are errors).
pub fn inspect(set: &ConfigSet) -> Result<Inspection, ConfigError> {
    let main = plan::analyze_main(&set.main)?;
    let version = main.version;
    let mut files = vec![main];
    for d in &set.dropins {
        files.push(plan::analyze_dropin(d, version)?);
    }
    let mut handlers = Vec::new();
    for f in &files {
        let Some(rt) = edit::runtimes_item(&f.doc.doc, f.version).and_then(Item::as_table_like)
        else {
            continue;
        };
        for (name, item) in rt.iter() {
            let form = match item {
                Item::Table(t) if t.is_dotted() => HandlerForm::Dotted,
                Item::Table(_) => HandlerForm::Table,
                _ => HandlerForm::Inline,
            };
            handlers.push(HandlerInfo {
                name: name.to_string(),
                runtime_type: item
                    .as_table_like()
                    .and_then(|t| t.get("runtime_type"))
                    .and_then(Item::as_str)
                    .map(str::to_string),
                file: f.path.clone(),
                form,
                owner: match edit::handler_mark(&f.doc.doc, f.version, name) {
                    Mark::Handler(_) => "shim-agent",
                    Mark::Kept(_) => "shim-agent (default kept)",
                    Mark::None => "user",
                },
            });
        }
    }
    let main = &files[0];
    let root = main.doc.doc.as_table();
    let imports = schema::string_array(root.get("imports"));
    let base = main.path.parent().unwrap_or(std::path::Path::new("/"));
    let dropin_dir = if version.0 >= 3 {
        imports
            .iter()
            .find_map(|i| plan::glob_dir(base, i, &dropin_file_name("x")))
    } else {
        None
    };
    let default_runtime = schema::get_path(
        root,
        &[
            "plugins",
            schema::runtime_plugin_id(version),
            "containerd",
            "default_runtime_name",
        ],
    )
    .and_then(Item::as_str)
    .map(str::to_string);
    Ok(Inspection {
        version: version.0,
        plugin_path: schema::runtimes_path_display(version),
        default_runtime,
        handlers,
        imports,
        dropin_dir,
    })
}
