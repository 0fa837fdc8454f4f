//! What to fetch: the plain input types the caller maps a Shim's `fetchStrategy` onto
//! ([`FetchSpec`]), the node's platform, and the choice of one concrete source for this node
//! and the containerd it runs ([`FetchSpec::resolve`]).

use super::{ArtifactError, ContainerdRange, ContainerdVersion};

/// The node's OS and architecture, named as Kubernetes and Go name them (`linux`, `amd64`,
/// `arm64`, ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Platform {
    pub os: String,
    pub arch: String,
}

impl Platform {
    /// A platform from its names; the architecture may be spelt the Go way or the kernel's
    /// way ([`normalize_arch`]).
    pub fn new(os: &str, arch: &str) -> Self {
        Platform {
            os: os.to_ascii_lowercase(),
            arch: normalize_arch(arch).to_string(),
        }
    }

    /// True when a `platforms` entry written `os`/`arch` (either spelling) is this platform.
    pub fn is(&self, os: &str, arch: &str) -> bool {
        self.os.eq_ignore_ascii_case(os) && self.arch == normalize_arch(arch)
    }
}

/// An architecture's Go name (what Kubernetes, OCI and kata use: `amd64`, `arm64`), from
/// either spelling: runwasi and spin name their assets the kernel's way (`uname -m`:
/// `x86_64`, `aarch64`). Unknown names are kept as they are. The one place the two
/// spellings meet: node platforms, `--platform` and the spec's `platforms` go through it.
pub fn normalize_arch(arch: &str) -> &str {
    match arch {
        "x86_64" | "x86-64" | "x64" => "amd64",
        "aarch64" | "arm64v8" => "arm64",
        "i386" | "i486" | "i586" | "i686" | "x86" => "386",
        "armv7l" | "armv7" | "armv6l" | "armhf" | "armel" => "arm",
        "powerpc64le" | "ppc64el" => "ppc64le",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64el" => "mips64le",
        other => other, // amd64, arm64, riscv64, s390x, ...: already Go's
    }
}

/// The platform this process runs on, with Go's names (`x86_64` → `amd64`, `aarch64` → `arm64`).
pub fn node_platform() -> Platform {
    let arch = match std::env::consts::ARCH {
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        other => other,
    };
    Platform::new(std::env::consts::OS, arch)
}

/// One downloadable artifact: an `http://`, `https://` or `file://` URL and its sha256.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ArtifactSource {
    /// URL of a `.tar.gz`, a `.tar` or a bare ELF shim binary. A `file://` path is read
    /// as this process sees it, not through the HostRoot: an image builder points at a
    /// file on the build machine, an air-gapped node at one on its own disk. A bare binary
    /// is stored under the URL's last path segment.
    pub location: String,
    /// Expected sha256 of the downloaded bytes (64 hex digits, `sha256:` prefix allowed).
    pub sha256: Option<String>,
}

/// One entry of `fetchStrategy.platforms`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlatformSource {
    pub os: String,
    pub arch: String,
    pub source: ArtifactSource,
    /// The containerd releases this build is for ([`ContainerdRange`] text, e.g. `<2.3`);
    /// `None`: any. Kept as written and parsed by [`FetchSpec::resolve`], so that a bad range
    /// fails the Shim's fetch, not the reading of its spec.
    pub containerd: Option<String>,
}

/// Credentials for an OCI registry.
#[derive(Clone, PartialEq, Eq, Default)]
pub enum OciAuth {
    /// Anonymous pull (the registry's anonymous token flow is followed if it asks for one).
    #[default]
    Anonymous,
    /// A bearer token sent as is.
    Bearer(String),
}

impl std::fmt::Debug for OciAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OciAuth::Anonymous => f.write_str("Anonymous"),
            OciAuth::Bearer(_) => f.write_str("Bearer(<redacted>)"),
        }
    }
}

/// An OCI artifact or image whose single layer (or the layer named by `layer`) is the
/// shim archive.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OciSource {
    /// `registry/repo@sha256:...` (a tag is accepted only with unverified artifacts allowed).
    pub reference: String,
    pub auth: OciAuth,
    /// Pick this layer digest when the manifest has several layers.
    pub layer: Option<String>,
    /// Talk plain HTTP to the registry (a mirror on localhost, tests).
    pub insecure_http: bool,
}

