//! [`Fetcher`]: gets an artifact into the [`Store`] once per node, over `http(s)://`,
//! `file://` or an OCI registry (see `oci.rs`), with limits, timeouts and retries.
//!
//! Retries: timeouts, connection failures (refused included: at boot the node's network
//! or an in-cluster mirror may come up after the agent), broken transfers and HTTP
//! 408/429/5xx are retried with exponential backoff and jitter, up to
//! [`RetryPolicy::max_attempts`]. A 4xx, a digest mismatch or a bad archive is final.

use std::future::Future;
use std::time::Duration;

use futures_util::StreamExt;

use super::pipeline::{Download, PipelineCtx, verify_and_unpack};
use super::source::{ArtifactSource, FetchSpec, Platform, ResolvedSource, parse_sha256};
use super::{ArtifactError, ContainerdVersion, Store, StoredArtifact, error, node_platform};
use crate::text::error_chain;

/// Size caps and timeouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes downloaded for one artifact.
    pub max_download_bytes: u64,
    /// Most bytes written when unpacking one artifact.
    pub max_unpacked_bytes: u64,
    /// Most bytes in one unpacked file.
    pub max_file_bytes: u64,
    /// Most entries in one archive.
    pub max_entries: u64,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Longest wait for the next bytes of a response.
    pub read_timeout: Duration,
    /// Longest time for one attempt as a whole (slow-drip servers).
    pub attempt_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_download_bytes: 512 << 20,
            max_unpacked_bytes: 1 << 30,
            max_file_bytes: 512 << 20,
            max_entries: 10_000,
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            attempt_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// How transient failures are retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1 = no retry).
    pub max_attempts: u32,
    /// Delay before the first retry; doubled each time.
    pub initial_backoff: Duration,
    /// Cap on the delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// Delay after failed attempt number `attempt` (1-based): exponential, capped, with
    /// "equal jitter" (between half and all of it) so that many nodes do not retry in step.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let exp = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(20));
        let base = exp.min(self.max_backoff);
        base.mul_f64(0.5 + 0.5 * jitter())
    }
}

/// A cheap pseudo-random number in [0, 1): the clock's nanoseconds, mixed.
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ (u64::from(std::process::id()) << 32) ^ 0x9e37_79b9_7f4a_7c15;
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Fetches artifacts into a [`Store`].
#[derive(Debug, Clone)]
pub struct Fetcher {
    /// Built on the first http(s) download, not before: a node without CA certificates can
    /// still fetch `file://` artifacts (building the client loads the system's roots).
    pub(crate) http: std::sync::Arc<std::sync::OnceLock<HttpClient>>,
    /// Extra CA roots (PEM) trusted beside the system's (`fetch.ca-file`).
    pub(crate) ca_pem: Option<std::sync::Arc<Vec<u8>>>,
    pub(crate) limits: Limits,
    pub(crate) retry: RetryPolicy,
    pub(crate) progress: bool,
    pub(crate) allow_unverified: bool,
    pub(crate) platform: Platform,
    /// The node's containerd, for `platforms` entries with a `containerd` range.
    pub(crate) containerd: Option<ContainerdVersion>,
}

impl Fetcher {
    /// A fetcher for this node's platform, verified artifacts only, no progress bar.
    pub fn new(limits: Limits, retry: RetryPolicy) -> Result<Self, ArtifactError> {
        // the OCI client builds its own reqwest client: rustls needs its provider first
        install_crypto_provider();
        Ok(Fetcher {
            http: Default::default(),
            ca_pem: None,
            limits,
            retry,
            progress: false,
            allow_unverified: false,
            platform: node_platform(),
            containerd: None,
        })
    }

