//! `shim-agent generate-reference --out-dir DIR` (a hidden command): the reference pages of
//! the documentation, generated from the code they describe so that they cannot drift from
//! it. `scripts/reference-docs` writes them into `docs/reference/`, where they are committed;
//! `tests/pure/reference_docs.rs` fails when a committed page differs from what this makes.
//!
//! - `crd.md`: every field of the custom resources, walked from each CRD's OpenAPI v3 schema
//!   (the one `shim-agent crd` prints): type, required, description, enum values, defaults,
//!   limits and the CEL rules with their messages;
//! - `cli.md`: every visible command with its usage and arguments, from the clap definition;
//! - `config.md`: every key of the config file with its type, default (the TOML of
//!   `Settings::default()`) and description (the doc comments, through a JSON schema);
//! - `metrics.md`: every metric with its type, labels and help, from the `# HELP`/`# TYPE`
//!   lines of the exposition after a series was made in each.
//!
//! Every page is deterministic, byte for byte: maps are walked in key order, nothing reads
//! the environment or the terminal.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

mod cli_page;
mod config;
mod crd;
mod metrics;
mod page;

pub use metrics::{metric_count, touch_every_metric};
pub use page::REGENERATE;

/// The page file names, in the order [`pages`] returns them.
pub const PAGES: [&str; 4] = ["crd.md", "cli.md", "config.md", "metrics.md"];

/// The four pages as (file name, Markdown), for the command line `cli` (the binary's
/// `Cli::command()`).
pub fn pages(cli: clap::Command) -> anyhow::Result<Vec<(&'static str, String)>> {
    Ok(vec![
        (PAGES[0], crd::crd_page()?),
        (PAGES[1], cli_page::cli_page(cli)),
        (PAGES[2], config::config_page()?),
        (PAGES[3], metrics::metrics_page()?),
    ])
}

/// Write the pages into `out_dir` (created if missing); the files written, in [`PAGES`] order.
pub fn generate(cli: clap::Command, out_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(out_dir).with_context(|| format!("cannot create {}", out_dir.display()))?;
    let mut written = Vec::new();
    for (name, text) in pages(cli)? {
        let path = out_dir.join(name);
        fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
