//! Builds for different containerd releases: the containerd version a node runs
//! ([`ContainerdVersion`], as CRI `Version` reports it) and the range of releases a
//! `platforms` entry is built for ([`ContainerdRange`], its `containerd` field). Pure.
//!
//! A partial version in a range names every release with that prefix: `=2.2` is 2.2.x,
//! `<2.3` is below every 2.3.x, `<=2.2` is at most some 2.2.x, `>2.2` above every 2.2.x,
//! `>=2.3` at least 2.3.0 (npm's and Cargo's reading). A pre-release counts as its release:
//! `2.3.0-rc.1` is 2.3.0.
//!
//! Both parsers take hostile text (a CRI answer, a Shim from anyone who may write one): they
//! never panic, bound what they read, and quote at most a clipped copy in their errors.

use std::cmp::Ordering;
use std::fmt;

/// The longest range text accepted (the CRD's `maxLength` and CEL rule say the same).
pub const MAX_RANGE_CHARS: usize = 128;
/// The most digits of one version component in a range (the CEL rule's `[0-9]{1,9}`).
const MAX_RANGE_DIGITS: usize = 9;
/// How much of a bad input an error quotes.
const QUOTED_CHARS: usize = 64;

/// Why a version or a range does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not a containerd version: no leading number, or one too large.
    #[error(
        "{text:?} is not a containerd version: expected MAJOR[.MINOR[.PATCH]] with an optional leading v and any suffix (1.7.23, v2.3.4, 1.6.20~ds1)"
    )]
    Version { text: String },
    /// Not a range of the grammar `op version[, op version]...`.
    #[error(
        "{text:?} is not a containerd range ({detail}): expected comparators separated by commas, each an operator (>=, >, <=, <, =) and a version MAJOR[.MINOR[.PATCH]], e.g. \"<2.3\" or \">=1.6, <2.3\""
    )]
    Range { text: String, detail: &'static str },
}

/// The first characters of `s`, for an error message (Debug-quoted where shown).
fn quoted(s: &str) -> String {
    let mut out: String = s.chars().take(QUOTED_CHARS).collect();
    if s.chars().nth(QUOTED_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// The leading ASCII digits of `s` and the rest.
fn split_digits(s: &str) -> (&str, &str) {
    let at = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at_checked(at).unwrap_or((s, ""))
}

/// The containerd release a node runs: what CRI `Version` reports as `runtime_version`
/// (`1.6.20~ds1`, `v2.3.4`, `v1.7.23-k3s2`, `2.0.0-rc.1+unknown`), reduced to its numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerdVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
}

impl ContainerdVersion {
    /// Parse a reported version: an optional leading `v`, then up to three numeric
    /// components separated by dots, each the leading digits of its part; whatever follows
    /// (`~ds1`, `-k3s2`, `-rc.1+unknown`) is ignored, so a pre-release counts as its release.
    /// A missing minor or patch is 0.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let bad = || VersionError::Version { text: quoted(text) };
        let s = text.trim();
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts = [0u64; 3];
        let (digits, mut rest) = split_digits(s);
        parts[0] = digits.parse().map_err(|_| bad())?;
        for part in parts.iter_mut().skip(1) {
            let Some(after_dot) = rest.strip_prefix('.') else {
                break;
            };
            let (digits, after) = split_digits(after_dot);
            if digits.is_empty() {
                break;
            }
            *part = digits.parse().map_err(|_| bad())?;
            rest = after;
        }
        let [major, minor, patch] = parts;
        Ok(ContainerdVersion {
            major,
            minor,
            patch,
        })
    }
}

impl std::str::FromStr for ContainerdVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ContainerdVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// A comparison operator of a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ge,
    Gt,
    Le,
    Lt,
    Eq,
}

impl Op {
    /// Longest first: `>=` before `>`.
    const ALL: [(&'static str, Op); 5] = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        (">", Op::Gt),
        ("<", Op::Lt),
        ("=", Op::Eq),
    ];

    fn text(self) -> &'static str {
        match self {
            Op::Ge => ">=",
            Op::Gt => ">",
            Op::Le => "<=",
            Op::Lt => "<",
            Op::Eq => "=",
        }
    }

    /// Whether a version placed `at` relative to the comparator's prefix satisfies it.
    fn admits(self, at: Ordering) -> bool {
        match self {
            Op::Ge => at != Ordering::Less,
            Op::Gt => at == Ordering::Greater,
            Op::Le => at != Ordering::Greater,
            Op::Lt => at == Ordering::Less,
            Op::Eq => at == Ordering::Equal,
        }
    }
}

