//! Registry credentials from the node, never from the Shim (pure): a Docker-style
//! `config.json`, and the kubelet's credential providers (`CredentialProviderConfig`,
//! `kubelet.config.k8s.io/v1`; plugins speaking `credentialprovider.kubelet.k8s.io/v1`) with
//! the kubelet's image matching rules. Running a plugin is [`super::credential_exec`]'s.
//!
//! A [`Secret`] prints as `***`: no credential reaches a log line, an Event, a status or an
//! error through its `Debug` or `Display`.

use std::time::Duration;

use serde::Deserialize;

/// A user and password for one registry host.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// The host part of a `config.json` key or a provider's auth key (`https://r.example/v1/`
/// → `r.example`), Docker Hub's names as one.
fn host_of(key: &str) -> String {
    let rest = key.split_once("://").map_or(key, |(_, r)| r);
    let host = rest.split('/').next().unwrap_or("");
    match host {
        "index.docker.io" | "registry-1.docker.io" | "docker.io" => "docker.io".into(),
        h => h.to_ascii_lowercase(),
    }
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// The credentials a Docker `config.json` holds for `registry` (`host[:port]`). `Err`: why
/// the file cannot be used (never its content).
pub fn from_docker_config(text: &str, registry: &str) -> Result<Option<Secret>, String> {
    use base64::Engine;
    let cfg: DockerConfig = serde_json::from_str(text).map_err(|e| {
        format!(
            "not a Docker config.json (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    let want = host_of(registry);
    let Some((_, a)) = cfg.auths.iter().find(|(k, _)| host_of(k) == want) else {
        return Ok(None);
    };
    if let (Some(u), Some(p)) = (&a.username, &a.password) {
        return Ok(Some(Secret {
            username: u.clone(),
            password: p.clone(),
        }));
    }
    let Some(auth) = &a.auth else {
        return Ok(None);
    };
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(auth.trim())
        .map_err(|_| format!("the auth of {want} is not base64"))?;
    let decoded =
        String::from_utf8(decoded).map_err(|_| format!("the auth of {want} is not UTF-8"))?;
    let (u, p) = decoded
        .split_once(':')
        .ok_or_else(|| format!("the auth of {want} is not user:password"))?;
    Ok(Some(Secret {
        username: u.into(),
        password: p.into(),
    }))
}

/// Credentials for an `anonymousHttp` artifact server, from the node's
/// `fetch.http-credentials-file`.
#[derive(Clone, PartialEq, Eq)]
pub enum HttpCredential {
    Basic(Secret),
    Bearer(String),
}

impl std::fmt::Debug for HttpCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpCredential::Basic(_) => f.write_str("Basic(***)"),
            HttpCredential::Bearer(_) => f.write_str("Bearer(***)"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpCredentialsFile {
    #[serde(default)]
    hosts: std::collections::BTreeMap<String, HttpHost>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct HttpHost {
    username: Option<String>,
    password: Option<String>,
    bearer_token: Option<String>,
}

/// The credential `fetch.http-credentials-file` (TOML: `[hosts."host[:port]"]` with
/// `username` and `password`, or `bearer-token`) has for `host` (`host[:port]` of the URL).
/// `Err`: why the file cannot be used, never its content.
pub fn http_credential(text: &str, host: &str) -> Result<Option<HttpCredential>, String> {
    let f: HttpCredentialsFile = toml_edit::de::from_str(text).map_err(|e| {
        let what = e.to_string();
        // toml's messages quote the offending line, which may hold a secret: keep the first line
        format!(
            "not a credentials file: {}",
            crate::text::clip(what.lines().last().unwrap_or(""), 160)
        )
    })?;
    let want = host.to_ascii_lowercase();
    let Some((key, h)) = f.hosts.iter().find(|(k, _)| k.to_ascii_lowercase() == want) else {
        return Ok(None);
    };
    match (&h.username, &h.password, &h.bearer_token) {
        (Some(u), Some(p), None) => Ok(Some(HttpCredential::Basic(Secret {
            username: u.clone(),
            password: p.clone(),
        }))),
        (None, None, Some(t)) => Ok(Some(HttpCredential::Bearer(t.clone()))),
        _ => Err(format!(
            "hosts.{key:?}: give username and password, or bearer-token"
        )),
    }
}

/// The kubelet's rule for a `matchImages` entry (or an auth key) against an image
/// (`host[:port]/path…`): the same number of host labels, each matching its glob (`*` within
/// one label), the same port, and the pattern's path a prefix of the image's.
pub fn image_matches(pattern: &str, image: &str) -> bool {
    let split = |s: &str| -> (String, String, String) {
        let s = s.split_once("://").map_or(s, |(_, r)| r);
        let (hostport, path) = s.split_once('/').map_or((s, ""), |(h, p)| (h, p));
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) if p.chars().all(|c| c.is_ascii_digit()) => (h, p),
            _ => (hostport, ""),
        };
        (
            host.to_ascii_lowercase(),
            port.to_string(),
            path.to_string(),
        )
    };
    let (ph, pp, ppath) = split(pattern);
    let (ih, ip, ipath) = split(image);
    if pp != ip || !ipath.starts_with(&ppath) {
        return false;
    }
    let (pl, il): (Vec<&str>, Vec<&str>) = (ph.split('.').collect(), ih.split('.').collect());
    pl.len() == il.len() && pl.iter().zip(&il).all(|(p, i)| glob(p, i))
}

/// `*` matches any run of characters (none included); everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else {
                return false;
            };
            (0..=rest.len())
                .filter(|i| rest.is_char_boundary(*i))
                .any(|i| rest.get(i..).is_some_and(|r| glob(tail, r)))
        }
    }
}

