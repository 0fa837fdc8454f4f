//! What `shim-agent doctor` finds on a node or in an image root, before it is judged: plain
//! data, gathered by [`super::gather`] and judged by [`super::judge`]. Nothing here holds a
//! secret: proxy URLs are redacted as they are read ([`redact_proxy`]).

/// What was probed: `Ok(value)`, or why it could not be had.
pub type Probe<T> = Result<T, String>;

/// Where the doctor looks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The running node: systemd, containerd's socket and the API server are asked.
    Node { name: String },
    /// An image root (`--root`): only its files are read.
    Image { root: String },
}

/// Everything the doctor found.
#[derive(Debug, Clone)]
pub struct Facts {
    pub target: Target,
    pub profile: ProfileFacts,
    /// containerd's config files, read as the agent reads them.
    pub config: Probe<ConfigFacts>,
    /// The registry hosts directories the config names (`config_path`), as found.
    pub hosts_dirs: Vec<HostsDir>,
    /// containerd's systemd unit (`None` in an image root).
    pub unit: Option<Probe<UnitFacts>>,
    /// containerd's version: from CRI on a node, from `containerd --version` in an image.
    pub version: Probe<String>,
    /// containerd's CRI over its socket (`None` in an image root).
    pub cri: Option<Probe<CriFacts>>,
    /// The sandbox image and whether containerd has it (`None` in an image root).
    pub sandbox_image: Option<SandboxImage>,
    /// The kubeconfig the agent would use (`None` in an image root).
    pub credentials: Option<Credentials>,
    /// The API server, asked with those credentials (`None`: no credentials, or an image).
    pub api: Option<Probe<ApiFacts>>,
    /// Free space where the agent writes.
    pub space: Vec<SpaceFacts>,
    /// The proxy variables of the agent's service and of containerd's (redacted).
    pub proxies: Vec<ProxySource>,
    /// The lease duration the slots and the election use (clock skew is judged against it).
    pub lease_duration_secs: u64,
    /// The node's signature policy, loaded as an install loads it.
    pub signatures: Probe<SignatureFacts>,
}

/// The node's signature policy (`[signatures]`), as loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignatureFacts {
    pub require: bool,
    pub identities: usize,
    pub keys: usize,
    /// The trusted root it names; `None`: Sigstore's public-good root, built in.
    pub trusted_root: Option<String>,
    pub without_signed_time: bool,
}

/// The containerd profile the agent resolved (detected or configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileFacts {
    pub name: String,
    pub config: String,
    pub unit: String,
    pub socket: String,
    /// Why the agent must not change this system's containerd config, when it must not.
    pub unsupported: Option<String>,
}

/// What the config files say that matters to the doctor.
pub use crate::containerd::images::ImageSettings as ConfigFacts;

/// One registry hosts directory (`certs.d`) and the registries it configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsDir {
    pub dir: String,
    pub exists: bool,
    pub registries: Vec<HostsFile>,
}

/// One registry's `hosts.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostsFile {
    /// The directory's name: the registry host (`docker.io`, `_default`).
    pub registry: String,
    /// Why containerd cannot use the file, if it cannot.
    pub problem: Option<String>,
}

/// A systemd unit as its D-Bus object reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitFacts {
    /// `loaded`, `not-found`, `masked`, ...
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
}

/// What containerd's CRI says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CriFacts {
    pub runtime_ready: bool,
    /// Why the runtime is not ready, when it is not.
    pub runtime_detail: String,
}

/// The sandbox image every pod (and the agent's runtime check) needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SandboxImage {
    Present(String),
    /// Not in containerd's image store: the runtime check must pull it.
    Absent(String),
    /// Which image, or whether it is there, could not be found out.
    Unknown(String),
}

/// The credentials the agent would connect with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// A usable kubeconfig (or in-cluster): where it is.
    Ready(String),
    /// A kubeconfig is expected but not usable yet: why.
    Waiting(String),
    /// No cluster credentials: static Shims only.
    Nothing,
}