/// The caller's view of a Shim's `fetchStrategy`, as plain data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FetchSpec {
    /// `anonymousHttp` or `oci`; anything else is [`ArtifactError::UnknownStrategy`].
    pub strategy: String,
    /// The default artifact (`anonHttp`).
    pub anon_http: Option<ArtifactSource>,
    /// Per-platform overrides.
    pub platforms: Vec<PlatformSource>,
    /// The `oci` section.
    pub oci: Option<OciSource>,
}

/// The one source chosen for this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedSource {
    Http(ArtifactSource),
    Oci(OciSource),
}

impl FetchSpec {
    /// Choose the source for `platform` and the node's `containerd` version: the first
    /// `platforms` entry whose os/arch match and whose `containerd` range (if any) includes
    /// the version wins; else `anon_http`, which fits every containerd. Every entry's range
    /// is checked for form, as are digests; whether a missing digest is acceptable is the
    /// fetcher's decision.
    pub fn resolve(
        &self,
        platform: &Platform,
        containerd: Option<&ContainerdVersion>,
    ) -> Result<ResolvedSource, ArtifactError> {
        match self.strategy.as_str() {
            "anonymousHttp" => {
                let src = self.pick_http(platform, containerd)?;
                if let Some(d) = &src.sha256 {
                    parse_sha256(d)?;
                }
                Ok(ResolvedSource::Http(src.clone()))
            }
            "oci" => match &self.oci {
                Some(o) => Ok(ResolvedSource::Oci(o.clone())),
                None => Err(ArtifactError::InvalidSpec {
                    detail: "fetchStrategy.type is \"oci\" but the oci section is missing".into(),
                }),
            },
            other => Err(ArtifactError::UnknownStrategy {
                strategy: other.to_string(),
            }),
        }
    }

    /// The `anonymousHttp` artifact for this node, or why there is none.
    fn pick_http(
        &self,
        platform: &Platform,
        containerd: Option<&ContainerdVersion>,
    ) -> Result<&ArtifactSource, ArtifactError> {
        let mut builds: Vec<(&PlatformSource, Option<ContainerdRange>)> = Vec::new();
        for (i, p) in self.platforms.iter().enumerate() {
            let range = p.containerd.as_deref().map(ContainerdRange::parse);
            let range = range.transpose().map_err(|e| ArtifactError::InvalidSpec {
                detail: format!(
                    "fetchStrategy.platforms[{i}] ({}/{}): containerd: {e}",
                    p.os, p.arch
                ),
            })?;
            if platform.is(&p.os, &p.arch) {
                builds.push((p, range));
            }
        }
        let fits = |range: &Option<ContainerdRange>| match (range, containerd) {
            (None, _) => true,
            (Some(r), Some(v)) => r.contains(v),
            (Some(_), None) => false,
        };
        if let Some((p, _)) = builds.iter().find(|(_, range)| fits(range)) {
            return Ok(&p.source);
        }
        if let Some(a) = &self.anon_http {
            return Ok(a);
        }
        let shown = format!("{}/{}", platform.os, platform.arch);
        let offered = || {
            let ranges: Vec<String> = builds
                .iter()
                .filter_map(|(_, r)| r.as_ref().map(|r| format!("\"{r}\"")))
                .collect();
            ranges.join(", ")
        };
        Err(match (builds.is_empty(), containerd) {
            (true, _) => ArtifactError::NoPlatformMatch {
                os: platform.os.clone(),
                arch: platform.arch.clone(),
                available: self.platforms_offered(),
            },
            (false, Some(v)) => ArtifactError::NoBuildForContainerd {
                version: v.to_string(),
                platform: shown,
                offered: offered(),
            },
            (false, None) => ArtifactError::ContainerdVersionUnknown {
                platform: shown,
                offered: offered(),
            },
        })
    }

    /// The `platforms` entries' os/arch, each once, in order.
    fn platforms_offered(&self) -> String {
        let mut offered: Vec<String> = Vec::new();
        for p in &self.platforms {
            let one = format!("{}/{}", p.os, p.arch);
            if !offered.contains(&one) {
                offered.push(one);
            }
        }
        offered.join(", ")
    }
}

