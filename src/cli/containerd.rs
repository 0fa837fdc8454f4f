//! `shim-agent containerd …`: register, unregister and show runtime handlers in containerd's
//! configuration by hand (the same engine the agent uses).

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};

use crate::containerd::{self, AddOptions, DropinPolicy, Plan, RuntimeSpec};
use crate::hostroot::HostRoot;

/// containerd configuration commands.
#[derive(Debug, Subcommand)]
pub enum ContainerdCmd {
    /// Register a runtime handler (a shim) in containerd's config.
    ///
    /// Adds `[plugins.<CRI plugin>.containerd.runtimes.<NAME>]` with the right plugin ID for the
    /// file's config version, keeping every comment and setting. Running it twice changes
    /// nothing. containerd must be restarted to pick the change up.
    AddRuntime(AddArgs),
    /// Unregister a runtime handler that shim-agent added.
    ///
    /// Restores the file to its bytes before the handler was added. Handlers written by
    /// someone else are never removed.
    RemoveRuntime {
        /// containerd's main config file.
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/etc/containerd/config.toml"
        )]
        config: PathBuf,
        /// Handler name to remove.
        #[arg(long, value_name = "NAME")]
        handler: String,
        /// Print what would change without writing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Show the config version, where handlers live, the handlers, imports and drop-in mode.
    Show {
        /// containerd's main config file.
        #[arg(
            long,
            value_name = "PATH",
            default_value = "/etc/containerd/config.toml"
        )]
        config: PathBuf,
    },
}

/// Arguments of `add-runtime`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("shim").required(true).multiple(true)
    .args(["runtime_path", "runtime_type"]))]
pub struct AddArgs {
    /// containerd's main config file (the one containerd is started with).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/etc/containerd/config.toml"
    )]
    config: PathBuf,
    /// Handler name: the `handler` of the RuntimeClass (lowercase letters, digits, '-').
    #[arg(long, value_name = "NAME")]
    handler: String,
    /// Absolute path of the shim binary (e.g. /opt/shims/containerd-shim-spin-v2); the runtime
    /// type is derived from its name unless --runtime-type is given.
    #[arg(long, value_name = "BIN")]
    runtime_path: Option<String>,
    /// Runtime type, e.g. io.containerd.spin.v2, or an absolute path to the shim.
    #[arg(long, value_name = "TYPE")]
    runtime_type: Option<String>,
    /// A shim option, KEY=VALUE (VALUE as TOML: true, 5, "x"; else a string). Repeatable.
    #[arg(long = "option", value_name = "KEY=VALUE")]
    options: Vec<String>,
    /// A pod annotation (prefix) passed to the shim. Repeatable.
    #[arg(long = "pod-annotation", value_name = "A")]
    pod_annotations: Vec<String>,
    /// Set privileged_without_host_devices.
    #[arg(long)]
    privileged_without_host_devices: bool,
    /// Overwrite a handler of the same name that has different settings.
    #[arg(long)]
    replace: bool,
    /// Write the handler as a drop-in in DIR (config version 3 or later only).
    #[arg(long, value_name = "DIR", conflicts_with = "no_dropin")]
    dropin_dir: Option<PathBuf>,
    /// Always edit the main file in place, even when it imports a drop-in directory.
    #[arg(long)]
    no_dropin: bool,
    /// Print which files would change, without writing.
    #[arg(long, conflicts_with = "diff")]
    dry_run: bool,
    /// Print a unified diff of every change, without writing.
    #[arg(long)]
    diff: bool,
}

/// Run a containerd subcommand against the host under `root`.
pub fn run(cmd: ContainerdCmd, root: &HostRoot) -> anyhow::Result<()> {
    match cmd {
        ContainerdCmd::AddRuntime(a) => add_runtime(a, root),
        ContainerdCmd::RemoveRuntime {
            config,
            handler,
            dry_run,
        } => {
            let set = containerd::load(root, &config, None)?;
            let plan = containerd::plan_remove(&set, &handler)?;
            finish(root, &plan, dry_run, false)
        }
        ContainerdCmd::Show { config } => {
            let set = containerd::load(root, &config, None)?;
            print!("{}", format_inspection(&containerd::inspect(&set)?));
            Ok(())
        }
    }
}

fn add_runtime(a: AddArgs, root: &HostRoot) -> anyhow::Result<()> {
    let mut spec = match (&a.runtime_path, &a.runtime_type) {
        (Some(p), None) => RuntimeSpec::from_binary(&a.handler, p),
        (p, Some(t)) => RuntimeSpec {
            handler: a.handler.clone(),
            runtime_type: t.clone(),
            runtime_path: p.clone(),
            ..RuntimeSpec::default()
        },
        (None, None) => anyhow::bail!("give --runtime-path or --runtime-type"),
    };
    for o in &a.options {
        let (k, v) = parse_option(o)?;
        spec.options.insert(k, v);
    }
    spec.pod_annotations = a.pod_annotations.clone();
    spec.privileged_without_host_devices = a.privileged_without_host_devices;
    let dropin = match (&a.dropin_dir, a.no_dropin) {
        (Some(d), _) => DropinPolicy::Dir(d.clone()),
        (None, true) => DropinPolicy::Never,
        (None, false) => DropinPolicy::Auto,
    };
    let set = containerd::load(root, &a.config, a.dropin_dir.as_deref())?;
    let opts = AddOptions {
        replace: a.replace,
        dropin,
    };
    let plan = containerd::plan_add(&set, &spec, &opts)?;
    finish(root, &plan, a.dry_run, a.diff)
}

