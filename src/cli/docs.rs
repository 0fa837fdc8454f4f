//! `shim-agent generate-docs --out-dir DIR` (a hidden command): the man pages and shell
//! completions that the .deb and .rpm ship, generated from the command line's own definition
//! so that they cannot drift from it. `scripts/package` runs it into the target directory;
//! nothing it writes is committed.
//!
//! Layout under `DIR`:
//! - `man/man1/shim-agent.1` and one page per subcommand (`shim-agent-install.1`, …,
//!   `shim-agent-containerd-get.1`), hidden commands left out;
//! - `completions/bash/shim-agent`, `completions/zsh/_shim-agent`,
//!   `completions/fish/shim-agent.fish`: the names each shell's completion directory expects.
//!
//! The reference pages of the documentation (`docs/reference/`, committed) are another hidden
//! command's, `generate-reference`: [`reference`].

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap_complete::Shell;

/// The shells completions are generated for, with the file name each one's directory expects
/// (bash-completion loads `completions/<command>`, zsh's fpath `_<command>`).
const SHELLS: [(Shell, &str, &str); 3] = [
    (Shell::Bash, "bash", ""),
    (Shell::Zsh, "zsh", "_"),
    (Shell::Fish, "fish", ""),
];

/// Write the man pages and completions for `cmd` under `out_dir` (created if missing) and
/// return the files written, sorted.
pub fn generate(cmd: clap::Command, out_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let name = cmd.get_name().to_string();
    let mut written = Vec::new();

    let man_dir = out_dir.join("man").join("man1");
    fs::create_dir_all(&man_dir).with_context(|| format!("cannot create {}", man_dir.display()))?;
    // clap_mangen leaves hidden commands out by itself.
    clap_mangen::generate_to(cmd.clone(), &man_dir)
        .with_context(|| format!("cannot write the man pages into {}", man_dir.display()))?;
    for entry in fs::read_dir(&man_dir).with_context(|| format!("{}", man_dir.display()))? {
        written.push(entry?.path());
    }

    // clap_complete lists hidden subcommands; the completions are made from a copy without them.
    let visible = visible_only(Box::leak(Box::new(cmd)));
    for (shell, dir, prefix) in SHELLS {
        let dir = out_dir.join("completions").join(dir);
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let file_name = match shell {
            Shell::Fish => format!("{name}.fish"),
            _ => format!("{prefix}{name}"),
        };
        let path = dir.join(file_name);
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut visible.clone(), &name, &mut buf);
        if shell == Shell::Bash {
            buf = fix_bash_names(&buf, &name);
        }
        let mut file =
            fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        file.write_all(&buf)
            .with_context(|| format!("cannot write {}", path.display()))?;
        written.push(path);
    }
    written.sort();
    Ok(written)
}

/// clap_complete 4.6 names the subcommands' cases of a hyphenated command inconsistently in
/// bash: `cmd` is set to `shim__agent__subcmd__install` but the case is spelled
/// `shim__subcmd__agent__subcmd__install)`, so no subcommand's options ever complete.
/// Spell both the same way (scripts/check-packages completes `shim-agent install --r`).
fn fix_bash_names(script: &[u8], name: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(script);
    let wrong = name.replace('-', "__subcmd__");
    let right = name.replace('-', "__");
    if wrong == right {
        return script.to_vec();
    }
    text.replace(&format!("{wrong}__subcmd__"), &format!("{right}__subcmd__"))
        .into_bytes()
}

/// `cmd` without its hidden subcommands, at every level. clap's builder takes only `'static`
/// names (without its `string` feature), hence a `'static` command: `generate` leaks one copy,
/// once per run of this one-shot command. Levels with nothing hidden below are kept as they are.
fn visible_only(cmd: &'static clap::Command) -> clap::Command {
    fn hides(cmd: &clap::Command) -> bool {
        cmd.get_subcommands().any(|s| s.is_hide_set() || hides(s))
    }
    if !hides(cmd) {
        return cmd.clone();
    }
    let mut out = clap::Command::new(cmd.get_name())
        .args(cmd.get_arguments().cloned())
        .subcommands(
            cmd.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(visible_only),
        )
        .subcommand_required(cmd.is_subcommand_required_set())
        .arg_required_else_help(cmd.is_arg_required_else_help_set());
    if let Some(v) = cmd.get_version() {
        out = out.version(v);
    }
    if let Some(a) = cmd.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = cmd.get_long_about() {
        out = out.long_about(a.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    fn toy() -> Command {
        Command::new("toy")
            .version("1.0")
            .about("A toy")
            .subcommand(Command::new("shown").about("Shown everywhere"))
            .subcommand(
                Command::new("secret")
                    .about("Hidden everywhere")
                    .hide(true)
                    .arg(Arg::new("out").long("out-dir")),
            )
    }

    #[test]
    fn writes_man_pages_and_completions_without_hidden_commands() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(toy(), dir.path()).unwrap();
        let rel: Vec<String> = files
            .iter()
            .map(|p| p.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(
            rel,
            [
                "completions/bash/toy",
                "completions/fish/toy.fish",
                "completions/zsh/_toy",
                "man/man1/toy-shown.1",
                "man/man1/toy.1",
            ]
        );
        for f in &files {
            let text = fs::read_to_string(f).unwrap();
            assert!(text.contains("shown"), "{}: no subcommand", f.display());
            assert!(
                !text.contains("secret"),
                "{}: names the hidden command",
                f.display()
            );
        }
        let page = fs::read_to_string(dir.path().join("man/man1/toy.1")).unwrap();
        assert!(page.contains(".TH toy 1"), "{page}");
    }

    #[test]
    fn bash_completion_of_a_hyphenated_command_reaches_subcommand_options() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = Command::new("my-tool")
            .subcommand(Command::new("shown").arg(Arg::new("root").long("root")));
        generate(cmd, dir.path()).unwrap();
        let bash = fs::read_to_string(dir.path().join("completions/bash/my-tool")).unwrap();
        assert!(bash.contains("cmd=\"my__tool__subcmd__shown\""), "{bash}");
        assert!(bash.contains("my__tool__subcmd__shown)"), "{bash}");
        assert!(!bash.contains("my__subcmd__tool"), "{bash}");
    }
}
