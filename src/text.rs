//! Untrusted text: names, messages and replies from artifacts, extensions, configs and the
//! API may hold any Unicode and any length. Everything the agent puts into an Event, a
//! condition, an annotation, a hook record or a status line is clipped here, on a character
//! boundary, so that no input can make a length limit panic.
//!
//! `String::truncate`, `split_off` and byte-offset string slicing are forbidden elsewhere by
//! clippy (`clippy.toml`, `[lints]` in `Cargo.toml`): they panic off a character boundary.

/// Longest Event note the agent writes (the API server's limit is 1 KiB).
pub const EVENT_NOTE_MAX_BYTES: usize = 1000;
/// Longest message kept in a condition, a node-state entry or a hook record.
pub const MESSAGE_MAX_BYTES: usize = 1000;

/// At most `max` bytes of `s`, cut on a character boundary, with control characters (line
/// breaks included) replaced by spaces.
pub fn clip(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(max.min(s.len()));
    for c in s.chars() {
        if out.len() + c.len_utf8() > max {
            break;
        }
        out.push(if c.is_control() { ' ' } else { c });
    }
    out
}

/// `s` clipped to [`EVENT_NOTE_MAX_BYTES`].
pub fn event_note(s: &str) -> String {
    clip(s, EVENT_NOTE_MAX_BYTES)
}

/// An error and its sources on one line, `a: b: c` (libraries such as tonic and reqwest keep
/// the cause in a source); a source whose text the line already holds is not repeated.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// The first `n` characters of `s` (a digest's short form, a preview).
pub fn prefix_chars(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn clip_cuts_on_char_boundaries() {
        assert_eq!(clip("abc", 10), "abc");
        assert_eq!(clip("ééé", 6), "ééé");
        assert_eq!(clip("ééé", 3), "é");
        assert_eq!(clip("a\nb\u{7}c", 10), "a b c");
        assert_eq!(clip("🎉🎉", 7), "🎉");
        assert_eq!(clip("🎉🎉", 3), "");
        assert_eq!(clip("", 0), "");
    }

    proptest! {
        #[test]
        fn clip_never_panics_and_stays_within_the_limit(s in any::<String>(), max in 0usize..2000) {
            let c = clip(&s, max);
            prop_assert!(c.len() <= max);
            prop_assert!(!c.chars().any(char::is_control));
            if s.len() <= max && !s.chars().any(char::is_control) {
                prop_assert_eq!(&c, &s);
            }
        }
    }
}
