//! `signature.from: oci`: the signatures attached to a Shim's `oci` artifact, fetched from its
//! registry through the same hosts (containerd's mirrors, then the registry), credentials,
//! proxies and CAs as the artifact. Looked for, for the pinned manifest digest `sha256:<hex>`:
//! 1. Sigstore bundles as OCI 1.1 referrers (`artifactType`
//!    `application/vnd.dev.sigstore.bundle.v0.3+json`): the referrers API, or, where the
//!    registry has none (404), the referrers tag schema's index at the tag `sha256-<hex>`;
//! 2. cosign's signature manifest at the tag `sha256-<hex>.sig`, each simple signing layer.
//!
//! Fetched only: what is found is parsed by `oci_attached.rs` and judged by `signed.rs`. Each
//! manifest and blob is read up to 256 KiB, and at most 16 of each kind; a reply that cannot
//! be read is kept as [`Attached::Unreadable`], its refusal, not an error of the fetch.

use std::collections::BTreeMap;

use futures_util::StreamExt;
use oci_client::Reference;
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::{IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE};
use sha2::Digest;

use super::oci::{Connected, all_failed, registry_auth};
use super::oci_attached::{
    self, BLOB_CAP, BUNDLE_ARTIFACT_TYPE, Blob, bundle_layer, signature_layers,
};
use super::source::{OciSource, parse_sha256};
use super::{ArtifactError, Fetcher};
use crate::signature::simple_signing;
use crate::text::error_chain;

/// One signature found attached to the artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// A simple signing layer of cosign's signature manifest: its payload and annotations.
    SimpleSigning {
        at: String,
        payload: Vec<u8>,
        annotations: BTreeMap<String, String>,
    },
    /// A Sigstore bundle referring to the manifest.
    Bundle { at: String, bundle: Vec<u8> },
    /// Something attached that cannot be read: why.
    Unreadable { at: String, detail: String },
}

/// What is attached to one artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The artifact's reference, as shown.
    pub reference: String,
    /// Its manifest's digest, `sha256:<hex>`: what its signatures must be over.
    pub digest: String,
    pub attached: Vec<Attached>,
}

impl Fetcher {
    /// The signatures attached to `src`'s manifest, from the first of its hosts that has any
    /// (every host is asked until one does; a host that fails is passed over).
    pub async fn attached_signatures(&self, src: &OciSource) -> Result<Found, ArtifactError> {
        let reference: Reference = src.reference.parse().map_err(|e: oci_client::ParseError| {
            ArtifactError::InvalidSpec {
                detail: format!("bad OCI reference {:?}: {e}", src.reference),
            }
        })?;
        let shown = reference.whole();
        let Some(pinned) = reference.digest() else {
            return Err(ArtifactError::InvalidSpec {
                detail: format!(
                    "{shown}: signature.from: oci needs the reference pinned by digest (@sha256:...): the signature is over that manifest"
                ),
            });
        };
        let digest = format!("sha256:{}", parse_sha256(pinned)?);
        let endpoints = self.endpoints(&reference, src.insecure_http)?;
        let auth = registry_auth(&src.auth);
        let attached = self
            .with_retries(&shown, |_| {
                let (auth, shown, digest) = (&auth, &shown, &digest);
                let (endpoints, reference) = (&endpoints, &reference);
                async move {
                    let (mut failed, mut answered) = (vec![], false);
                    for ep in endpoints {
                        let c = match self.connect(ep, reference, auth, shown).await {
                            Ok(c) => c,
                            Err(e) => {
                                failed.push((ep.shown.clone(), e));
                                continue;
                            }
                        };
                        match attached_at(&c, shown, digest).await {
                            Ok(found) if !found.is_empty() => return Ok(found),
                            Ok(_) => answered = true,
                            Err(e) => failed.push((ep.shown.clone(), e)),
                        }
                    }
                    if answered || failed.is_empty() {
                        return Ok(vec![]);
                    }
                    Err(all_failed(shown, failed))
                }
            })
            .await?;
        Ok(Found {
            reference: shown,
            digest,
            attached,
        })
    }
}

/// Everything attached to `digest` at one host: bundles referring to it, then cosign's
/// signature layers.
async fn attached_at(
    c: &Connected,
    shown: &str,
    digest: &str,
) -> Result<Vec<Attached>, ArtifactError> {
    let mut out = referrer_bundles(c, shown, digest).await?;
    out.extend(signature_tag_layers(c, shown, digest).await?);
    Ok(out)
}