/// One numeric component of a range's version: 1 to 9 ASCII digits.
fn component(part: &str) -> Result<u64, &'static str> {
    if part.is_empty() || part.len() > MAX_RANGE_DIGITS {
        return Err("a version component that is not 1 to 9 digits");
    }
    if !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err("a version that is not MAJOR[.MINOR[.PATCH]]");
    }
    part.parse().map_err(|_| "a version component too large")
}

/// One `op MAJOR[.MINOR[.PATCH]]`; absent components leave the prefix open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Comparator {
    op: Op,
    major: u64,
    minor: Option<u64>,
    patch: Option<u64>,
}

impl Comparator {
    fn parse(text: &str) -> Result<Self, &'static str> {
        let text = text.trim_matches(' ');
        if text.is_empty() {
            return Err("an empty comparator");
        }
        let (op, rest) = Op::ALL
            .iter()
            .find_map(|(t, op)| text.strip_prefix(t).map(|rest| (*op, rest)))
            .ok_or("a comparator without an operator")?;
        let version = rest.trim_start_matches(' ');
        if version.is_empty() {
            return Err("an operator without a version");
        }
        let mut numbers = [None; 3];
        let mut parts = version.split('.');
        for (slot, part) in numbers.iter_mut().zip(&mut parts) {
            *slot = Some(component(part)?);
        }
        if parts.next().is_some() {
            return Err("a version with more than three components");
        }
        let [major, minor, patch] = numbers;
        let major = major.ok_or("an operator without a version")?;
        Ok(Comparator {
            op,
            major,
            minor,
            patch,
        })
    }

    /// Where `v` lies relative to the releases this comparator's version names.
    fn place(&self, v: &ContainerdVersion) -> Ordering {
        let by = |have: u64, want: Option<u64>| want.map_or(Ordering::Equal, |w| have.cmp(&w));
        v.major
            .cmp(&self.major)
            .then(by(v.minor, self.minor))
            .then(by(v.patch, self.patch))
    }
}

impl fmt::Display for Comparator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.op.text(), self.major)?;
        if let Some(minor) = self.minor {
            write!(f, ".{minor}")?;
        }
        if let Some(patch) = self.patch {
            write!(f, ".{patch}")?;
        }
        Ok(())
    }
}

/// The containerd releases a build is for: comparators separated by commas, all of which a
/// version must satisfy (`"<2.3"`, `">=1.6, <2.3"`, `"=2.2"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerdRange {
    comparators: Vec<Comparator>,
}

impl ContainerdRange {
    /// Parse a range; spaces (not other blanks, as the CEL rule says) are allowed around
    /// operators and commas.
    pub fn parse(text: &str) -> Result<Self, VersionError> {
        let bad = |detail| VersionError::Range {
            text: quoted(text),
            detail,
        };
        if text.chars().nth(MAX_RANGE_CHARS).is_some() {
            return Err(bad("longer than 128 characters"));
        }
        let comparators = text
            .split(',')
            .map(Comparator::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(bad)?;
        Ok(ContainerdRange { comparators })
    }

    /// True when `version` satisfies every comparator.
    pub fn contains(&self, version: &ContainerdVersion) -> bool {
        self.comparators
            .iter()
            .all(|c| c.op.admits(c.place(version)))
    }
}

impl std::str::FromStr for ContainerdRange {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ContainerdRange {
    /// The normalized text: `>=1.6, <2.3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.comparators.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &str) -> ContainerdVersion {
        ContainerdVersion::parse(s).unwrap()
    }

    fn r(s: &str) -> ContainerdRange {
        ContainerdRange::parse(s).unwrap()
    }

    #[test]
    fn reported_versions_parse_to_their_release() {
        for (text, want) in [
            ("1.6.20~ds1", (1, 6, 20)),
            ("v2.3.4", (2, 3, 4)),
            ("v1.7.23-k3s2", (1, 7, 23)),
            ("2.0.0-rc.1+unknown", (2, 0, 0)),
            ("1.7.27-0ubuntu1~24.04.2", (1, 7, 27)),
            ("2.3.0-rc.1", (2, 3, 0)),
            ("2", (2, 0, 0)),
            ("v2.1", (2, 1, 0)),
            ("1.7.x", (1, 7, 0)),
            (" 1.7.2\n", (1, 7, 2)),
        ] {
            let got = v(text);
            assert_eq!((got.major, got.minor, got.patch), want, "{text}");
        }
        assert_eq!(v("v1.7.23-k3s2").to_string(), "1.7.23");
    }

