//! The [`Fetcher`] and what it is built with: the size caps and timeouts of a download
//! ([`Limits`]), how transient failures are retried ([`RetryPolicy`]), the platform and the
//! containerd builds are chosen for, and the trust it extends. Fetching itself: `fetch.rs`
//! (`http(s)://`, `file://`) and `oci.rs` (registries).

use std::future::Future;
use std::time::Duration;

use super::source::Platform;
use super::{ArtifactError, ContainerdVersion, node_platform};

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
    /// containerd's registry hosts directories (local paths), for `oci` mirrors.
    pub(crate) registry_hosts: Vec<std::path::PathBuf>,
    /// Where the node's registry credentials are: a Docker `config.json`, the kubelet's
    /// credential providers.
    pub(crate) docker_config: Option<std::path::PathBuf>,
    pub(crate) providers: Option<super::credential_exec::ProviderSetup>,
    /// Per-host credentials for `anonymousHttp` artifact servers.
    pub(crate) http_credentials: Option<std::path::PathBuf>,
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
            registry_hosts: Vec::new(),
            docker_config: None,
            providers: None,
            http_credentials: None,
        })
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

    /// Pull `oci` artifacts through containerd's registry hosts in these directories (local
    /// paths: its `config_path`), read at each fetch.
    pub fn with_registry_hosts(mut self, dirs: Vec<std::path::PathBuf>) -> Self {
        self.registry_hosts = dirs;
        self
    }

    /// Take registry credentials from the node: the kubelet's credential providers (first),
    /// then a Docker `config.json`.
    pub fn with_node_credentials(
        mut self,
        providers: Option<super::credential_exec::ProviderSetup>,
        docker_config: Option<std::path::PathBuf>,
    ) -> Self {
        self.providers = providers;
        self.docker_config = docker_config;
        self
    }

    /// Send the per-host credentials of this file (`fetch.http-credentials-file`) to
    /// `anonymousHttp` artifact servers; read at each download.
    pub fn with_http_credentials(mut self, file: Option<std::path::PathBuf>) -> Self {
        self.http_credentials = file;
        self
    }

    /// The containerd version builds are chosen for.
    pub fn containerd(&self) -> Option<&ContainerdVersion> {
        self.containerd.as_ref()
    }
}

/// rustls needs a process-wide crypto provider; we use ring (no C toolchain surprises).
fn install_crypto_provider() {
    // Err means one is already installed: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The HTTP client, and whether it has any CA root to verify https servers with.
#[derive(Debug)]
pub(crate) struct HttpClient {
    pub(super) client: reqwest::Client,
    pub(super) has_roots: bool,
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
}
