//! A transparency log entry (Rekor's): the log's signed promise to include it (the signed
//! entry timestamp, SET), which gives the signature the time the log saw it; or its
//! inclusion proof and signed checkpoint ([`super::inclusion`]), which prove the log holds it
//! but sign no time (Rekor v2 entries carry only these); and its body, which must be about
//! this file, this signature and this certificate or key (`hashedrekord` 0.0.1 of Rekor v1,
//! 0.0.2 of Rekor v2).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::inclusion::{self, InclusionProof};
use super::keys::PublicKey;
use super::trusted_root::{TrustedRoot, shown_time};

/// An entry as the material carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogEntry {
    /// The log's key id (SHA-256 of its public key).
    pub log_id: Vec<u8>,
    pub log_index: i64,
    /// When the log integrated the entry (Unix seconds): the signed time when the SET
    /// signs it; 0 for a Rekor v2 entry.
    pub integrated_time: i64,
    /// The canonicalized body, as the log stored it (JSON).
    pub body: Vec<u8>,
    /// The signed entry timestamp: the log's signature over the four fields above (empty:
    /// none).
    pub set: Vec<u8>,
    /// The inclusion proof with its checkpoint, when the entry carries one.
    pub proof: Option<InclusionProof>,
}

#[derive(Deserialize)]
struct Kind {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
}

#[derive(Deserialize)]
struct Body {
    spec: Spec,
}

#[derive(Deserialize)]
struct Spec {
    data: Data,
    signature: Sig,
}

#[derive(Deserialize)]
struct Data {
    hash: Hash,
}

#[derive(Deserialize)]
struct Hash {
    algorithm: String,
    value: String,
}

#[derive(Deserialize)]
struct Sig {
    content: String,
    #[serde(rename = "publicKey")]
    public_key: Content,
}

#[derive(Deserialize)]
struct Content {
    content: String,
}

/// What the body must be about.
pub struct About<'a> {
    /// Lowercase hex SHA-256 of the signed file.
    pub file_sha256: &'a str,
    pub signature: &'a [u8],
    /// The signer's certificate (DER), or its key (DER SPKI) for a keyed signature.
    pub signer_der: &'a [u8],
}

/// Check the entry: a log of `root` signed its SET (valid at its time) or the checkpoint
/// of a tree its inclusion proof puts it in, each that it carries, at least one; and its
/// body is a `hashedrekord` about this file, this signature and this signer. The signed
/// time: the integrated time the SET signs; `None` when only an inclusion proof (which signs
/// no time) shows the entry.
pub fn verify(
    entry: &LogEntry,
    root: &TrustedRoot,
    about: &About<'_>,
) -> Result<Option<i64>, String> {
    let log = root.log(&entry.log_id).ok_or_else(|| {
        format!(
            "made by a log the trusted root does not name (log id {})",
            hex::encode(&entry.log_id)
        )
    })?;
    if entry.set.is_empty() && entry.proof.is_none() {
        return Err("it carries neither a signed entry timestamp nor an inclusion proof".into());
    }
    let mut signed_time = None;
    if !entry.set.is_empty() {
        if !log.valid_for.contains(entry.integrated_time) {
            return Err(format!(
                "the log {} was not trusted at {}",
                log.base_url,
                shown_time(entry.integrated_time)
            ));
        }
        let key = PublicKey::from_spki(&log.spki).map_err(|e| format!("the log's key: {e}"))?;
        if !key.verifies(&canonical_payload(entry), &entry.set) {
            return Err(format!(
                "its signed entry timestamp does not verify with the key of {}",
                log.base_url
            ));
        }
        signed_time = Some(entry.integrated_time);
    }
    if let Some(proof) = &entry.proof {
        inclusion::verify(proof, &entry.body, log)?;
    }
    check_body(&entry.body, about)?;
    Ok(signed_time)
}

/// The SET's payload: canonical JSON (keys sorted, no spaces) of the body (base64), the
/// integrated time, the log id (hex) and the log index.
pub fn canonical_payload(entry: &LogEntry) -> Vec<u8> {
    format!(
        "{{\"body\":\"{}\",\"integratedTime\":{},\"logID\":\"{}\",\"logIndex\":{}}}",
        STANDARD.encode(&entry.body),
        entry.integrated_time,
        hex::encode(&entry.log_id),
        entry.log_index
    )
    .into_bytes()
}

