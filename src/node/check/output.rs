//! What a check container printed, and whether that is success: the CRI log format read back
//! (pure), and the judgement of an exit code and an output against what the Shim asked for.

use super::spec::ContainerCheck;
use crate::text::clip;

/// Most bytes of a check container's log read back: its output is untrusted and may be huge.
pub const MAX_LOG_BYTES: usize = 1 << 20;
/// Most characters of the output quoted in a failure.
pub const QUOTED_OUTPUT_CHARS: usize = 512;

/// The text of a CRI container log (pure): each line is
/// `<RFC 3339 time> <stdout|stderr> <P|F> <content>`, `P` a partial line continued by the next
/// entry, `F` a full one. Lines that do not have that shape are kept whole (a runtime that
/// writes plain text). Invalid UTF-8 is replaced, never refused.
pub fn read_cri_log(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for line in text.split_inclusive('\n') {
        let line = line.strip_suffix('\n').unwrap_or(line);
        let mut fields = line.splitn(4, ' ');
        let (time, stream, tag) = (fields.next(), fields.next(), fields.next());
        let shaped = time.is_some_and(|t| t.contains('T'))
            && matches!(stream, Some("stdout" | "stderr"))
            && matches!(tag, Some("P" | "F"));
        if !shaped {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        out.push_str(fields.next().unwrap_or_default());
        if tag == Some("F") {
            out.push('\n');
        }
    }
    out
}

/// The sandbox image a `RunPodSandbox` refusal says it could not get (pure): containerd 1.6
/// words it `failed to get sandbox image "<image>": …`, 2.3 `failed to pull image "<image>": …`
/// (the sandbox image is the only image `RunPodSandbox` pulls). `None`: the refusal is about
/// something else (the runtime's own failure).
pub fn sandbox_image_failure(message: &str) -> Option<String> {
    ["failed to get sandbox image \"", "failed to pull image \""]
        .iter()
        .find_map(|says| {
            let at = message.find(says)?;
            let rest = message.get(at + says.len()..)?;
            let end = rest.find('"')?;
            rest.get(..end).map(str::to_string)
        })
}

/// How the check container ended, as CRI reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub exit_code: i32,
    /// CRI's reason (`Completed`, `Error`, `OOMKilled`, ...).
    pub reason: String,
    /// What it printed (stdout and stderr, in order).
    pub output: String,
}

/// Whether the container did what its Shim asked (pure): `Err` says what it did instead, with
/// the end of its output quoted (clipped: it is untrusted text).
pub fn judge(expected: &ContainerCheck, ended: &Ended) -> Result<(), String> {
    let code_ok = ended.exit_code == expected.exit_code;
    let output_ok = expected
        .output_contains
        .as_ref()
        .is_none_or(|want| ended.output.contains(want.as_str()));
    if code_ok && output_ok {
        return Ok(());
    }
    let mut what = Vec::new();
    if !code_ok {
        let reason = match ended.reason.as_str() {
            "" => String::new(),
            r => format!(", {}", clip(r, 64)),
        };
        what.push(format!(
            "it exited with code {}{reason} (expected {})",
            ended.exit_code, expected.exit_code
        ));
    }
    if let (false, Some(want)) = (output_ok, &expected.output_contains) {
        what.push(format!("its output does not contain {:?}", clip(want, 128)));
    }
    Err(format!(
        "{}; its output: {:?}",
        what.join(" and "),
        tail(&ended.output, QUOTED_OUTPUT_CHARS)
    ))
}

