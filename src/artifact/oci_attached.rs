//! Signatures attached to an OCI artifact, read from what its registry serves: cosign's
//! signature manifest (the tag `sha256-<hex>.sig`, its layers simple signing payloads), and
//! Sigstore bundles attached as OCI 1.1 referrers (listed by the referrers API, or by the
//! image index at the tag `sha256-<hex>` on registries without it).
//!
//! Pure: every reply is untrusted bytes, bounded ([`BLOB_CAP`], [`CANDIDATES_CAP`]); every
//! failure is a message saying what was wrong. The fetching is `oci_signature.rs`'s.

use std::collections::BTreeMap;

use oci_client::manifest::{ImageIndexEntry, OciDescriptor};
use serde::Deserialize;

use crate::signature::simple_signing;

/// The `artifactType` of a referrer holding a Sigstore bundle, and its layer's media type.
pub const BUNDLE_ARTIFACT_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// Largest manifest, payload or bundle read.
pub const BLOB_CAP: usize = 256 * 1024;
/// Most signature layers, or referrers, read from one artifact.
pub const CANDIDATES_CAP: usize = 16;

/// A blob to fetch, as a manifest describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    pub digest: String,
    pub size: usize,
    pub annotations: BTreeMap<String, String>,
}

impl Blob {
    /// The descriptor oci-client pulls it by.
    pub fn descriptor(&self, media_type: &str) -> OciDescriptor {
        OciDescriptor {
            media_type: media_type.to_string(),
            digest: self.digest.clone(),
            size: i64::try_from(self.size).unwrap_or(i64::MAX),
            ..OciDescriptor::default()
        }
    }
}

/// cosign's signature tag for the manifest `digest` (`sha256:<hex>`): `sha256-<hex>.sig`.
pub fn signature_tag(digest: &str) -> String {
    format!("{}.sig", digest.replace(':', "-"))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Manifest {
    schema_version: i64,
    #[serde(default)]
    layers: Vec<Descriptor>,
    #[serde(default)]
    subject: Option<Descriptor>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

fn parse(manifest: &[u8], what: &str) -> Result<Manifest, String> {
    if manifest.len() > BLOB_CAP {
        return Err(format!(
            "the {what} is {} bytes, larger than the {BLOB_CAP} read",
            manifest.len()
        ));
    }
    let m: Manifest = serde_json::from_slice(manifest)
        .map_err(|e| format!("the {what} is not an OCI image manifest: {e}"))?;
    if m.schema_version != 2 {
        return Err(format!(
            "the {what} has schemaVersion {}, not 2",
            m.schema_version
        ));
    }
    Ok(m)
}

/// A descriptor's blob, once its digest is a sha256 and its size within [`BLOB_CAP`].
fn blob(d: Descriptor, what: &str) -> Result<Blob, String> {
    if !is_sha256(&d.digest) {
        return Err(format!(
            "the {what}'s digest {:?} is not a sha256",
            crate::text::clip(&d.digest, 128)
        ));
    }
    match usize::try_from(d.size) {
        Ok(size) if size <= BLOB_CAP => Ok(Blob {
            digest: d.digest,
            size,
            annotations: d.annotations,
        }),
        _ => Err(format!(
            "the {what} {} is {} bytes, not 0 to {BLOB_CAP}",
            d.digest, d.size
        )),
    }
}

/// `sha256:` and 64 hex digits.
fn is_sha256(digest: &str) -> bool {
    let hex = digest.strip_prefix("sha256:").unwrap_or_default();
    hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The simple signing layers of cosign's signature manifest, at most [`CANDIDATES_CAP`]; a
/// layer of another media type is not a signature and is passed over.
pub fn signature_layers(manifest: &[u8]) -> Result<Vec<Blob>, String> {
    let m = parse(manifest, "signature manifest")?;
    m.layers
        .into_iter()
        .filter(|l| l.media_type == simple_signing::MEDIA_TYPE)
        .take(CANDIDATES_CAP)
        .map(|l| blob(l, "signature layer"))
        .collect()
}

/// The referrers holding a Sigstore bundle, from a referrers index (the API's reply or the
/// tag schema's index), by digest: at most [`CANDIDATES_CAP`].
pub fn bundle_referrers(entries: &[ImageIndexEntry]) -> Vec<String> {
    entries
        .iter()
        .filter(|e| e.artifact_type.as_deref() == Some(BUNDLE_ARTIFACT_TYPE))
        .filter(|e| is_sha256(&e.digest))
        .take(CANDIDATES_CAP)
        .map(|e| e.digest.clone())
        .collect()
}

/// The bundle layer of a referrer's manifest, once the referrer is about `subject` (the
/// artifact's manifest digest).
pub fn bundle_layer(manifest: &[u8], subject: &str) -> Result<Blob, String> {
    let m = parse(manifest, "referrer's manifest")?;
    match &m.subject {
        Some(s) if s.digest == subject => {}
        Some(s) => {
            return Err(format!(
                "the referrer is about {}, not {subject}",
                crate::text::clip(&s.digest, 128)
            ));
        }
        None => return Err("the referrer names no subject".into()),
    }
    let layer = m
        .layers
        .into_iter()
        .find(|l| l.media_type == BUNDLE_ARTIFACT_TYPE)
        .ok_or_else(|| format!("the referrer has no layer of media type {BUNDLE_ARTIFACT_TYPE}"))?;
    blob(layer, "bundle")
}