    /// The HTTP client, built on first use: the system's CA roots plus `fetch.ca-file`'s.
    /// Without any root (a minimal node with no CA bundle and no `ca-file`) the client is
    /// built without roots, so `http://` still works and `https://` fails with
    /// [`ArtifactError::NoCaCertificates`].
    fn http(&self) -> Result<&HttpClient, ArtifactError> {
        if let Some(c) = self.http.get() {
            return Ok(c);
        }
        let extra = match &self.ca_pem {
            Some(pem) => match reqwest::Certificate::from_pem_bundle(pem) {
                Ok(certs) if !certs.is_empty() => certs,
                Ok(_) => {
                    return Err(ArtifactError::HttpClient {
                        detail: "fetch.ca-file holds no PEM certificate".into(),
                    });
                }
                Err(e) => {
                    return Err(ArtifactError::HttpClient {
                        detail: format!(
                            "fetch.ca-file holds no usable PEM certificate: {}",
                            error_chain(&e)
                        ),
                    });
                }
            },
            None => Vec::new(),
        };
        let builder = || {
            reqwest::Client::builder()
                .connect_timeout(self.limits.connect_timeout)
                .read_timeout(self.limits.read_timeout)
                .user_agent(concat!("shim-agent/", env!("CARGO_PKG_VERSION")))
        };
        let client = match builder().tls_certs_merge(extra.clone()).build() {
            Ok(client) => HttpClient {
                client,
                has_roots: true,
            },
            // rustls-platform-verifier refuses to start with no root at all
            Err(e) if extra.is_empty() => {
                tracing::debug!(error = %error_chain(&e), "no CA roots: https:// locations will fail");
                HttpClient {
                    client: builder().tls_certs_only([]).build().map_err(|e| {
                        ArtifactError::HttpClient {
                            detail: error_chain(&e),
                        }
                    })?,
                    has_roots: false,
                }
            }
            Err(e) => {
                return Err(ArtifactError::HttpClient {
                    detail: error_chain(&e),
                });
            }
        };
        Ok(self.http.get_or_init(|| client))
    }

    /// Trust the CA certificates of this PEM bundle beside the system's (https artifacts
    /// and OCI registries).
    pub fn with_ca_pem(mut self, pem: Vec<u8>) -> Self {
        self.ca_pem = Some(std::sync::Arc::new(pem));
        self
    }

    /// Draw a progress bar on stderr (only when it is a terminal).
    pub fn with_progress(mut self, on: bool) -> Self {
        self.progress = on;
        self
    }

    /// Accept artifacts without a sha256 (the agent's config must say so explicitly).
    pub fn allow_unverified(mut self, on: bool) -> Self {
        self.allow_unverified = on;
        self
    }

    /// Fetch for another platform than this node's (offline image builds, tests).
    pub fn for_platform(mut self, platform: Platform) -> Self {
        self.platform = platform;
        self
    }

    /// The platform artifacts are chosen and checked for.
    pub fn platform(&self) -> &Platform {
        &self.platform
    }

    /// Choose builds for this containerd version (`platforms` entries with a `containerd`
    /// range); `None`, the default: unknown, and only entries without a range fit.
    pub fn for_containerd(mut self, version: Option<ContainerdVersion>) -> Self {
        self.containerd = version;
        self
    }

    /// The containerd version builds are chosen for.
    pub fn containerd(&self) -> Option<&ContainerdVersion> {
        self.containerd.as_ref()
    }

    /// Resolve `spec` for this node's platform and containerd, and fetch it.
    pub async fn fetch(
        &self,
        spec: &FetchSpec,
        store: &Store,
    ) -> Result<StoredArtifact, ArtifactError> {
        match spec.resolve(&self.platform, self.containerd.as_ref())? {
            ResolvedSource::Http(src) => self.fetch_into_store(&src, store).await,
            ResolvedSource::Oci(src) => self.fetch_oci_into_store(&src, store).await,
        }
    }

