//! Fetching: the [`Fetcher`] (built in `fetcher.rs`) gets an artifact into the [`Store`] once
//! per node, over `http(s)://` and `file://` here, or from an OCI registry (`oci.rs`), within
//! its limits and timeouts, with retries.
//!
//! Retries: timeouts, connection failures (refused included: at boot the node's network
//! or an in-cluster mirror may come up after the agent), broken transfers and HTTP
//! 408/429/5xx are retried with exponential backoff and jitter, up to
//! [`RetryPolicy::max_attempts`]. A 4xx, a digest mismatch or a bad archive is final.

use futures_util::StreamExt;

use super::fetcher::{Fetcher, HttpClient};
use super::pipeline::{Download, PipelineCtx, verify_and_unpack};
use super::source::{ArtifactSource, FetchSpec, ResolvedSource, parse_sha256};
use super::{ArtifactError, Store, StoredArtifact, error};
use crate::text::error_chain;

impl Fetcher {
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

    /// A small file at `url` (signature material beside an artifact), whole, up to `cap`
    /// bytes; one attempt, through the same client, proxies and credentials as artifacts.
    pub(crate) async fn fetch_small(
        &self,
        url: &str,
        cap: usize,
    ) -> Result<Vec<u8>, ArtifactError> {
        let shown = display_location(url);
        let location = Location::parse(url)?;
        let mut download = self.open(&location, &shown).await?;
        let mut out = Vec::new();
        while let Some(chunk) = download.stream.next().await {
            out.extend_from_slice(&chunk?);
            if out.len() > cap {
                return Err(ArtifactError::DownloadTooLarge {
                    location: shown,
                    limit: u64::try_from(cap).unwrap_or(u64::MAX),
                });
            }
        }
        Ok(out)
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
                let resp = self
                    .with_http_credential(http.client.get(url), url)?
                    .send()
                    .await
                    .map_err(|e| map_reqwest(shown, &e))?;
                let status = resp.status().as_u16();
                if !resp.status().is_success() {
                    if let Some(refused) = super::proxy::refused_status(url, shown, status) {
                        return Err(refused);
                    }
                    return Err(ArtifactError::HttpStatus {
                        url: shown.to_string(),
                        status,
                        attempts: 1,
                        hint: error::status_hint(status, proxy_in_environment()),
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
    if let Some(refused) = super::proxy::refused_connect(url, url, e) {
        return refused;
    }
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

impl Fetcher {
    /// `req` with the node's credential for `url`'s host, if `fetch.http-credentials-file`
    /// has one (reqwest drops it on a redirect to another host).
    fn with_http_credential(
        &self,
        req: reqwest::RequestBuilder,
        url: &str,
    ) -> Result<reqwest::RequestBuilder, ArtifactError> {
        let Some(path) = &self.http_credentials else {
            return Ok(req);
        };
        let host = reqwest::Url::parse(url)
            .ok()
            .and_then(|u| {
                let h = u.host_str()?.to_string();
                Some(match u.port() {
                    Some(p) => format!("{h}:{p}"),
                    None => h,
                })
            })
            .unwrap_or_default();
        let failed = |detail: String| ArtifactError::Credentials {
            registry: host.clone(),
            detail: format!("{}: {detail}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        Ok(
            match super::credentials::http_credential(&text, &host).map_err(failed)? {
                Some(super::credentials::HttpCredential::Basic(s)) => {
                    req.basic_auth(s.username, Some(s.password))
                }
                Some(super::credentials::HttpCredential::Bearer(t)) => req.bearer_auth(t),
                None => req,
            },
        )
    }
}

/// Whether the environment names a proxy for reqwest to use (it reads these variables).
fn proxy_in_environment() -> bool {
    ["HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"].iter().any(|k| {
        [k.to_string(), k.to_lowercase()]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