/// One provider of a `CredentialProviderConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Provider {
    pub name: String,
    #[serde(default)]
    pub match_images: Vec<String>,
    #[serde(default)]
    pub default_cache_duration: Option<String>,
    pub api_version: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: Vec<EnvVar>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct EnvVar {
    pub name: String,
    pub value: String,
}

#[derive(Deserialize)]
struct ProviderConfig {
    kind: String,
    #[serde(default)]
    providers: Vec<Provider>,
}

/// The API version plugins speak.
pub const PROVIDER_API: &str = "credentialprovider.kubelet.k8s.io/v1";

/// Parse a `CredentialProviderConfig` (YAML or JSON, as the kubelet reads it).
pub fn parse_provider_config(text: &str) -> Result<Vec<Provider>, String> {
    let cfg: ProviderConfig = serde_yaml::from_str(text).map_err(|e| {
        format!(
            "not a CredentialProviderConfig: {}",
            crate::text::clip(&e.to_string(), 256)
        )
    })?;
    if cfg.kind != "CredentialProviderConfig" {
        return Err(format!(
            "kind {:?}, not CredentialProviderConfig",
            crate::text::clip(&cfg.kind, 64)
        ));
    }
    for p in &cfg.providers {
        if p.name.is_empty() || p.name.contains('/') || p.name == ".." || p.name == "." {
            return Err(format!(
                "provider name {:?} is not a file name",
                crate::text::clip(&p.name, 64)
            ));
        }
        if p.api_version != PROVIDER_API {
            return Err(format!(
                "provider {}: apiVersion {:?}; shim-agent speaks {PROVIDER_API}",
                p.name,
                crate::text::clip(&p.api_version, 64)
            ));
        }
    }
    Ok(cfg.providers)
}

/// The first provider whose `matchImages` matches `image`, as the kubelet picks.
pub fn provider_for<'a>(providers: &'a [Provider], image: &str) -> Option<&'a Provider> {
    providers
        .iter()
        .find(|p| p.match_images.iter().any(|m| image_matches(m, image)))
}

/// The request a plugin reads on its standard input.
pub fn provider_request(image: &str) -> String {
    serde_json::json!({
        "apiVersion": PROVIDER_API,
        "kind": "CredentialProviderRequest",
        "image": image,
    })
    .to_string()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProviderResponse {
    kind: String,
    #[serde(default)]
    cache_key_type: String,
    #[serde(default)]
    cache_duration: Option<String>,
    #[serde(default)]
    auth: std::collections::BTreeMap<String, ProviderAuth>,
}

#[derive(Deserialize)]
struct ProviderAuth {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
}

/// What a plugin answered for an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The credentials for the image (its best-matching auth key), if any.
    pub secret: Option<Secret>,
    /// `Image`, `Registry` or `Global`: what the answer may be reused for.
    pub cache_key_type: String,
    /// How long it may be reused (zero: not at all).
    pub cache_for: Duration,
}

/// A plugin's answer for `image` (never echoing what it said: it holds secrets).
pub fn parse_provider_response(
    stdout: &[u8],
    image: &str,
    default_cache: Option<&str>,
) -> Result<Answer, String> {
    let r: ProviderResponse = serde_json::from_slice(stdout).map_err(|e| {
        format!(
            "its answer is not a CredentialProviderResponse (line {}, column {})",
            e.line(),
            e.column()
        )
    })?;
    if r.kind != "CredentialProviderResponse" {
        return Err("its answer is not a CredentialProviderResponse".into());
    }
    let secret = r
        .auth
        .iter()
        .filter(|(k, _)| image_matches(k, image))
        .max_by_key(|(k, _)| k.len())
        .map(|(_, a)| Secret {
            username: a.username.clone(),
            password: a.password.clone(),
        });
    let cache_for = r
        .cache_duration
        .as_deref()
        .or(default_cache)
        .map(parse_go_duration)
        .transpose()?
        .unwrap_or_default();
    Ok(Answer {
        secret,
        cache_key_type: r.cache_key_type,
        cache_for,
    })
}

/// A Go duration (`1h0m0s`, `90s`, `12h`, `500ms`).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{:?} is not a duration", crate::text::clip(text, 64));
    let mut total = 0f64;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let (num, tail) = rest.split_at_checked(n).ok_or_else(bad)?;
        let value: f64 = num.parse().map_err(|_| bad())?;
        let u = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at_checked(u).ok_or_else(bad)?;
        let secs = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += value * secs;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
#[path = "credentials_tests.rs"]
mod tests;