/// Normalise a sha256 (`ABC...`, `sha256:abc...`) to 64 lowercase hex digits.
pub fn parse_sha256(s: &str) -> Result<String, ArtifactError> {
    let hex = s.trim().strip_prefix("sha256:").unwrap_or(s.trim());
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex.to_ascii_lowercase())
    } else {
        Err(ArtifactError::InvalidSpec {
            detail: format!("{s:?} is not a sha256 digest (64 hex digits)"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(loc: &str) -> ArtifactSource {
        ArtifactSource {
            location: loc.into(),
            sha256: Some("a".repeat(64)),
        }
    }

    #[test]
    fn a_matching_platform_entry_wins_over_the_default() {
        let spec = FetchSpec {
            strategy: "anonymousHttp".into(),
            anon_http: Some(src("http://x/default")),
            platforms: vec![PlatformSource {
                os: "linux".into(),
                arch: "arm64".into(),
                source: src("http://x/arm64"),
                containerd: None,
            }],
            oci: None,
        };
        let arm = spec
            .resolve(&Platform::new("linux", "arm64"), None)
            .unwrap();
        assert_eq!(arm, ResolvedSource::Http(src("http://x/arm64")));
        let amd = spec
            .resolve(&Platform::new("linux", "amd64"), None)
            .unwrap();
        assert_eq!(amd, ResolvedSource::Http(src("http://x/default")));
    }

    #[test]
    fn both_spellings_of_an_architecture_name_the_same_platform() {
        // runwasi and spin name assets the uname way, kata and Go the Go way
        for (written, node) in [
            ("x86_64", "amd64"),
            ("amd64", "amd64"),
            ("aarch64", "arm64"),
            ("arm64", "arm64"),
            ("x86_64", "x86_64"), // a --platform given the uname way
        ] {
            let spec = FetchSpec {
                strategy: "anonymousHttp".into(),
                platforms: vec![PlatformSource {
                    os: "linux".into(),
                    arch: written.into(),
                    source: src("http://x/it"),
                    containerd: None,
                }],
                ..Default::default()
            };
            let got = spec.resolve(&Platform::new("linux", node), None);
            assert_eq!(
                got.unwrap(),
                ResolvedSource::Http(src("http://x/it")),
                "{written} on {node}"
            );
        }
        assert_eq!(Platform::new("linux", "aarch64").arch, "arm64");
        assert_eq!(normalize_arch("riscv64"), "riscv64");
        assert_eq!(normalize_arch("ünknown"), "ünknown");
        // the other architecture is still not a match
        let spec = FetchSpec {
            strategy: "anonymousHttp".into(),
            platforms: vec![PlatformSource {
                os: "linux".into(),
                arch: "aarch64".into(),
                source: src("http://x/arm"),
                containerd: None,
            }],
            ..Default::default()
        };
        let e = spec
            .resolve(&Platform::new("linux", "amd64"), None)
            .unwrap_err();
        assert_eq!(e.reason(), "NoPlatformMatch");
    }

    #[test]
    fn no_match_and_no_default_lists_what_is_offered() {
        let spec = FetchSpec {
            strategy: "anonymousHttp".into(),
            platforms: vec![PlatformSource {
                os: "linux".into(),
                arch: "arm64".into(),
                source: src("http://x/arm64"),
                containerd: None,
            }],
            ..Default::default()
        };
        let e = spec
            .resolve(&Platform::new("linux", "amd64"), None)
            .unwrap_err();
        assert_eq!(e.reason(), "NoPlatformMatch");
        assert!(e.to_string().contains("linux/arm64"), "{e}");
    }

    #[test]
    fn an_unknown_strategy_is_refused_by_name() {
        let spec = FetchSpec {
            strategy: "ftp".into(),
            ..Default::default()
        };
        let e = spec.resolve(&node_platform(), None).unwrap_err();
        assert_eq!(e.reason(), "UnknownFetchStrategy");
        assert!(e.to_string().contains("\"ftp\""), "{e}");
    }

    #[test]
    fn sha256_forms_are_normalised_and_bad_ones_refused() {
        let h = "AB".repeat(32);
        assert_eq!(
            parse_sha256(&format!("sha256:{h}")).unwrap(),
            "ab".repeat(32)
        );
        assert_eq!(
            parse_sha256("abc").unwrap_err().reason(),
            "InvalidFetchSpec"
        );
        assert!(parse_sha256(&"g".repeat(64)).is_err());
    }

    fn build(arch: &str, range: Option<&str>, loc: &str) -> PlatformSource {
        PlatformSource {
            os: "linux".into(),
            arch: arch.into(),
            source: src(loc),
            containerd: range.map(str::to_string),
        }
    }

    /// linux/amd64 builds: `<2.3` first, then `>=2.3`; one arm64 build for any containerd.
    fn builds() -> FetchSpec {
        FetchSpec {
            strategy: "anonymousHttp".into(),
            platforms: vec![
                build("x86_64", Some("<2.3"), "old"),
                build("x86_64", Some(">=2.3"), "new"),
                build("aarch64", None, "arm-any"),
            ],
            ..Default::default()
        }
    }

    /// The location `spec` resolves to on linux/`arch` with containerd `version`.
    fn pick(spec: &FetchSpec, arch: &str, version: Option<&str>) -> Result<String, ArtifactError> {
        let v = version.map(|c| ContainerdVersion::parse(c).unwrap());
        match spec.resolve(&Platform::new("linux", arch), v.as_ref())? {
            ResolvedSource::Http(a) => Ok(a.location),
            ResolvedSource::Oci(o) => Ok(o.reference),
        }
    }

    #[test]
    fn a_node_gets_the_build_whose_containerd_range_includes_its_version() {
        let spec = builds();
        for (reported, want) in [
            ("1.6.20~ds1", "old"),
            ("2.2.7", "old"),
            ("v2.3.4", "new"),
            ("2.3.0-rc.1", "new"),
        ] {
            assert_eq!(
                pick(&spec, "amd64", Some(reported)).unwrap(),
                want,
                "{reported}"
            );
        }
        // an entry without a range fits any containerd, known or not
        for reported in [Some("1.6.20~ds1"), Some("v2.3.4"), None] {
            assert_eq!(pick(&spec, "arm64", reported).unwrap(), "arm-any");
        }
    }

    #[test]
    fn the_first_fitting_entry_wins() {
        let mut spec = builds();
        spec.platforms
            .insert(1, build("amd64", Some("=2.2"), "2.2.x"));
        // both `<2.3` and `=2.2` include 2.2.7: the earlier entry is taken
        assert_eq!(pick(&spec, "amd64", Some("2.2.7")).unwrap(), "old");
        spec.platforms.swap(0, 1);
        assert_eq!(pick(&spec, "amd64", Some("2.2.7")).unwrap(), "2.2.x");
        // a range-less entry before ranged ones takes every version
        spec.platforms.insert(0, build("amd64", None, "any"));
        assert_eq!(pick(&spec, "amd64", Some("v2.3.4")).unwrap(), "any");
    }

    #[test]
    fn no_build_for_the_nodes_containerd_lists_the_ranges_offered() {
        let mut spec = builds();
        spec.platforms.remove(1); // only `<2.3` for amd64 now
        let e = pick(&spec, "amd64", Some("v2.3.4")).unwrap_err();
        assert_eq!(e.reason(), "NoBuildForContainerd");
        assert!(!e.is_transient());
        let m = e.to_string();
        assert!(m.contains("containerd 2.3.4 on linux/amd64"), "{m}");
        assert!(m.contains("[\"<2.3\"]") && !m.contains("arm64"), "{m}");
        // anonHttp fits every containerd
        spec.anon_http = Some(src("default"));
        assert_eq!(pick(&spec, "amd64", Some("v2.3.4")).unwrap(), "default");
    }

    #[test]
    fn an_unknown_containerd_version_cannot_choose_between_ranged_builds() {
        let e = pick(&builds(), "amd64", None).unwrap_err();
        assert_eq!(e.reason(), "ContainerdVersionUnknown");
        assert!(!e.is_transient());
        let m = e.to_string();
        assert!(m.contains("could not ask containerd its version"), "{m}");
        assert!(
            m.contains("--containerd-version") && m.contains("\">=2.3\""),
            "{m}"
        );
        // no entry for the platform at all is still NoPlatformMatch, each platform once
        let e = pick(&builds(), "s390x", Some("2.2.7")).unwrap_err();
        assert_eq!(e.reason(), "NoPlatformMatch");
        assert!(
            e.to_string().contains("[linux/x86_64, linux/aarch64]"),
            "{e}"
        );
    }

    #[test]
    fn a_malformed_range_is_an_invalid_spec_naming_its_entry() {
        let mut spec = builds();
        spec.platforms[2].containerd = Some("2.3+".into());
        // refused on every node, not only the ones that entry is for
        let e = pick(&spec, "amd64", Some("2.2.7")).unwrap_err();
        assert_eq!(e.reason(), "InvalidFetchSpec");
        let m = e.to_string();
        assert!(
            m.contains("fetchStrategy.platforms[2] (linux/aarch64)"),
            "{m}"
        );
        assert!(m.contains("\"2.3+\" is not a containerd range"), "{m}");
    }

    #[test]
    fn node_platform_uses_go_arch_names() {
        let p = node_platform();
        assert_eq!(p.os, "linux");
        assert!(!["x86_64", "aarch64"].contains(&p.arch.as_str()), "{p:?}");
    }
}
