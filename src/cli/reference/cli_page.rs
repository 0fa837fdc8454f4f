//! The CLI page: every visible command with its usage and arguments, from clap.

use std::fmt::Write as _;

use super::page::*;

pub(super) fn cli_page(mut cli: clap::Command) -> String {
    // Names every subcommand by its full name (`shim-agent containerd get`) and gives each the
    // global arguments.
    cli.build();
    let mut out = header(
        "Command line",
        "the clap definition of the command line (`src/main.rs`, `src/cli/`)",
    );
    out.push_str(
        "\nEvery command and its arguments. Each command also takes `-h` (a summary) and \
         `--help` (everything on this page for that command).\n",
    );
    let mut commands = Vec::new();
    collect_commands(&cli, &mut commands);
    out.push('\n');
    for cmd in &commands {
        let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
        let _ = writeln!(out, "- [{}](#{})", code(name, false), slug(name));
    }
    for (i, cmd) in commands.iter().enumerate() {
        command_section(&mut out, cmd, i == 0);
    }
    out
}

fn collect_commands<'a>(cmd: &'a clap::Command, out: &mut Vec<&'a clap::Command>) {
    out.push(cmd);
    for sub in visible_subcommands(cmd) {
        collect_commands(sub, out);
    }
}

/// The subcommands a user is shown: neither hidden nor clap's own `help` (whose page would be
/// its parent's).
fn visible_subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// A command's heading, description, usage, subcommands and arguments; the global arguments
/// (which every subcommand takes too) only on the top command's (`top`).
fn command_section(out: &mut String, cmd: &clap::Command, top: bool) {
    let name = cmd.get_bin_name().unwrap_or(cmd.get_name());
    let _ = writeln!(out, "\n## {name}\n");
    if let Some(about) = cmd.get_long_about().or(cmd.get_about()) {
        let _ = writeln!(out, "{}\n", prose(&about.to_string(), false));
    }
    let usage = cmd.clone().render_usage().to_string();
    let usage = usage.strip_prefix("Usage: ").unwrap_or(&usage);
    let _ = writeln!(out, "```text\n{}\n```", usage.trim_end());
    let subs: Vec<&clap::Command> = visible_subcommands(cmd).collect();
    if !subs.is_empty() {
        let _ = writeln!(out, "\n| Command | Description |\n|---|---|");
        for sub in subs {
            let sub_name = sub.get_bin_name().unwrap_or(sub.get_name());
            let about = sub
                .get_about()
                .map(|a| prose(&a.to_string(), true))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| [{}](#{}) | {about} |",
                code(sub.get_name(), true),
                slug(sub_name)
            );
        }
    }
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set() && (top || !a.is_global_set()))
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect();
    if !args.is_empty() {
        let _ = writeln!(out, "\n| Argument | Description | Details |\n|---|---|---|");
        for arg in args {
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| prose(&h.to_string(), true))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "| {} | {help} | {} |",
                code(&arg_synopsis(arg), true),
                arg_details(arg).join("; ")
            );
        }
    }
}

fn arg_synopsis(arg: &clap::Arg) -> String {
    let values: Vec<String> = match arg.get_value_names() {
        Some(names) => names.iter().map(|n| format!("<{n}>")).collect(),
        None => vec![format!("<{}>", arg.get_id().as_str().to_uppercase())],
    };
    if arg.is_positional() {
        return values.join(" ");
    }
    let mut s = String::new();
    if let Some(short) = arg.get_short() {
        let _ = write!(s, "-{short}");
    }
    if let Some(long) = arg.get_long() {
        if !s.is_empty() {
            s.push_str(", ");
        }
        let _ = write!(s, "--{long}");
    }
    if arg.get_action().takes_values() {
        let _ = write!(s, " {}", values.join(" "));
    }
    s
}

fn arg_details(arg: &clap::Arg) -> Vec<String> {
    let mut out = Vec::new();
    if arg.is_required_set() {
        out.push("required".to_string());
    }
    if arg.is_global_set() {
        out.push("global: before or after the subcommand".to_string());
    }
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| code(&v.to_string_lossy(), true))
        .collect();
    if !defaults.is_empty() && arg.get_action().takes_values() {
        out.push(format!("default {}", defaults.join(", ")));
    }
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| code(v.get_name(), true))
        .collect();
    if !possible.is_empty() && arg.get_action().takes_values() {
        out.push(format!("one of {}", possible.join(", ")));
    }
    if let Some(env) = arg.get_env() {
        // the variable's name only: its value here is this machine's
        out.push(format!(
            "environment variable {}",
            code(&env.to_string_lossy(), true)
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// config.md