/// The last `max` characters of `s` (the end of an output says most about a failure).
fn tail(s: &str, max: usize) -> String {
    let count = s.chars().count();
    if count <= max {
        return s.to_string();
    }
    let skip = count - max;
    format!("…{}", s.chars().skip(skip).collect::<String>())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn expected(code: i32, contains: Option<&str>) -> ContainerCheck {
        ContainerCheck {
            image: "img".into(),
            command: vec!["/hello.wasm".into()],
            args: vec![],
            exit_code: code,
            output_contains: contains.map(str::to_string),
            timeout: Duration::from_secs(5),
        }
    }

    fn ended(code: i32, output: &str) -> Ended {
        Ended {
            exit_code: code,
            reason: if code == 0 { "Completed" } else { "Error" }.into(),
            output: output.into(),
        }
    }

    #[test]
    fn a_cri_log_is_read_back_as_the_text_the_container_printed() {
        let log = b"2026-12-07T10:00:00.000000001Z stdout F hello from wasm\n\
2026-12-07T10:00:00.000000002Z stderr P part one \n\
2026-12-07T10:00:00.000000003Z stderr F and two\n";
        assert_eq!(read_cri_log(log), "hello from wasm\npart one and two\n");
    }

    #[test]
    fn an_unshaped_or_invalid_log_is_kept_not_refused() {
        assert_eq!(read_cri_log(b"plain text\n"), "plain text\n");
        assert_eq!(
            read_cri_log(b"\xff\xfe broken"),
            "\u{fffd}\u{fffd} broken\n"
        );
        assert_eq!(read_cri_log(b""), "");
        assert_eq!(read_cri_log(b"2026-12-07T10:00:00Z stdout F"), "\n");
    }

    #[test]
    fn a_sandbox_image_that_cannot_be_had_is_told_from_a_runtime_failure() {
        // as containerd 2.3.4 and 1.6.20 answered on the node env without a registry
        let v23 = "failed to pull image \"registry.k8s.io/pause:3.10.2\": failed to pull and \
                   unpack image \"registry.k8s.io/pause:3.10.2\": failed to resolve image: failed \
                   to do request: Head \"https://registry.k8s.io/v2/pause/manifests/3.10.2\": \
                   dial tcp: lookup registry.k8s.io on 10.255.255.53:53: no such host";
        let v16 = "failed to get sandbox image \"registry.k8s.io/pause:3.6\": failed to pull \
                   image \"registry.k8s.io/pause:3.6\": failed to pull and unpack image";
        assert_eq!(
            sandbox_image_failure(v23).as_deref(),
            Some("registry.k8s.io/pause:3.10.2")
        );
        assert_eq!(
            sandbox_image_failure(v16).as_deref(),
            Some("registry.k8s.io/pause:3.6")
        );
        let runtime = "failed to create containerd task: failed to start shim: start failed: \
                       io.containerd.runc.v2: type with url 80e7: not found: exit status 1";
        assert_eq!(sandbox_image_failure(runtime), None);
        assert_eq!(
            sandbox_image_failure("failed to pull image \"unterminated"),
            None
        );
        assert_eq!(
            sandbox_image_failure("failed to pull image \"é\""),
            Some("é".into())
        );
    }

    #[test]
    fn the_expected_code_and_output_pass() {
        let want = expected(0, Some("hello from wasm"));
        assert_eq!(judge(&want, &ended(0, "hello from wasm\n")), Ok(()));
        assert_eq!(judge(&expected(3, None), &ended(3, "")), Ok(()));
    }

    #[test]
    fn another_exit_code_names_both_codes_and_quotes_the_output() {
        let e = judge(&expected(0, None), &ended(127, "exec format error\n")).unwrap_err();
        assert_eq!(
            e,
            "it exited with code 127, Error (expected 0); its output: \"exec format error\\n\""
        );
    }

    #[test]
    fn a_missing_output_says_what_was_looked_for() {
        let e = judge(&expected(0, Some("hello")), &ended(0, "bye\n")).unwrap_err();
        assert_eq!(
            e,
            "its output does not contain \"hello\"; its output: \"bye\\n\""
        );
        let both = judge(&expected(0, Some("hello")), &ended(1, "")).unwrap_err();
        assert!(
            both.contains("code 1") && both.contains("does not contain"),
            "{both}"
        );
    }

    #[test]
    fn a_long_hostile_output_is_quoted_by_its_end_on_character_boundaries() {
        let output = "é".repeat(10_000) + "the end";
        let e = judge(&expected(0, Some("x")), &ended(0, &output)).unwrap_err();
        assert!(e.ends_with("the end\""), "{e}");
        assert!(e.chars().count() < QUOTED_OUTPUT_CHARS + 100, "{}", e.len());
    }
}
