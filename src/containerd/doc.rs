//! One config file as a `toml_edit` document that renders back byte for byte.
//!
//! Guarantees: a document is only edited when rendering it unchanged gives back the exact input
//! bytes (checked on parse). `toml_edit` normalises a few things (CRLF, a missing final
//! newline, a key quoted two ways as EKS writes it), so edits are rendered by `toml_edit` and
//! then spliced line by line into the original text: every line the edit did not touch keeps
//! its original bytes, CRLF files stay CRLF, a missing final newline stays missing.
//!
//! # Decision
//! **Bytes.** Edits are rendered by `toml_edit` and spliced line by line into the original
//! text, so untouched lines keep their bytes even where `toml_edit` would normalise them (a key
//! quoted two ways, CRLF, a missing final newline). Every edited file is re-parsed and must
//! read back as the edited document, with the handler exactly as wanted, before the plan is
//! returned. Idempotence compares parsed values, with unset = default (`options = {}`,
//! `pod_annotations = []`, `privileged_without_host_devices = false`).

use std::path::Path;

use toml_edit::DocumentMut;

use super::error::ConfigError;

/// A parsed config file plus what is needed to render it back byte for byte.
#[derive(Debug, Clone)]
pub struct Doc {
    /// The document (line endings normalised to LF).
    pub doc: DocumentMut,
    /// The LF-normalised text it was parsed from.
    pub text: String,
    /// `toml_edit`'s rendering of the unedited document, when it differs from `text` (it
    /// normalises the quoting of a key written two ways, as EKS does). Edits are then spliced
    /// into `text` line by line, so those lines keep their original bytes.
    base: Option<String>,
    crlf: bool,
    eof_newline: bool,
}

impl Doc {
    /// Parse bytes; refuse non-UTF-8, invalid TOML, and files that would not round-trip.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<Doc, ConfigError> {
        let raw = std::str::from_utf8(bytes).map_err(|e| {
            let (line, column) = line_col(&String::from_utf8_lossy(bytes), e.valid_up_to());
            ConfigError::ParseError {
                path: path.to_path_buf(),
                line,
                column,
                message: "not valid UTF-8".into(),
            }
        })?;
        Self::parse_str(path, raw)
    }

    /// Parse text (templates must have been refused before).
    pub fn parse_str(path: &Path, raw: &str) -> Result<Doc, ConfigError> {
        let n_lf = raw.matches('\n').count();
        let crlf = n_lf > 0 && raw.matches("\r\n").count() == n_lf;
        let text = if crlf {
            raw.replace("\r\n", "\n")
        } else {
            raw.to_string()
        };
        let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
            let (line, column) = line_col(&text, e.span().map(|s| s.start).unwrap_or(0));
            ConfigError::ParseError {
                path: path.to_path_buf(),
                line,
                column,
                message: e.message().trim().to_string(),
            }
        })?;
        let eof_newline = raw.is_empty() || raw.ends_with('\n');
        let rendered = doc.to_string();
        let full = if eof_newline {
            text.clone()
        } else {
            format!("{text}\n")
        };
        let base = (rendered != full && text.lines().count() == rendered.lines().count())
            .then_some(rendered);
        let d = Doc {
            doc,
            crlf,
            eof_newline,
            text,
            base,
        };
        if d.render() != raw.as_bytes() {
            return Err(ConfigError::UnsupportedLayout {
                path: path.to_path_buf(),
                detail: "the file cannot be edited without changing bytes outside the runtime \
                         handler; please report this file"
                    .into(),
            });
        }
        Ok(d)
    }

    /// A new, empty document rendered with LF and a final newline.
    pub fn new_empty() -> Doc {
        Doc {
            doc: DocumentMut::new(),
            text: String::new(),
            base: None,
            crlf: false,
            eof_newline: true,
        }
    }

    /// True when edits are spliced into the original text (see `base`).
    pub fn is_spliced(&self) -> bool {
        self.base.is_some()
    }

    /// Render with the original line endings and final-newline state.
    pub fn render(&self) -> Vec<u8> {
        let mut s = self.doc.to_string();
        if let Some(base) = &self.base {
            s = splice(&self.text, base, &s);
        }
        if !self.eof_newline {
            while s.ends_with('\n') {
                s.pop();
            }
        }
        if self.crlf {
            s = s.replace('\n', "\r\n");
        }
        s.into_bytes()
    }
}