fn finish(root: &HostRoot, plan: &Plan, dry_run: bool, diff: bool) -> anyhow::Result<()> {
    if plan.is_empty() {
        println!("nothing to change");
        return Ok(());
    }
    if diff {
        for c in &plan.changes {
            let before = String::from_utf8_lossy(c.before.as_deref().unwrap_or_default());
            let after = String::from_utf8_lossy(c.after.as_deref().unwrap_or_default());
            let name = c.host_path.display().to_string();
            print!("{}", unified_diff(&before, &after, &name));
        }
        return Ok(());
    }
    for c in &plan.changes {
        let what = match (&c.before, &c.after) {
            (None, Some(_)) => "create",
            (Some(_), Some(_)) => "update",
            _ => "delete",
        };
        println!(
            "{}{what} {}",
            if dry_run { "would " } else { "" },
            c.host_path.display()
        );
    }
    if !dry_run {
        containerd::apply(root, plan).context("failed to write containerd's config")?;
        println!("restart containerd to apply the change");
    }
    Ok(())
}

/// `KEY=VALUE`: VALUE parsed as a TOML value, else taken as a string.
fn parse_option(o: &str) -> anyhow::Result<(String, serde_json::Value)> {
    let (k, v) = o
        .split_once('=')
        .with_context(|| format!("--option `{o}`: expected KEY=VALUE"))?;
    anyhow::ensure!(!k.trim().is_empty(), "--option `{o}`: empty key");
    let parsed = v
        .parse::<toml_edit::Value>()
        .ok()
        .map(|tv| containerd::item_to_json(&toml_edit::Item::Value(tv)));
    Ok((
        k.trim().to_string(),
        parsed.unwrap_or_else(|| serde_json::Value::String(v.to_string())),
    ))
}

fn format_inspection(i: &containerd::Inspection) -> String {
    let mut s = format!(
        "config version: {}\nhandlers table: {}\ndefault runtime: {}\n",
        i.version,
        i.plugin_path,
        i.default_runtime
            .as_deref()
            .unwrap_or("(containerd's default: runc)")
    );
    s.push_str(&format!(
        "imports: {}\n",
        if i.imports.is_empty() {
            "(none)".to_string()
        } else {
            i.imports.join(", ")
        }
    ));
    s.push_str(&match &i.dropin_dir {
        Some(d) => format!("drop-in mode: new handlers go to {}\n", d.display()),
        None => "drop-in mode: off, new handlers are added to the main file\n".to_string(),
    });
    s.push_str("handlers:\n");
    for h in &i.handlers {
        s.push_str(&format!(
            "  {}  type={}  owner={}  form={:?}  file={}\n",
            h.name,
            h.runtime_type.as_deref().unwrap_or("(unset)"),
            h.owner,
            h.form,
            h.file.display()
        ));
    }
    s
}

/// A unified diff (3 lines of context) between two texts.
pub fn unified_diff(before: &str, after: &str, name: &str) -> String {
    let a: Vec<&str> = before.split_inclusive('\n').collect();
    let b: Vec<&str> = after.split_inclusive('\n').collect();
    // LCS table, sizes are config files (a few hundred lines).
    let mut l = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            l[i][j] = if a[i] == b[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    // Edit script: (' ' | '-' | '+', line).
    let (mut i, mut j, mut ops) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i], i, j));
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || l[i][j + 1] >= l[i + 1][j]) {
            ops.push(('+', b[j], i, j));
            j += 1;
        } else {
            ops.push(('-', a[i], i, j));
            i += 1;
        }
    }
    let mut out = format!("--- {name}\n+++ {name}\n");
    let changed: Vec<usize> = (0..ops.len()).filter(|&k| ops[k].0 != ' ').collect();
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(3);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 7 {
            end = changed[k];
            k += 1;
        }
        let end = (end + 4).min(ops.len());
        let hunk = &ops[start..end];
        let (a0, b0) = (hunk[0].2, hunk[0].3);
        let na = hunk.iter().filter(|o| o.0 != '+').count();
        let nb = hunk.iter().filter(|o| o.0 != '-').count();
        out.push_str(&format!("@@ -{},{na} +{},{nb} @@\n", a0 + 1, b0 + 1));
        for (op, line, _, _) in hunk {
            out.push(*op);
            out.push_str(line);
            if !line.ends_with('\n') {
                out.push_str("\n\\ No newline at end of file\n");
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_toml_values_or_strings() {
        assert_eq!(parse_option("a=true").unwrap().1, serde_json::json!(true));
        assert_eq!(parse_option("a=5").unwrap().1, serde_json::json!(5));
        assert_eq!(
            parse_option("a=\"x y\"").unwrap().1,
            serde_json::json!("x y")
        );
        assert_eq!(
            parse_option("BinaryName=/usr/bin/x").unwrap().1,
            serde_json::json!("/usr/bin/x")
        );
        assert!(parse_option("novalue").is_err());
    }

    #[test]
    fn unified_diff_shows_added_lines_with_context() {
        let d = unified_diff("a\nb\nc\n", "a\nb\nx\nc\n", "f");
        assert_eq!(d, "--- f\n+++ f\n@@ -1,3 +1,4 @@\n a\n b\n+x\n c\n");
    }
}
