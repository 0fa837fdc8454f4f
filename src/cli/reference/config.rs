//! The config file page: every key with its type, default and description.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::{Context, bail};
use serde_json::Value;

use super::page::*;
use crate::settings::Settings;

pub(super) fn config_page() -> anyhow::Result<String> {
    let schema = serde_json::to_value(schemars::schema_for!(Settings))?;
    let defaults = toml_edit::ser::to_document(&Settings::default())
        .context("cannot serialize the default settings")?;
    let mut out = header(
        "Configuration file",
        "the `Settings` types (`src/settings/mod.rs`): their doc comments and `Settings::default()`",
    );
    out.push_str(
        "\nThe agent reads `/etc/shim-agent/config.toml` (or the file given with `--config`), \
         then every `config.d/*.toml` beside it in lexical order: a later file overrides the \
         keys it sets. Every key is optional; an unknown key is an error. The packages ship \
         `packaging/config.toml` as `/etc/shim-agent/config.toml`: these defaults, commented \
         out.\n",
    );
    let tables: Vec<(&str, &toml_edit::Item)> = defaults.iter().collect();
    out.push('\n');
    for (table, _) in &tables {
        let _ = writeln!(out, "- [`[{table}]`](#{})", slug(table));
    }
    for (table, item) in tables {
        let table_schema = resolve(&schema, &schema["properties"][table]);
        let Some(keys) = item.as_table_like() else {
            bail!("settings: `{table}` is not a table");
        };
        let _ = writeln!(out, "\n## {table}\n");
        if let Some(d) = table_schema["description"].as_str() {
            let _ = writeln!(out, "{}\n", prose(d, false));
        }
        let _ = writeln!(
            out,
            "| Key | Type | Default | Description |\n|---|---|---|---|"
        );
        for (key, value) in keys.iter() {
            let key_schema = resolve(&schema, &table_schema["properties"][key]);
            let Some(description) = key_schema["description"].as_str() else {
                bail!("settings: `{table}.{key}` has no doc comment (src/settings/mod.rs)");
            };
            let default = value
                .as_value()
                .map(|v| v.to_string().trim().to_string())
                .with_context(|| format!("settings: `{table}.{key}` is not a value"))?;
            let ty = key_schema["type"]
                .as_str()
                .map(str::to_string)
                .or_else(|| {
                    key_schema["type"].as_array().map(|t| {
                        t.iter()
                            .filter_map(Value::as_str)
                            .collect::<Vec<_>>()
                            .join(" or ")
                    })
                })
                .unwrap_or_else(|| "any".into());
            let _ = writeln!(
                out,
                "| {} | {ty} | {} | {} |",
                code(key, true),
                code(&default, true),
                prose(description, true)
            );
        }
        // every key of the schema is in the serialized defaults, and the other way round
        let schema_keys: BTreeSet<&str> = table_schema["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        let default_keys: BTreeSet<&str> = keys.iter().map(|(k, _)| k).collect();
        if schema_keys != default_keys {
            bail!(
                "settings: `[{table}]` keys differ between the schema {schema_keys:?} and the defaults {default_keys:?}"
            );
        }
    }
    Ok(out)
}

/// `schema` itself, or what its `$ref` (`#/$defs/Name`) points at.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"]
        .as_str()
        .and_then(|r| r.strip_prefix("#/$defs/"))
    {
        Some(name) => &root["$defs"][name],
        None => schema,
    }
}

// ---------------------------------------------------------------------------------------------
// metrics.md