    /// Fetch an `http(s)://` or `file://` artifact, verify and unpack it into the store.
    /// An artifact already in the store is returned without using the network.
    pub async fn fetch_into_store(
        &self,
        src: &ArtifactSource,
        store: &Store,
    ) -> Result<StoredArtifact, ArtifactError> {
        let shown = display_location(&src.location);
        let expected = match &src.sha256 {
            Some(d) => Some(parse_sha256(d)?),
            None if self.allow_unverified => None,
            None => return Err(ArtifactError::MissingDigest { location: shown }),
        };
        if let Some(found) = expected.as_deref().and_then(|d| store.get(d)) {
            tracing::debug!(digest = %found.digest, "artifact already in the store");
            return Ok(found);
        }
        let location = Location::parse(&src.location)?;
        let bare_name = bare_name(&src.location);
        let staging = store.staging()?;
        let ctx = PipelineCtx {
            location: &shown,
            bare_name: &bare_name,
            expected: expected.as_deref(),
            limits: &self.limits,
            progress: self.progress,
        };
        let digest = self
            .with_retries(&shown, |attempt| {
                let (location, staging, ctx) = (&location, &staging, &ctx);
                async move {
                    if attempt > 1 {
                        staging.reset()?;
                    }
                    let download = self.open(location, ctx.location).await?;
                    verify_and_unpack(download, staging.path(), ctx).await
                }
            })
            .await?;
        tracing::info!(location = %shown, %digest, "artifact verified and stored");
        store.commit(staging, &digest)
    }

    /// Run `op` until it succeeds, fails for good, or the attempts are used up.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        what: &str,
        mut op: F,
    ) -> Result<T, ArtifactError>
    where
        F: FnMut(u32) -> Fut,
        Fut: Future<Output = Result<T, ArtifactError>>,
    {
        let mut attempt = 1;
        loop {
            let result = match tokio::time::timeout(self.limits.attempt_timeout, op(attempt)).await
            {
                Ok(r) => r,
                Err(_) => Err(ArtifactError::Timeout {
                    url: what.to_string(),
                    attempts: attempt,
                    detail: format!(
                        "the attempt took longer than {:?}",
                        self.limits.attempt_timeout
                    ),
                }),
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) if e.is_transient() && attempt < self.retry.max_attempts => {
                    let delay = self.retry.backoff(attempt);
                    tracing::warn!(
                        location = what,
                        attempt,
                        ?delay,
                        reason = e.reason(),
                        "fetch failed, retrying: {e}"
                    );
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e.with_attempts(attempt)),
            }
        }
    }

    async fn open(&self, location: &Location, shown: &str) -> Result<Download, ArtifactError> {
        match location {
            Location::Http(url) => {
                let http = self.http()?;
                if !http.has_roots
                    && url
                        .get(..8)
                        .is_some_and(|p| p.eq_ignore_ascii_case("https://"))
                {
                    return Err(ArtifactError::NoCaCertificates {
                        url: shown.to_string(),
                    });
                }
                let resp = http
                    .client
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| map_reqwest(shown, &e))?;
                let status = resp.status().as_u16();
                if !resp.status().is_success() {
                    return Err(ArtifactError::HttpStatus {
                        url: shown.to_string(),
                        status,
                        attempts: 1,
                        hint: error::status_hint(status),
                    });
                }
                let len = resp.content_length();
                let shown = shown.to_string();
                let stream = resp
                    .bytes_stream()
                    .map(move |r| r.map_err(|e| map_reqwest(&shown, &e)));
                Ok(Download {
                    stream: Box::pin(stream),
                    len,
                })
            }
            Location::File(path) => {
                let file =
                    std::fs::File::open(path).map_err(|source| ArtifactError::LocalFile {
                        path: path.into(),
                        source,
                    })?;
                let len = file.metadata().ok().map(|m| m.len());
                Ok(Download {
                    stream: Box::pin(read_on_own_thread(file, path.clone())),
                    len,
                })
            }
        }
    }
}

/// The bytes of a local file, read on a thread of its own, not on tokio's blocking pool: the
/// unpackers hold threads of that pool while they wait for these bytes, so with as many
/// artifacts at once as the pool has threads, every read would wait for a thread that never
/// comes free.
fn read_on_own_thread(
    mut file: std::fs::File,
    path: String,
) -> impl futures_util::Stream<Item = Result<bytes::Bytes, ArtifactError>> {
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<bytes::Bytes>>(4);
    let reader = move || {
        loop {
            let mut buf = vec![0u8; 256 * 1024];
            let item = match std::io::Read::read(&mut file, &mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    buf.truncate(n);
                    Ok(bytes::Bytes::from(buf))
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => Err(e),
            };
            let stop = item.is_err();
            if tx.blocking_send(item).is_err() || stop {
                return;
            }
        }
    };
    let spawned = std::thread::Builder::new()
        .name("artifact-file".into())
        .spawn(reader)
        .err();
    let first = futures_util::stream::iter(spawned.map(Err));
    let rest = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    first.chain(rest).map(move |r| {
        r.map_err(|source| ArtifactError::LocalFile {
            path: (&path).into(),
            source,
        })
    })
}