/// What the API server answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiFacts {
    /// Its `/version` (`v1.36.2`).
    pub server_version: String,
    /// Who the credentials are, by `SelfSubjectReview`.
    pub identity: Probe<Identity>,
    /// The API server's clock minus this node's, in seconds (from its `Date` header).
    pub skew_secs: Option<f64>,
}

/// A user as the API server authenticates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub username: String,
    pub groups: Vec<String>,
}

/// Free space under one of the agent's directories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceFacts {
    /// `state` or `install`.
    pub what: &'static str,
    pub path: String,
    /// Bytes available to the agent (root), or why that is unknown.
    pub free: Probe<u64>,
}

/// The proxy variables one process runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxySource {
    /// `shim-agent.service`, `containerd.service`, or `this shell`.
    pub source: String,
    /// `NAME=value` pairs, values redacted; or why they could not be read.
    pub vars: Probe<Vec<(String, String)>>,
}

/// The environment variables that choose a proxy, in both spellings.
pub const PROXY_VARS: &[&str] = &[
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// The proxy variables among `NAME=value` entries, values redacted, in [`PROXY_VARS`] order;
/// a name given twice has its last value (as systemd's `Environment=` lines do).
pub fn proxy_vars<'a>(entries: impl IntoIterator<Item = &'a str>) -> Vec<(String, String)> {
    let mut found = std::collections::BTreeMap::new();
    for (k, v) in entries.into_iter().filter_map(|e| e.split_once('=')) {
        if let Some(i) = PROXY_VARS.iter().position(|p| *p == k) {
            found.insert(i, (k.to_string(), redact_proxy(k, v)));
        }
    }
    found.into_values().collect()
}

/// A proxy variable's value fit to print: a URL's user and password are replaced by `***`
/// (a proxy URL often carries credentials); `NO_PROXY` lists are kept, clipped.
pub fn redact_proxy(name: &str, value: &str) -> String {
    if name.eq_ignore_ascii_case("no_proxy") {
        return crate::text::clip(value, 512);
    }
    let value = value.trim();
    // scheme://userinfo@host...: cut the userinfo without parsing the rest (which may be
    // anything a user typed); an '@' after the authority is a path's, not a password's.
    let (scheme, rest) = match value.split_once("://") {
        Some((s, r)) => (Some(s), r),
        None => (None, value),
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    // find() returns a char boundary, so the split cannot fail
    let (authority, tail) = rest.split_at_checked(authority_end).unwrap_or((rest, ""));
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_string(),
    };
    let out = match scheme {
        Some(s) => format!("{s}://{authority}{tail}"),
        None => format!("{authority}{tail}"),
    };
    crate::text::clip(&out, 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_credentials_never_survive_redaction() {
        for (value, want) in [
            (
                "http://user:s3cret@proxy.example:3128",
                "http://***@proxy.example:3128",
            ),
            ("http://proxy.example:3128/", "http://proxy.example:3128/"),
            ("user:s3cret@proxy:8080", "***@proxy:8080"),
            (
                "https://a%40b:p@ss@proxy/x@y",
                "https://***@proxy/x@y", // the last '@' of the authority ends the userinfo
            ),
            ("socks5://tok@[::1]:1080", "socks5://***@[::1]:1080"),
        ] {
            let got = redact_proxy("HTTPS_PROXY", value);
            assert_eq!(got, want, "{value}");
            assert!(!got.contains("s3cret") && !got.contains("tok@"), "{got}");
        }
        assert_eq!(
            redact_proxy("NO_PROXY", "10.0.0.0/8,.svc"),
            "10.0.0.0/8,.svc"
        );
    }

    #[test]
    fn only_proxy_variables_are_kept_once_each_in_a_fixed_order() {
        let env = [
            "PATH=/usr/bin",
            "NO_PROXY=localhost",
            "HTTPS_PROXY=http://u:p@proxy:3128",
            "HTTPS_PROXY=http://later:3128",
            "TOKEN=secret",
            "broken",
        ];
        assert_eq!(
            proxy_vars(env),
            vec![
                ("HTTPS_PROXY".to_string(), "http://later:3128".to_string()),
                ("NO_PROXY".to_string(), "localhost".to_string()),
            ]
        );
    }
}
