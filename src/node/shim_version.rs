//! A shim asked its own version, as containerd's shims and runwasi's answer `-v`
//! (`containerd-shim-runc-v2:\n  Version:  v2.3.4\n  Revision: …`): the preflight of a new
//! shim runs it once, on the verified copy, before any slot or restart (docs/design.md §3).
//!
//! The run is in one function, its judgement and the parse of what it printed in others
//! (pure, tested on captured output). On a live node the binary runs as it is; in another root
//! (an image, a test's container) it runs under `chroot`, so that it loads the root's own
//! libraries, and not at all where that cannot work (not root, another architecture).
//!
//! What fails the preflight: the binary cannot be executed, its loader gives up (exit 126,
//! 127), a signal kills it, or it does not answer in time: it would fail the same way under
//! containerd. Any other exit only leaves the version unknown; the check after the restart
//! has the last word.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;

use super::NodeError;
use crate::hostroot::HostRoot;
use crate::text::clip;

/// How often a run that met ETXTBSY is tried again.
const TEXT_BUSY_TRIES: usize = 10;

/// Whether the exec of the shim failed with ETXTBSY ("Text file busy"): directly, or as
/// `chroot`'s exit 126 with its message.
fn text_file_busy(ran: &Ran) -> bool {
    const BUSY: &str = "Text file busy";
    match ran {
        Ran::NotStarted(why) => why.contains(BUSY),
        Ran::Exited(126, text) => text.contains(BUSY),
        _ => false,
    }
}

/// Most bytes of the answer read.
const MAX_ANSWER_BYTES: u64 = 64 * 1024;
/// Longest version kept.
pub const VERSION_MAX_BYTES: usize = 128;

/// How a `-v` run ended (what the judgement needs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ran {
    /// It exited with this code.
    Exited(i32, String),
    /// A signal killed it.
    Signalled(i32, String),
    /// No answer within the time given.
    TimedOut(Duration),
    /// It could not be started at all (`exec` failed).
    NotStarted(String),
    /// Not run here: why (another architecture, not root).
    Skipped(&'static str),
}

/// Ask the shim at `binary` (a path under `root`, as this process reaches it) for its version.
/// `Ok(None)`: it gave none, or it was not run here. `Err`: [`NodeError::ShimDoesNotRun`].
pub async fn shim_version(
    root: &HostRoot,
    binary: &Path,
    runs_here: bool,
    timeout: Duration,
) -> Result<Option<String>, NodeError> {
    let mut ran = run_dash_v(root, binary, runs_here, timeout).await;
    // A process forked elsewhere in this program while the artifact was being written holds
    // its write descriptor until it execs: the exec fails with ETXTBSY for that moment (the
    // known race of multithreaded programs that run a file they just wrote). Not the shim's.
    for _ in 0..TEXT_BUSY_TRIES {
        if !text_file_busy(&ran) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        ran = run_dash_v(root, binary, runs_here, timeout).await;
    }
    judge(&ran).map_err(|detail| NodeError::ShimDoesNotRun {
        binary: root.host_path_of(binary).display().to_string(),
        detail,
    })
}

/// Run `<binary> -v` (under `chroot` in another root) and collect what it printed.
async fn run_dash_v(root: &HostRoot, binary: &Path, runs_here: bool, timeout: Duration) -> Ran {
    if !runs_here {
        return Ran::Skipped("built for another architecture than this machine's");
    }
    let mut cmd = if root.is_system() {
        tokio::process::Command::new(binary)
    } else {
        if !nix::unistd::geteuid().is_root() {
            return Ran::Skipped("running it inside the image root needs root (chroot)");
        }
        let mut c = tokio::process::Command::new("chroot");
        c.arg(root.path()).arg(root.host_path_of(binary));
        c
    };
    cmd.arg("-v")
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Ran::NotStarted(e.to_string()),
    };
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let collect = async {
        let mut text = Vec::new();
        if let Some(o) = out.as_mut() {
            let _ = o.take(MAX_ANSWER_BYTES).read_to_end(&mut text).await;
        }
        if let Some(e) = err.as_mut() {
            let _ = e.take(MAX_ANSWER_BYTES).read_to_end(&mut text).await;
        }
        let status = child.wait().await;
        (status, String::from_utf8_lossy(&text).into_owned())
    };
    match tokio::time::timeout(timeout, collect).await {
        Err(_) => Ran::TimedOut(timeout),
        Ok((Err(e), _)) => Ran::NotStarted(e.to_string()),
        Ok((Ok(status), text)) => {
            use std::os::unix::process::ExitStatusExt;
            match (status.code(), status.signal()) {
                (Some(code), _) => Ran::Exited(code, text),
                (None, Some(sig)) => Ran::Signalled(sig, text),
                (None, None) => Ran::NotStarted("no exit status".into()),
            }
        }
    }
}