/// rustls needs a process-wide crypto provider; we use ring (no C toolchain surprises).
fn install_crypto_provider() {
    // Err means one is already installed: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A parsed artifact location.
/// The HTTP client, and whether it has any CA root to verify https servers with.
#[derive(Debug)]
pub(crate) struct HttpClient {
    client: reqwest::Client,
    has_roots: bool,
}

enum Location {
    Http(String),
    File(String),
}

impl Location {
    fn parse(location: &str) -> Result<Location, ArtifactError> {
        let lower = location.to_ascii_lowercase();
        if lower.starts_with("http://") || lower.starts_with("https://") {
            Ok(Location::Http(location.to_string()))
        } else if let Some(path) = location.strip_prefix("file://") {
            if path.starts_with('/') {
                Ok(Location::File(path.to_string()))
            } else {
                Err(ArtifactError::UnsupportedScheme {
                    location: location.to_string(),
                })
            }
        } else {
            Err(ArtifactError::UnsupportedScheme {
                location: display_location(location),
            })
        }
    }
}

/// The location for messages and logs: without user info or query (tokens of presigned URLs).
pub(crate) fn display_location(location: &str) -> String {
    let no_query = location.split(['?', '#']).next().unwrap_or(location);
    match no_query.split_once("://") {
        Some((scheme, rest)) => match rest.split_once('/') {
            Some((host, path)) => {
                let host = host.rsplit('@').next().unwrap_or(host);
                format!("{scheme}://{host}/{path}")
            }
            None => format!("{scheme}://{}", rest.rsplit('@').next().unwrap_or(rest)),
        },
        None => no_query.to_string(),
    }
}

/// File name for a download that is a bare binary: the URL's last path segment.
fn bare_name(location: &str) -> String {
    let shown = display_location(location);
    let path = match shown.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map(|(_, p)| p).unwrap_or(""),
        None => shown.as_str(),
    };
    match path.rsplit('/').next() {
        Some(n) if !n.is_empty() && n != "." && n != ".." => n.to_string(),
        _ => "artifact".to_string(),
    }
}

/// Classify a reqwest error.
fn map_reqwest(url: &str, e: &reqwest::Error) -> ArtifactError {
    let detail = error_chain(e);
    let url = url.to_string();
    if e.is_timeout() {
        ArtifactError::Timeout {
            url,
            attempts: 1,
            detail,
        }
    } else if e.is_connect() {
        ArtifactError::Connect {
            url,
            attempts: 1,
            detail,
        }
    } else {
        ArtifactError::Transfer {
            url,
            attempts: 1,
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_is_capped_and_jittered() {
        let p = RetryPolicy {
            max_attempts: 10,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
        };
        let d1 = p.backoff(1);
        assert!(d1 >= Duration::from_millis(50) && d1 <= Duration::from_millis(100));
        let d3 = p.backoff(3);
        assert!(d3 >= Duration::from_millis(200) && d3 <= Duration::from_millis(400));
        let d9 = p.backoff(9);
        assert!(d9 >= Duration::from_millis(500) && d9 <= Duration::from_secs(1));
    }

    #[test]
    fn locations_lose_credentials_and_queries_in_messages() {
        assert_eq!(
            display_location("https://u:p@h.example/a/b.tgz?sig=secret"),
            "https://h.example/a/b.tgz"
        );
        assert_eq!(
            bare_name("https://h/x/containerd-shim-a-v2?x"),
            "containerd-shim-a-v2"
        );
        assert_eq!(bare_name("https://h"), "artifact");
    }

    #[test]
    fn unsupported_schemes_are_refused() {
        for loc in ["ftp://h/x", "s3://b/k", "file://relative/x", "/plain/path"] {
            let e = Location::parse(loc).err().unwrap();
            assert_eq!(e.reason(), "UnsupportedScheme", "{loc}");
        }
    }
}
