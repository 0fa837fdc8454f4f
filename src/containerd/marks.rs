//! The agent's marker comments in containerd's config: what they say, how they are read and
//! how they are added and taken out of a decor prefix, in every form a handler may take
//! ([`super::forms`], [`super::inline`], [`super::edit`] use them; this module uses none of
//! those). An `imports` key the agent created carries `# shim-agent: imports added for
//! drop-ins`.
//!
//! # Decision
//! **Ownership.** Tables the agent adds carry `# shim-agent: handler <h>` in their header
//! decor; dotted keys and `<h> = { ... }` lines carry it on a comment line before their first
//! line; an entry inside an inline table, where no comment fits, on a comment line before the
//! outermost inline table's line, one per handler (and one for a kept default runtime), so
//! removal drops exactly the agent's entries, marker lines and separators and gives back the
//! bytes. Only marked handlers are removed; a user-defined handler is refused (`NotOwned`),
//! never deleted, and there is no force flag: the node owner removes it by hand. `--replace`
//! rewrites a conflicting handler where it stands and marks it as the agent's.

use toml_edit::Table;

/// Marker line prefix of a handler table added by the agent.
pub const HANDLER_MARK: &str = "# shim-agent: handler ";
/// Marker line prefix of a default runtime the agent made explicit.
pub const KEPT_MARK: &str = "# shim-agent: default runtime kept for handler ";
/// Marker line prefix of an `imports` key the agent created.
pub const IMPORT_MARK: &str = "# shim-agent: imports added for drop-ins";
/// The default runtime the agent makes explicit for containerd 1.x.
pub const KEPT_RUNTIME: &str = "runc";

/// Who added a handler, read from its marker comment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Not marked: user-defined.
    None,
    /// `# shim-agent: handler <h>`.
    Handler(String),
    /// `# shim-agent: default runtime kept for handler <h>`.
    Kept(String),
}

/// An entry to add: name, table, marker line.
pub type Entry<'a> = (&'a str, Table, String);

/// The marks in a decor prefix, one per marker line.
fn marks(prefix: &str) -> impl Iterator<Item = Mark> + '_ {
    prefix.lines().filter_map(|line| {
        let line = line.trim();
        if let Some(h) = line.strip_prefix(HANDLER_MARK) {
            Some(Mark::Handler(h.trim().to_string()))
        } else {
            line.strip_prefix(KEPT_MARK)
                .map(|h| Mark::Kept(h.trim().to_string()))
        }
    })
}

/// The mark of a decor that belongs to one table or line only: its first marker line.
pub fn first_mark(prefix: &str) -> Mark {
    marks(prefix).next().unwrap_or(Mark::None)
}

/// The mark of entry `name` inside an inline table, read from the marker lines before the
/// outermost inline table's line: a handler line naming it, else the kept default runtime.
pub fn shared_mark(prefix: &str, name: &str) -> Mark {
    let all: Vec<Mark> = marks(prefix).collect();
    if all.contains(&Mark::Handler(name.to_string())) {
        return Mark::Handler(name.to_string());
    }
    let kept = all.into_iter().find(|m| matches!(m, Mark::Kept(_)));
    match kept {
        Some(k) if name == KEPT_RUNTIME => k,
        _ => Mark::None,
    }
}

/// `prefix` with `marker` on its own line right before the line it decorates, indented like
/// that line (after the user's own comments and blank lines).
pub fn add_marker_line(prefix: &str, marker: &str) -> String {
    let at = prefix.rfind('\n').map_or(0, |i| i + 1);
    let (head, indent) = prefix.split_at_checked(at).unwrap_or((prefix, ""));
    format!("{head}{indent}{marker}\n{indent}")
}

/// `prefix` without the lines `drop` selects (given trimmed); the inverse of
/// [`add_marker_line`].
pub fn drop_marker_lines(prefix: &str, drop: impl Fn(&str) -> bool) -> String {
    prefix
        .split_inclusive('\n')
        .filter(|l| !(l.ends_with('\n') && drop(l.trim())))
        .collect()
}

/// A decor prefix as text (`""` when unset).
pub fn prefix_str(decor: &toml_edit::Decor) -> &str {
    decor.prefix().and_then(|p| p.as_str()).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_line_goes_right_before_the_line_and_comes_out_exactly() {
        for prefix in ["", "  ", "\n", "\n# user\n    ", "# a\n# b\n\t"] {
            let m = "# shim-agent: handler spin";
            let with = add_marker_line(prefix, m);
            assert!(
                with.ends_with(&format!(
                    "{m}\n{}",
                    prefix.rsplit('\n').next().unwrap_or("")
                )),
                "{with:?}"
            );
            assert_eq!(first_mark(&with), Mark::Handler("spin".into()));
            let two = add_marker_line(&with, "# shim-agent: handler wasm");
            let back = drop_marker_lines(&two, |l| l == m);
            assert_eq!(back, add_marker_line(prefix, "# shim-agent: handler wasm"));
            assert_eq!(drop_marker_lines(&with, |l| l == m), prefix);
        }
    }

    #[test]
    fn an_entry_inside_an_inline_table_is_marked_by_name() {
        let p = "# mine\n# shim-agent: default runtime kept for handler spin\n\
                 # shim-agent: handler spin\n";
        assert_eq!(shared_mark(p, "spin"), Mark::Handler("spin".into()));
        assert_eq!(shared_mark(p, "runc"), Mark::Kept("spin".into()));
        assert_eq!(shared_mark(p, "kata"), Mark::None);
        assert_eq!(shared_mark("# mine\n", "runc"), Mark::None);
    }
}