/// The Sigstore bundles referring to `digest` (oci-client asks the referrers API, and reads
/// the tag schema's index when the registry answers 404).
async fn referrer_bundles(
    c: &Connected,
    shown: &str,
    digest: &str,
) -> Result<Vec<Attached>, ArtifactError> {
    let subject = at_digest(c, digest);
    let index = match c
        .client
        .pull_referrers(&subject, Some(BUNDLE_ARTIFACT_TYPE))
        .await
    {
        Ok(index) => index,
        Err(e) => {
            let e = c.refused(shown, e);
            if e.is_transient() {
                return Err(e);
            }
            // a registry that refuses to list referrers has none to offer: cosign's tag may
            tracing::debug!(reference = %shown, error = %e, "no referrers listed");
            return Ok(vec![]);
        }
    };
    let mut out = vec![];
    for referrer in oci_attached::bundle_referrers(&index.manifests) {
        let at = format!("referrer {referrer}");
        let manifest = match pull_manifest(c, shown, &at_digest(c, &referrer)).await? {
            Some(m) => m,
            None => {
                out.push(unreadable(&at, "listed, but the registry does not have it"));
                continue;
            }
        };
        let pulled = match bundle_layer(&manifest, digest) {
            Ok(blob) => pull_capped(c, shown, &blob, BUNDLE_ARTIFACT_TYPE).await?,
            Err(detail) => Err(detail),
        };
        out.push(match pulled {
            Ok(bundle) => Attached::Bundle { at, bundle },
            Err(detail) => Attached::Unreadable { at, detail },
        });
    }
    Ok(out)
}

/// The simple signing layers of cosign's signature manifest for `digest`.
async fn signature_tag_layers(
    c: &Connected,
    shown: &str,
    digest: &str,
) -> Result<Vec<Attached>, ArtifactError> {
    let tag = oci_attached::signature_tag(digest);
    let at_tag = Reference::with_tag(
        c.at.registry().to_string(),
        c.at.repository().to_string(),
        tag.clone(),
    );
    let Some(manifest) = pull_manifest(c, shown, &at_tag).await? else {
        return Ok(vec![]);
    };
    let layers = match signature_layers(&manifest) {
        Ok(layers) => layers,
        Err(detail) => return Ok(vec![unreadable(&format!("tag {tag}"), &detail)]),
    };
    let mut out = vec![];
    for (i, layer) in layers.iter().enumerate() {
        let at = format!("tag {tag}, layer {}", i + 1);
        out.push(
            match pull_capped(c, shown, layer, simple_signing::MEDIA_TYPE).await? {
                Ok(payload) => Attached::SimpleSigning {
                    at,
                    payload,
                    annotations: layer.annotations.clone(),
                },
                Err(detail) => Attached::Unreadable { at, detail },
            },
        );
    }
    Ok(out)
}

fn unreadable(at: &str, detail: &str) -> Attached {
    Attached::Unreadable {
        at: at.to_string(),
        detail: detail.to_string(),
    }
}

/// The repository's manifest `digest` at this host.
fn at_digest(c: &Connected, digest: &str) -> Reference {
    Reference::with_digest(
        c.at.registry().to_string(),
        c.at.repository().to_string(),
        digest.to_string(),
    )
}

/// A manifest's bytes (oci-client checks them against a digest reference); `None` when the
/// registry does not have it. Its size is checked by the parser ([`BLOB_CAP`]).
async fn pull_manifest(
    c: &Connected,
    shown: &str,
    at: &Reference,
) -> Result<Option<Vec<u8>>, ArtifactError> {
    let accepted = [OCI_IMAGE_MEDIA_TYPE, IMAGE_MANIFEST_MEDIA_TYPE];
    match c.client.pull_manifest_raw(at, &c.auth, &accepted).await {
        Ok((bytes, _)) => Ok(Some(bytes.to_vec())),
        Err(e) if not_found(&e) => Ok(None),
        Err(e) => Err(c.refused(shown, e)),
    }
}

fn not_found(e: &OciDistributionError) -> bool {
    match e {
        OciDistributionError::ImageManifestNotFoundError(_)
        | OciDistributionError::ServerError { code: 404, .. } => true,
        OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|e| {
            matches!(
                e.code,
                OciErrorCode::ManifestUnknown | OciErrorCode::NameUnknown
            )
        }),
        _ => false,
    }
}

/// A blob of at most [`BLOB_CAP`] bytes whose SHA-256 is its digest; `Ok(Err(why))` when it
/// is not one, an error when the transfer failed and may be retried.
async fn pull_capped(
    c: &Connected,
    shown: &str,
    blob: &Blob,
    media_type: &str,
) -> Result<Result<Vec<u8>, String>, ArtifactError> {
    let sized = match c
        .client
        .pull_blob_stream(&c.at, &blob.descriptor(media_type))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            let e = c.refused(shown, e);
            return if e.is_transient() {
                Err(e)
            } else {
                Ok(Err(format!("blob {}: {e}", blob.digest)))
            };
        }
    };
    let mut stream = sized.stream;
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ArtifactError::Transfer {
            url: shown.to_string(),
            attempts: 1,
            detail: error_chain(&e),
        })?;
        if out.len() + chunk.len() > BLOB_CAP {
            return Ok(Err(format!(
                "blob {} is larger than the {BLOB_CAP} bytes read",
                blob.digest
            )));
        }
        out.extend_from_slice(&chunk);
    }
    let got = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&out)));
    if got != blob.digest {
        return Ok(Err(format!("blob {} arrived as {got}", blob.digest)));
    }
    Ok(Ok(out))
}