/// What a run says (pure): the version it printed, none, or why the shim does not run.
pub fn judge(ran: &Ran) -> Result<Option<String>, String> {
    let quoted = |text: &str| clip(text.trim(), 300);
    match ran {
        Ran::Exited(0, text) => Ok(parse_version(text)),
        Ran::Exited(code @ (126 | 127), text) => Err(format!(
            "`-v` could not run it (exit {code}): {}",
            quoted(text)
        )),
        Ran::Exited(code, text) => {
            tracing::warn!(
                code,
                "the shim's `-v` did not succeed; its version is unknown: {}",
                quoted(text)
            );
            Ok(None)
        }
        Ran::Signalled(sig, text) => Err(format!(
            "`-v` was killed by signal {sig} ({}): {}",
            signal_name(*sig),
            quoted(text)
        )),
        Ran::TimedOut(after) => Err(format!(
            "no answer to `-v` within {} s (check.version-timeout-secs)",
            after.as_secs()
        )),
        Ran::NotStarted(why) => Err(format!("it cannot be executed: {}", clip(why, 300))),
        Ran::Skipped(why) => {
            tracing::info!("the shim's version was not asked: {why}");
            Ok(None)
        }
    }
}

/// The version in a shim's `-v` answer (pure): the value of its `Version:` line, else a first
/// line that carries a digit; clipped, control characters gone (it is untrusted text).
pub fn parse_version(text: &str) -> Option<String> {
    let lines = || text.lines().map(str::trim).filter(|l| !l.is_empty());
    let labelled = lines().find_map(|l| {
        let (key, value) = l.split_once(':')?;
        key.trim()
            .eq_ignore_ascii_case("version")
            .then(|| value.trim())
            .filter(|v| !v.is_empty())
    });
    let version = labelled.or_else(|| {
        lines()
            .next()
            .filter(|l| l.chars().any(|c| c.is_ascii_digit()))
    })?;
    Some(clip(version, VERSION_MAX_BYTES))
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        4 => "SIGILL: an instruction this CPU lacks",
        6 => "SIGABRT",
        7 => "SIGBUS",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        31 => "SIGSYS: a system call refused",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_go_shims_answer_gives_its_version_line() {
        let answer = "containerd-shim-runc-v2:\n  Version:  v2.3.4\n  Revision: 1a2b3c\n  Go version: go1.24.4\n";
        assert_eq!(parse_version(answer).as_deref(), Some("v2.3.4"));
    }

    #[test]
    fn a_runwasi_shims_answer_gives_its_version_line() {
        let answer = "containerd-shim-wasmtime-v1:\n  Version: 0.6.0\n  Revision: 4f2e1a9\n";
        assert_eq!(parse_version(answer).as_deref(), Some("0.6.0"));
    }

    #[test]
    fn a_bare_answer_is_taken_when_it_carries_a_digit() {
        assert_eq!(
            parse_version("runsc version release-20240513.0\n").as_deref(),
            Some("runsc version release-20240513.0")
        );
        assert_eq!(parse_version("usage: shim [options]\n"), None);
        assert_eq!(parse_version(""), None);
    }

    #[test]
    fn a_hostile_answer_is_clipped_and_cleaned() {
        let answer = format!("Version: {}\u{7}\n", "é".repeat(500));
        let v = parse_version(&answer).unwrap();
        assert!(v.len() <= VERSION_MAX_BYTES);
        assert!(!v.contains('\u{7}'));
    }

    #[test]
    fn exits_that_mean_it_cannot_run_fail_the_preflight() {
        let loader = Ran::Exited(
            127,
            "error while loading shared libraries: libseccomp.so.2".into(),
        );
        assert!(judge(&loader).unwrap_err().contains("libseccomp.so.2"));
        let sigill = judge(&Ran::Signalled(4, String::new())).unwrap_err();
        assert!(sigill.contains("SIGILL"), "{sigill}");
        let slow = judge(&Ran::TimedOut(Duration::from_secs(10))).unwrap_err();
        assert!(slow.contains("within 10 s"), "{slow}");
        assert!(judge(&Ran::NotStarted("Exec format error (os error 8)".into())).is_err());
    }

    #[test]
    fn a_busy_text_file_is_told_apart_from_a_shim_that_cannot_run() {
        assert!(text_file_busy(&Ran::NotStarted(
            "Text file busy (os error 26)".into()
        )));
        assert!(text_file_busy(&Ran::Exited(
            126,
            "chroot: failed to run command '/x': Text file busy\n".into()
        )));
        assert!(!text_file_busy(&Ran::Exited(
            126,
            "Permission denied".into()
        )));
        assert!(!text_file_busy(&Ran::Exited(0, "Text file busy".into())));
    }

    #[test]
    fn other_exits_and_skipped_runs_leave_the_version_unknown() {
        assert_eq!(judge(&Ran::Exited(1, "unknown flag -v".into())), Ok(None));
        assert_eq!(judge(&Ran::Skipped("another architecture")), Ok(None));
        assert_eq!(
            judge(&Ran::Exited(0, "x:\n  Version: 1.0\n".into())),
            Ok(Some("1.0".into()))
        );
    }
}
