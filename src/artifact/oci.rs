//! The `oci` strategy: the shim archive is the layer of an OCI artifact or image, pulled
//! with `oci-client` (anonymous, following the registry's anonymous token flow, or with a
//! bearer token).
//!
//! The reference must be pinned by digest: oci-client checks the manifest against it, the
//! manifest names the layer's digest, and the layer is verified while streaming like any
//! other download. The store remembers which layer a pinned reference resolved to
//! (`refs/<manifest-digest>-<os>-<arch>`), so a second fetch needs no network.

use futures_util::StreamExt;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::manifest::{ImageIndexEntry, OciDescriptor, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::pipeline::{Download, PipelineCtx, verify_and_unpack};
use super::registry_hosts::{self, Endpoint};
use super::source::{OciAuth, OciSource, parse_sha256};
use super::{ArtifactError, Fetcher, Store, StoredArtifact};
use crate::text::error_chain;

/// The annotation that carries a layer's file name (ORAS sets it).
const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// The layer's file name from its title annotation, when it is a plain file name.
fn layer_title(layer: &OciDescriptor) -> String {
    layer
        .annotations
        .as_ref()
        .and_then(|a| a.get(TITLE_ANNOTATION))
        .filter(|t| !t.contains('/') && !t.is_empty() && t.as_str() != "..")
        .cloned()
        .unwrap_or_else(|| "artifact".to_string())
}

impl Fetcher {
    /// Pull the shim layer of an OCI artifact into the store.
    pub async fn fetch_oci_into_store(
        &self,
        src: &OciSource,
        store: &Store,
    ) -> Result<StoredArtifact, ArtifactError> {
        let reference: Reference = src.reference.parse().map_err(|e: oci_client::ParseError| {
            ArtifactError::InvalidSpec {
                detail: format!("bad OCI reference {:?}: {e}", src.reference),
            }
        })?;
        let shown = reference.whole();
        let pinned = reference.digest().map(parse_sha256).transpose()?;
        if pinned.is_none() && !self.allow_unverified {
            return Err(ArtifactError::MissingDigest { location: shown });
        }
        let ref_key = pinned
            .as_ref()
            .map(|d| format!("{d}-{}-{}", self.platform.os, self.platform.arch));
        if let Some(found) = ref_key.as_deref().and_then(|k| self.lookup_ref(store, k)) {
            return Ok(found);
        }

        let endpoints = self.endpoints(&reference, src.insecure_http)?;
        let (manifest, served) = self
            .pull_manifest(&endpoints, &reference, &src.auth)
            .await?;
        let (client, reference, insecure_host) = served;
        let layer = pick_layer(&manifest, src.layer.as_deref(), &shown)?;
        let layer_digest = parse_sha256(&layer.digest)?;
        if let Some(found) = store.get(&layer_digest) {
            self.remember_ref(store, ref_key.as_deref(), &layer_digest);
            return Ok(StoredArtifact {
                insecure_host,
                ..found
            });
        }
        let bare_name = layer_title(&layer);
        let staging = store.staging()?;
        let ctx = PipelineCtx {
            location: &shown,
            bare_name: &bare_name,
            expected: Some(&layer_digest),
            limits: &self.limits,
            progress: self.progress,
        };
        let digest = self
            .pull_layer(&client, &reference, &layer, &staging, &ctx)
            .await?;
        let stored = store.commit(staging, &digest)?;
        self.remember_ref(store, ref_key.as_deref(), &digest);
        tracing::info!(reference = %shown, %digest, "OCI artifact verified and stored");
        Ok(StoredArtifact {
            insecure_host,
            ..stored
        })
    }

    /// The manifest a pinned reference names (oci-client checks it against the digest), from
    /// the first of `endpoints` that serves it (mirrors, then the upstream; every attempt
    /// walks them all); with the client and the reference that got it, and the host when its
    /// certificate was not verified (`skip_verify`).
    async fn pull_manifest(
        &self,
        endpoints: &[Endpoint],
        reference: &Reference,
        auth: &OciAuth,
    ) -> Result<(OciImageManifest, Served), ArtifactError> {
        let shown = reference.whole();
        let auth = registry_auth(auth);
        self.with_retries(&shown, |_| {
            let (auth, shown) = (&auth, &shown);
            async move {
                let mut failed: Vec<(String, ArtifactError)> = vec![];
                for ep in endpoints {
                    let got = self.try_endpoint(ep, reference, auth, shown).await;
                    match got {
                        Ok((m, client, at)) => {
                            if ep.mirror || ep.skip_verify {
                                tracing::info!(reference = %shown, host = %ep.shown, insecure = ep.skip_verify, "OCI manifest from a registry host of containerd's config");
                            }
                            let insecure = ep.skip_verify.then(|| ep.shown.clone());
                            return Ok((m, (client, at, insecure)));
                        }
                        Err(e) => failed.push((ep.shown.clone(), e)),
                    }
                }
                Err(all_failed(shown, failed))
            }
        })
        .await
    }

    /// The manifest from one host, with the credentials the node has for it (unless the
    /// agent's config gives a token): the client and the reference that got it.
    async fn try_endpoint(
        &self,
        ep: &Endpoint,
        reference: &Reference,
        auth: &RegistryAuth,
        shown: &str,
    ) -> Result<(OciImageManifest, Client, Reference), ArtifactError> {
        let c = self.connect(ep, reference, auth, shown).await?;
        let (m, _) = c
            .client
            .pull_image_manifest(&c.at, &c.auth)
            .await
            .map_err(|e| c.refused(shown, e))?;
        Ok((m, c.client, c.at))
    }

    /// A client for one host, authenticated for pulls from `reference`'s repository there:
    /// with the node's credentials for that host unless `auth` is given.
    pub(super) async fn connect(
        &self,
        ep: &Endpoint,
        reference: &Reference,
        auth: &RegistryAuth,
        shown: &str,
    ) -> Result<Connected, ArtifactError> {
        let at = at_endpoint(reference, ep);
        let (auth, from) = match auth {
            RegistryAuth::Anonymous => self.node_auth(ep, at.repository()).await?,
            given => (given.clone(), None),
        };
        let c = Connected {
            client: self.oci_client(ep)?,
            at,
            auth,
            from,
            host: ep.shown.clone(),
        };
        c.client
            .auth(&c.at, &c.auth, oci_client::RegistryOperation::Pull)
            .await
            .map_err(|e| c.refused(shown, e))?;
        Ok(c)
    }

    /// The hosts to ask for `reference`: containerd's mirrors for its registry, then the
    /// registry itself.
    pub(super) fn endpoints(
        &self,
        reference: &Reference,
        insecure_http: bool,
    ) -> Result<Vec<Endpoint>, ArtifactError> {
        let hosts = registry_hosts::load(&self.registry_hosts, reference.registry())
            .map_err(|detail| ArtifactError::RegistryHosts { detail })?;
        Ok(registry_hosts::endpoints(
            reference.resolve_registry(),
            hosts.as_ref(),
            insecure_http,
        ))
    }

    /// The node's credentials for a host (`host[:port]/repository`): its credential
    /// provider's, else its Docker `config.json`'s, else none; with where they came from.
    async fn node_auth(
        &self,
        ep: &Endpoint,
        repository: &str,
    ) -> Result<(RegistryAuth, Option<String>), ArtifactError> {
        let failed = |detail: String| ArtifactError::Credentials {
            registry: ep.shown.clone(),
            detail,
        };
        let image = format!("{}/{repository}", ep.registry);
        if let Some(setup) = &self.providers
            && let Some(s) = super::credential_exec::credentials_for(setup, &image)
                .await
                .map_err(failed)?
        {
            let from = format!("the credential providers of {}", setup.config.display());
            return Ok((RegistryAuth::Basic(s.username, s.password), Some(from)));
        }
        if let Some(path) = &self.docker_config {
            let text = std::fs::read_to_string(path)
                .map_err(|e| failed(format!("{}: {e}", path.display())))?;
            if let Some(s) = super::credentials::from_docker_config(&text, &ep.registry)
                .map_err(|e| failed(format!("{}: {e}", path.display())))?
            {
                return Ok((
                    RegistryAuth::Basic(s.username, s.password),
                    Some(path.display().to_string()),
                ));
            }
        }
        Ok((RegistryAuth::Anonymous, None))
    }

    /// The layer, streamed through the verify-and-unpack pipeline into `staging` (retried
    /// from the start); its digest.
    async fn pull_layer(
        &self,
        client: &Client,
        reference: &Reference,
        layer: &OciDescriptor,
        staging: &super::store::Staging,
        ctx: &PipelineCtx<'_>,
    ) -> Result<String, ArtifactError> {
        self.with_retries(ctx.location, |attempt| async move {
            if attempt > 1 {
                staging.reset()?;
            }
            let sized = client
                .pull_blob_stream(reference, layer)
                .await
                .map_err(|e| map_oci(ctx.location, e))?;
            let shown = ctx.location.to_string();
            let stream = sized.stream.map(move |r| {
                r.map_err(|e| ArtifactError::Transfer {
                    url: shown.clone(),
                    attempts: 1,
                    detail: error_chain(&e),
                })
            });
            let download = Download {
                stream: Box::pin(stream),
                len: sized.content_length,
            };
            verify_and_unpack(download, staging.path(), ctx).await
        })
        .await
    }

    /// A client for one registry host: its protocol, the agent's CA roots and the host's,
    /// `skip_verify`. oci-client builds a default reqwest client inside every client it makes
    /// (`..Default::default()`), and that panics on a node without a system CA bundle (a
    /// minimal image): such a node gets [`ArtifactError::NoCaCertificates`] before that.
    fn oci_client(&self, ep: &Endpoint) -> Result<Client, ArtifactError> {
        if let Err(e) = reqwest::Client::builder().build() {
            tracing::debug!(error = %error_chain(&e), "no system CA roots: no OCI client");
            return Err(ArtifactError::NoCaCertificatesForOci {
                url: ep.shown.clone(),
            });
        }
        Client::try_from(self.oci_config(ep)?).map_err(|e| ArtifactError::HttpClient {
            detail: format!("{}: {}", ep.shown, error_chain(&e)),
        })
    }

    fn oci_config(&self, ep: &Endpoint) -> Result<ClientConfig, ArtifactError> {
        let platform = self.platform.clone();
        let mut roots: Vec<Vec<u8>> = self.ca_pem.iter().map(|p| p.to_vec()).collect();
        for ca in &ep.ca {
            roots.push(std::fs::read(ca).map_err(|e| ArtifactError::RegistryHosts {
                detail: format!("{}: CA file {}: {e}", ep.shown, ca.display()),
            })?);
        }
        let config = ClientConfig {
            protocol: if ep.http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            accept_invalid_certificates: ep.skip_verify,
            connect_timeout: Some(self.limits.connect_timeout),
            read_timeout: Some(self.limits.read_timeout),
            platform_resolver: Some(Box::new(move |entries: &[ImageIndexEntry]| {
                entries
                    .iter()
                    .find(|e| {
                        e.platform.as_ref().is_some_and(|p| {
                            p.os.to_string() == platform.os
                                && p.architecture.to_string() == platform.arch
                        })
                    })
                    .map(|e| e.digest.clone())
            })),
            extra_root_certificates: roots
                .into_iter()
                .map(|data| oci_client::client::Certificate {
                    encoding: oci_client::client::CertificateEncoding::Pem,
                    data,
                })
                .collect(),
            ..ClientConfig::default()
        };
        Ok(config)
    }

    fn lookup_ref(&self, store: &Store, key: &str) -> Option<StoredArtifact> {
        let text = std::fs::read_to_string(store.refs_dir().join(key)).ok()?;
        store.get(text.trim())
    }

    /// Best effort: a lost index entry only costs a manifest request next time.
    fn remember_ref(&self, store: &Store, key: Option<&str>, layer_digest: &str) {
        if let Some(key) = key {
            let path = store.refs_dir().join(key);
            if let Err(e) = crate::fsutil::write_atomic(&path, layer_digest.as_bytes(), None) {
                tracing::warn!(path = %path.display(), "cannot record OCI reference: {e}");
            }
        }
    }
}

/// The shim layer: the only one, or the one named by `wanted`.
fn pick_layer(
    manifest: &OciImageManifest,
    wanted: Option<&str>,
    shown: &str,
) -> Result<OciDescriptor, ArtifactError> {
    let listed = || {
        manifest
            .layers
            .iter()
            .map(|l| format!("{} ({})", l.digest, l.media_type))
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(w) = wanted {
        let w = parse_sha256(w)?;
        return manifest
            .layers
            .iter()
            .find(|l| parse_sha256(&l.digest).is_ok_and(|d| d == w))
            .cloned()
            .ok_or_else(|| ArtifactError::InvalidSpec {
                detail: format!(
                    "{shown} has no layer sha256:{w}; its layers: [{}]",
                    listed()
                ),
            });
    }
    match manifest.layers.as_slice() {
        [one] => Ok(one.clone()),
        _ => Err(ArtifactError::InvalidSpec {
            detail: format!(
                "{shown} has {} layers, not one: [{}]; name the shim's layer in the spec",
                manifest.layers.len(),
                listed()
            ),
        }),
    }
}

/// The agent's credentials for a registry, as oci-client takes them.
pub(super) fn registry_auth(auth: &OciAuth) -> RegistryAuth {
    match auth {
        OciAuth::Anonymous => RegistryAuth::Anonymous,
        OciAuth::Bearer(t) => RegistryAuth::Bearer(t.clone()),
    }
}

/// A client authenticated for pulls from one host, and the reference there.
pub(super) struct Connected {
    pub client: Client,
    /// The reference at this host.
    pub at: Reference,
    pub auth: RegistryAuth,
    /// Where the node's credentials came from, when they were used.
    from: Option<String>,
    /// The host, as shown.
    pub host: String,
}

impl Connected {
    /// An oci-client error from this host: refused credentials said as such, else classified.
    pub(super) fn refused(
        &self,
        shown: &str,
        e: oci_client::errors::OciDistributionError,
    ) -> ArtifactError {
        use oci_client::errors::OciDistributionError as E;
        match (&self.from, &e) {
            (Some(from), E::AuthenticationFailure(_) | E::UnauthorizedError { .. }) => {
                ArtifactError::CredentialsRefused {
                    registry: self.host.clone(),
                    from: from.clone(),
                    detail: crate::text::clip(&error_chain(&e), 512),
                }
            }
            _ => map_oci(shown, e),
        }
    }
}

/// `reference` at another registry host (a mirror, or `server`): same repository and pin.
fn at_endpoint(reference: &Reference, ep: &Endpoint) -> Reference {
    let repo = reference.repository().to_string();
    match (reference.digest(), reference.tag()) {
        (Some(d), _) => Reference::with_digest(ep.registry.clone(), repo, d.to_string()),
        (None, Some(t)) => Reference::with_tag(ep.registry.clone(), repo, t.to_string()),
        (None, None) => Reference::with_tag(ep.registry.clone(), repo, "latest".into()),
    }
}

/// Every host failed: one error naming each host and what it said; transient when any
/// failure was.
pub(super) fn all_failed(shown: &str, mut failed: Vec<(String, ArtifactError)>) -> ArtifactError {
    if failed.len() == 1
        && let Some((_, e)) = failed.pop()
    {
        return e;
    }
    let transient = failed.iter().any(|(_, e)| e.is_transient());
    let detail = failed
        .iter()
        .map(|(host, e)| match e {
            ArtifactError::Oci { detail, .. } => format!("{host}: {detail}"),
            other => {
                let said = other.to_string();
                if said.starts_with(host.as_str()) {
                    said
                } else {
                    format!("{host}: {said}")
                }
            }
        })
        .collect::<Vec<_>>()
        .join("; ");
    ArtifactError::Oci {
        reference: shown.to_string(),
        attempts: 1,
        detail,
        transient,
    }
}

/// Classify an oci-client error: server errors and network trouble are transient.
pub(super) fn map_oci(shown: &str, e: oci_client::errors::OciDistributionError) -> ArtifactError {
    use oci_client::errors::OciDistributionError as E;
    if let E::RequestError(r) = &e
        && let Some(url) = r.url()
        && let Some(refused) = super::proxy::refused_connect(url.as_str(), shown, r)
    {
        return refused;
    }
    let transient = match &e {
        E::ServerError { code, .. } => super::error::is_transient_status(*code),
        E::RequestError(r) => r.is_timeout() || r.is_connect() || r.is_body(),
        E::IoError(_) => true,
        _ => false,
    };
    ArtifactError::Oci {
        reference: shown.to_string(),
        attempts: 1,
        detail: error_chain(&e),
        transient,
    }
}

/// The client and reference that got a manifest, and the host when it served it without its
/// certificate being verified.
type Served = (Client, Reference, Option<String>);