fn check_body(body: &[u8], about: &About<'_>) -> Result<(), String> {
    let kind: Kind = serde_json::from_slice(body).map_err(|e| format!("its body: {e}"))?;
    match (kind.kind.as_str(), kind.api_version.as_str()) {
        ("hashedrekord", "0.0.1") => check_v1_body(body, about),
        ("hashedrekord", "0.0.2") => check_v2_body(body, about),
        (k, v) => Err(format!(
            "its body is a {:?} {:?} entry, expected hashedrekord 0.0.1 or 0.0.2",
            crate::text::clip(k, 64),
            crate::text::clip(v, 16)
        )),
    }
}

fn check_v1_body(body: &[u8], about: &About<'_>) -> Result<(), String> {
    let b: Body = serde_json::from_slice(body).map_err(|e| format!("its body: {e}"))?;
    let hash = &b.spec.data.hash;
    if hash.algorithm != "sha256" || !hash.value.eq_ignore_ascii_case(about.file_sha256) {
        return Err(format!(
            "it is about another file ({} {}, this file's sha256 is {})",
            crate::text::clip(&hash.algorithm, 16),
            crate::text::clip(&hash.value, 128),
            about.file_sha256
        ));
    }
    let sig = STANDARD
        .decode(b.spec.signature.content.trim())
        .map_err(|e| format!("its signature: bad base64: {e}"))?;
    if sig != about.signature {
        return Err("it records another signature".into());
    }
    let signer = STANDARD
        .decode(b.spec.signature.public_key.content.trim())
        .map_err(|e| format!("its public key: bad base64: {e}"))?;
    let signer = pem::parse(&signer).map_err(|e| format!("its public key: bad PEM: {e}"))?;
    if signer.contents() != about.signer_der {
        return Err("it records another certificate or key".into());
    }
    Ok(())
}

/// Rekor v2's `hashedrekord` 0.0.2 body (protobuf JSON): the digest and signature in base64,
/// the signer's certificate or key as DER.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Body {
    spec: V2Spec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Spec {
    hashed_rekord_v002: V2Rekord,
}

#[derive(Deserialize)]
struct V2Rekord {
    data: V2Data,
    signature: V2Sig,
}

#[derive(Deserialize)]
struct V2Data {
    algorithm: String,
    digest: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Sig {
    content: String,
    verifier: V2Verifier,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Verifier {
    #[serde(default)]
    x509_certificate: Option<V2Raw>,
    #[serde(default)]
    public_key: Option<V2Raw>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Raw {
    raw_bytes: String,
}

fn check_v2_body(body: &[u8], about: &About<'_>) -> Result<(), String> {
    let b: V2Body = serde_json::from_slice(body).map_err(|e| format!("its body: {e}"))?;
    let r = b.spec.hashed_rekord_v002;
    let digest = STANDARD
        .decode(r.data.digest.trim())
        .map_err(|e| format!("its digest: bad base64: {e}"))?;
    if r.data.algorithm != "SHA2_256" || hex::encode(&digest) != about.file_sha256 {
        return Err(format!(
            "it is about another file ({} {}, this file's sha256 is {})",
            crate::text::clip(&r.data.algorithm, 16),
            hex::encode(&digest[..digest.len().min(64)]),
            about.file_sha256
        ));
    }
    let sig = STANDARD
        .decode(r.signature.content.trim())
        .map_err(|e| format!("its signature: bad base64: {e}"))?;
    if sig != about.signature {
        return Err("it records another signature".into());
    }
    let signer = match (
        r.signature.verifier.x509_certificate,
        r.signature.verifier.public_key,
    ) {
        (Some(raw), _) | (None, Some(raw)) => STANDARD
            .decode(raw.raw_bytes.trim())
            .map_err(|e| format!("its verifier: bad base64: {e}"))?,
        (None, None) => return Err("it records no certificate or key".into()),
    };
    if signer != about.signer_der {
        return Err("it records another certificate or key".into());
    }
    Ok(())
}