    #[test]
    fn text_without_a_leading_number_is_not_a_version() {
        for bad in [
            "",
            "v",
            "vv1.2",
            "containerd",
            "-1.2",
            ".1",
            "99999999999999999999999",
        ] {
            let e = ContainerdVersion::parse(bad).unwrap_err();
            assert!(e.to_string().contains("is not a containerd version"), "{e}");
        }
        let long = "x".repeat(10_000);
        let e = ContainerdVersion::parse(&long).unwrap_err().to_string();
        assert!(e.len() < 400, "errors quote a clipped copy: {e}");
    }

    #[test]
    fn ranges_admit_the_releases_they_name() {
        let below = r("<2.3");
        assert!(below.contains(&v("1.6.20~ds1")) && below.contains(&v("2.2.7")));
        assert!(!below.contains(&v("2.3.0-rc.1")) && !below.contains(&v("v2.3.4")));
        let from = r(">=2.3");
        assert!(from.contains(&v("2.3.0-rc.1")) && from.contains(&v("3.0.0")));
        assert!(!from.contains(&v("2.2.99")));
        let window = r(">=1.6, <2.3");
        assert!(window.contains(&v("1.6.0")) && window.contains(&v("2.2.7")));
        assert!(!window.contains(&v("1.5.9")) && !window.contains(&v("2.3.0")));
        // a partial version names every release with that prefix
        let series = r("=2.2");
        assert!(series.contains(&v("2.2.0")) && series.contains(&v("2.2.7")));
        assert!(!series.contains(&v("2.3.0")) && !series.contains(&v("2.1.9")));
        assert!(r("<=2.2").contains(&v("2.2.7")) && !r("<=2.2").contains(&v("2.3.0")));
        assert!(!r(">2.2").contains(&v("2.2.7")) && r(">2.2").contains(&v("2.3.0")));
        assert!(r("=2.2.1").contains(&v("2.2.1")) && !r("=2.2.1").contains(&v("2.2.2")));
        assert!(r("=2").contains(&v("2.9.9")) && !r("=2").contains(&v("1.7.0")));
    }

    #[test]
    fn ranges_display_normalized() {
        assert_eq!(r(">=1.6,<2.3").to_string(), ">=1.6, <2.3");
        assert_eq!(r("  >= 01.6 ,   < 2.3.0 ").to_string(), ">=1.6, <2.3.0");
        assert_eq!(r("=2.2").to_string(), "=2.2");
        assert!(
            ContainerdRange::parse("\t<2.3").is_err(),
            "only spaces, as in CEL"
        );
    }

    #[test]
    fn malformed_ranges_are_refused_with_what_is_wrong() {
        for (bad, detail) in [
            ("", "an empty comparator"),
            ("2.3", "a comparator without an operator"),
            ("<", "an operator without a version"),
            (">= ", "an operator without a version"),
            ("<2.3,", "an empty comparator"),
            ("~2.3", "a comparator without an operator"),
            ("<2.3.4.5", "more than three components"),
            ("<2.x", "not MAJOR[.MINOR[.PATCH]]"),
            ("<v2.3", "not MAJOR[.MINOR[.PATCH]]"),
            ("<2..3", "not 1 to 9 digits"),
            ("<1234567890", "not 1 to 9 digits"),
            ("== 2.3", "not MAJOR[.MINOR[.PATCH]]"),
            ("<2.3 >1.6", "not MAJOR[.MINOR[.PATCH]]"),
        ] {
            let e = ContainerdRange::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains(detail) && e.contains("is not a containerd range"),
                "{bad:?}: {e}"
            );
        }
        let long = format!("<{}", "1.".repeat(70));
        let e = ContainerdRange::parse(&long).unwrap_err().to_string();
        assert!(e.contains("longer than 128 characters"), "{e}");
    }

    proptest! {
        #[test]
        fn parsing_arbitrary_text_never_panics(s in any::<String>()) {
            let _ = ContainerdVersion::parse(&s);
            if let Ok(range) = ContainerdRange::parse(&s) {
                // the normalized text parses back to the same range
                prop_assert_eq!(ContainerdRange::parse(&range.to_string()), Ok(range));
            }
        }

        #[test]
        fn parsing_range_shaped_text_never_panics(s in "[<>=,. 0-9v~-]{0,40}") {
            if let Ok(range) = ContainerdRange::parse(&s) {
                prop_assert_eq!(ContainerdRange::parse(&range.to_string()), Ok(range.clone()));
                let _ = range.contains(&ContainerdVersion { major: u64::MAX, minor: 0, patch: u64::MAX });
            }
            let _ = ContainerdVersion::parse(&s);
        }
    }
}