/// Apply the line changes `base → edited` to `orig`, which has the same lines as `base`
/// up to formatting: unchanged lines come from `orig`, changed ones from `edited`.
fn splice(orig: &str, base: &str, edited: &str) -> String {
    let o: Vec<&str> = orig.split_inclusive('\n').collect();
    let a: Vec<&str> = base.split_inclusive('\n').collect();
    let b: Vec<&str> = edited.split_inclusive('\n').collect();
    let pre = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let max_suf = a.len().min(b.len()) - pre;
    let suf = a
        .iter()
        .rev()
        .zip(b.iter().rev())
        .take(max_suf)
        .take_while(|(x, y)| x == y)
        .count();
    let (am, bm) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    // LCS over the changed middle only (small: one or two tables).
    let mut l = vec![vec![0u32; bm.len() + 1]; am.len() + 1];
    for i in (0..am.len()).rev() {
        for j in (0..bm.len()).rev() {
            l[i][j] = if am[i] == bm[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let mut out = String::with_capacity(edited.len() + 1);
    // The original's last line may lack the newline `base` has: add it (render strips it).
    let push_orig = |out: &mut String, i: usize| {
        let line = o.get(i).copied().unwrap_or(a[i]);
        out.push_str(line);
        if !line.ends_with('\n') {
            out.push('\n');
        }
    };
    (0..pre).for_each(|i| push_orig(&mut out, i));
    let (mut i, mut j) = (0, 0);
    while i < am.len() || j < bm.len() {
        if i < am.len() && j < bm.len() && am[i] == bm[j] {
            push_orig(&mut out, pre + i);
            i += 1;
            j += 1;
        } else if j < bm.len() && (i == am.len() || l[i][j + 1] >= l[i + 1][j]) {
            out.push_str(bm[j]);
            j += 1;
        } else {
            i += 1;
        }
    }
    (a.len() - suf..a.len()).for_each(|i| push_orig(&mut out, i));
    out
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..offset.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let col_start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |p| p + 1);
    let column = String::from_utf8_lossy(&before[col_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_and_column_are_one_based() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn crlf_and_missing_final_newline_round_trip() {
        let p = Path::new("/x.toml");
        for s in [
            "a = 1\r\n[b]\r\nc = 2\r\n",
            "a = 1\n[b]\nc = 2",
            "",
            "a = 1\r\n[b]\r\nc = 2",
        ] {
            assert_eq!(
                Doc::parse_str(p, s).unwrap().render(),
                s.as_bytes(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn mixed_line_endings_are_kept_line_by_line() {
        let p = Path::new("/x.toml");
        let s = "a = 1\r\n[b]\nc = 2\r\n";
        let mut d = Doc::parse_str(p, s).unwrap();
        assert_eq!(d.render(), s.as_bytes());
        d.doc["b"]["e"] = toml_edit::value(3);
        assert_eq!(d.render(), b"a = 1\r\n[b]\nc = 2\r\ne = 3\n");
    }

    #[test]
    fn a_key_quoted_two_ways_keeps_both_quotings_when_edited() {
        let p = Path::new("/x.toml");
        let s = "[a.'b']\nx = 1\n\n[a.\"b\".c]\ny = 2";
        let mut d = Doc::parse_str(p, s).unwrap();
        assert_eq!(d.render(), s.as_bytes());
        d.doc["a"]["b"]["z"] = toml_edit::value(3);
        let out = String::from_utf8(d.render()).unwrap();
        assert_eq!(out, "[a.'b']\nx = 1\nz = 3\n\n[a.\"b\".c]\ny = 2");
    }

    #[test]
    fn parse_errors_report_line_and_column() {
        let e = Doc::parse_str(Path::new("/x.toml"), "a = 1\nb = = 2\n").unwrap_err();
        match e {
            ConfigError::ParseError { line, column, .. } => assert_eq!((line, column), (2, 5)),
            other => panic!("{other}"),
        }
        let e = Doc::parse(Path::new("/x.toml"), b"a = \"\xff\"\n").unwrap_err();
        assert_eq!(e.reason(), "ParseError");
    }
}
