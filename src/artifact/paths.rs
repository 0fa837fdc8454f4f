//! The pure rules on an archive entry's path and link target, and how a name from an
//! archive is shown in a message.
//!
//! Names are any bytes: they are checked as bytes, shown lossily decoded and cut by
//! characters (never inside one), so no name can make these panic.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// Longest file name component Linux takes (`NAME_MAX`).
const MAX_NAME_BYTES: usize = 255;
/// Longest path Linux takes (`PATH_MAX`, with its NUL).
const MAX_PATH_BYTES: usize = 4095;
/// Characters of an archive's name shown in a message.
pub(crate) const SHOWN_NAME_CHARS: usize = 200;

/// A name from the archive as shown in messages: lossily decoded, and cut to
/// [`SHOWN_NAME_CHARS`] characters (by characters, never inside one).
pub(crate) fn shown_name(raw: &[u8]) -> String {
    let full = String::from_utf8_lossy(raw);
    let count = full.chars().count();
    if count <= SHOWN_NAME_CHARS {
        return full.into_owned();
    }
    let mut cut: String = full.chars().take(SHOWN_NAME_CHARS).collect();
    cut.push_str(&format!("…({} bytes)", raw.len()));
    cut
}

/// A path from the archive as a clean relative path; `None` for the root itself (`./`).
pub(super) fn safe_relative(raw: &[u8]) -> Result<Option<PathBuf>, String> {
    if raw.is_empty() {
        return Err("empty path".into());
    }
    if raw.contains(&0) {
        return Err("NUL byte in path".into());
    }
    if raw.len() > MAX_PATH_BYTES {
        return Err(format!(
            "a path of {} bytes, longer than the {MAX_PATH_BYTES} Linux takes",
            raw.len()
        ));
    }
    let p = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) if n.len() > MAX_NAME_BYTES => {
                return Err(format!(
                    "a name of {} bytes in the path, longer than the {MAX_NAME_BYTES} Linux takes",
                    n.len()
                ));
            }
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("path contains \"..\"".into()),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path".into()),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// A symlink at `rel` may point to `target` only if the target is relative, its `..`
/// components all come first and do not climb above the tree's root. (With `..` only in
/// front, resolution climbs real directories and then only descends, so no chain of such
/// links can leave the tree.)
pub(super) fn check_symlink_target(rel: &Path, target: &[u8]) -> Result<(), String> {
    let shown = shown_name(target);
    let t = Path::new(OsStr::from_bytes(target));
    if target.is_empty() {
        return Err("symlink with an empty target".into());
    }
    if t.is_absolute() {
        return Err(format!("symlink to absolute path {shown:?}"));
    }
    let depth = rel.components().count().saturating_sub(1);
    let mut ups = 0usize;
    let mut descended = false;
    for c in t.components() {
        match c {
            Component::ParentDir if descended => {
                return Err(format!("symlink target {shown:?} has \"..\" after a name"));
            }
            Component::ParentDir => ups += 1,
            Component::Normal(_) => descended = true,
            _ => {}
        }
    }
    if ups > depth {
        return Err(format!("symlink to {shown:?} points outside the archive"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_cleaned_and_escapes_refused() {
        assert_eq!(safe_relative(b"./a/b").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(safe_relative(b"./").unwrap(), None);
        assert!(
            safe_relative(b"/etc/passwd")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(safe_relative(b"a/../../x").unwrap_err().contains(".."));
        assert!(safe_relative(b"").is_err());
    }

    #[test]
    fn symlink_targets_must_stay_inside() {
        let at = |p: &str, t: &str| check_symlink_target(Path::new(p), t.as_bytes());
        assert!(at("bin/shim", "../lib/shim").is_ok());
        assert!(at("shim", "bin/shim").is_ok());
        assert!(at("shim", "../x").is_err());
        assert!(at("a/l", "/etc").is_err());
        // "d/s/.." would be safe lexically but not through a symlink d/s: refused
        assert!(at("t", "d/s/..").is_err());
    }

    #[test]
    fn names_longer_than_linux_takes_are_refused() {
        assert!(safe_relative(&[b'a'; 255]).is_ok());
        let e = safe_relative(&[b'a'; 256]).unwrap_err();
        assert!(e.contains("a name of 256 bytes"), "{e}");
        let deep: Vec<u8> = b"a/".repeat(2048);
        assert!(
            safe_relative(&deep)
                .unwrap_err()
                .contains("a path of 4096 bytes")
        );
    }

    #[test]
    fn shown_names_are_cut_between_characters() {
        assert_eq!(shown_name(b"a\xffb"), "a\u{fffd}b");
        let long = "🎉".repeat(SHOWN_NAME_CHARS + 1);
        let shown = shown_name(long.as_bytes());
        assert!(shown.starts_with(&"🎉".repeat(SHOWN_NAME_CHARS)));
        assert!(shown.ends_with(&format!("…({} bytes)", long.len())));
    }
}
