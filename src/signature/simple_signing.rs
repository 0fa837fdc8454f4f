//! cosign's signatures attached to an OCI manifest (`cosign sign`, the tag
//! `sha256-<digest>.sig`): each layer of that tag's manifest is a "simple signing" payload, a
//! JSON document naming the signed manifest's digest, and the layer's annotations carry the
//! signature over the payload's bytes, the signing certificate and its chain, and the log's
//! signed entry (the same `rekorBundle` a cosign bundle carries, a `hashedrekord` over the
//! payload's SHA-256).
//!
//! Pure: the payload and annotations in; the signed subject (the payload's SHA-256, which is
//! what ECDSA and the log entry are over) and the [`Material`] out, once the payload is shown
//! to be about the expected manifest. [`verify`](super::verify()) then checks them as for a
//! file.

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::SignatureError;
use super::certificate::from_pem;
use super::material::{self, Material};

/// The media type of a simple signing layer.
pub const MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The signature over the payload (base64).
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// The signing certificate (PEM), for a keyless signature.
pub const CERTIFICATE_ANNOTATION: &str = "dev.sigstore.cosign/certificate";
/// The certificate's chain (PEM blocks).
pub const CHAIN_ANNOTATION: &str = "dev.sigstore.cosign/chain";
/// The log's signed entry (`{"SignedEntryTimestamp": .., "Payload": {..}}`).
pub const BUNDLE_ANNOTATION: &str = "dev.sigstore.cosign/bundle";
/// The payload's `critical.type`.
const PAYLOAD_TYPE: &str = "cosign container image signature";

#[derive(Deserialize)]
struct Payload {
    critical: Critical,
}

#[derive(Deserialize)]
struct Critical {
    #[serde(rename = "type")]
    type_: String,
    image: Image,
}

#[derive(Deserialize)]
struct Image {
    #[serde(rename = "docker-manifest-digest")]
    docker_manifest_digest: String,
}

/// The subject (the payload's SHA-256) and material of one simple signing layer of
/// `manifest_digest` (`sha256:<hex>`); `file` names it in errors.
pub fn read(
    file: &str,
    payload: &[u8],
    annotations: &BTreeMap<String, String>,
    manifest_digest: &str,
) -> Result<([u8; 32], Material), SignatureError> {
    let bad = |detail: String| SignatureError::Material {
        file: file.to_string(),
        detail,
    };
    let p: Payload = serde_json::from_slice(payload)
        .map_err(|e| bad(format!("the simple signing payload: {e}")))?;
    if p.critical.type_ != PAYLOAD_TYPE {
        return Err(bad(format!(
            "the payload's critical.type is {:?}, expected {PAYLOAD_TYPE:?}",
            crate::text::clip(&p.critical.type_, 128)
        )));
    }
    let signed = p.critical.image.docker_manifest_digest.trim();
    if !signed.eq_ignore_ascii_case(manifest_digest) {
        return Err(SignatureError::OtherManifest {
            file: file.to_string(),
            signed: crate::text::clip(signed, 128),
            expected: manifest_digest.to_string(),
        });
    }
    let signature = annotations
        .get(SIGNATURE_ANNOTATION)
        .ok_or_else(|| bad(format!("no {SIGNATURE_ANNOTATION} annotation")))?;
    // the log entry is read as a cosign bundle's `rekorBundle`, which it is
    let mut m = match annotations.get(BUNDLE_ANNOTATION) {
        Some(b) => {
            let rekor: serde_json::Value = serde_json::from_str(b)
                .map_err(|e| bad(format!("{BUNDLE_ANNOTATION}: not JSON: {e}")))?;
            let cosign = serde_json::json!({"base64Signature": signature, "rekorBundle": rekor});
            material::bundle(cosign.to_string().as_bytes())
                .map_err(|e| bad(format!("{BUNDLE_ANNOTATION}: {e}")))?
        }
        None => material::detached(signature.as_bytes(), None).map_err(bad)?,
    };
    m.certificate = match annotations.get(CERTIFICATE_ANNOTATION) {
        Some(c) if !c.trim().is_empty() => Some(
            from_pem(c.as_bytes()).map_err(|e| bad(format!("{CERTIFICATE_ANNOTATION}: {e}")))?,
        ),
        _ => None,
    };
    if let Some(chain) = annotations.get(CHAIN_ANNOTATION) {
        m.chain = pem::parse_many(chain.as_bytes())
            .map_err(|e| bad(format!("{CHAIN_ANNOTATION}: bad PEM: {e}")))?
            .into_iter()
            .filter(|b| b.tag() == "CERTIFICATE")
            .map(pem::Pem::into_contents)
            .collect();
    }
    Ok((Sha256::digest(payload).into(), m))
}
