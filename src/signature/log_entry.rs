//! A transparency log entry (Rekor's): the log's signed promise to include it (the signed
//! entry timestamp, SET), which gives the signature the time the log saw it, and its body,
//! which must be about this file, this signature and this certificate or key.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::keys::PublicKey;
use super::trusted_root::{TrustedRoot, shown_time};

/// An entry as the material carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// The log's key id (SHA-256 of its public key).
    pub log_id: Vec<u8>,
    pub log_index: i64,
    /// When the log integrated the entry (Unix seconds): the signed time.
    pub integrated_time: i64,
    /// The canonicalized body, as the log stored it (JSON).
    pub body: Vec<u8>,
    /// The signed entry timestamp: the log's signature over the four fields above.
    pub set: Vec<u8>,
}

#[derive(Deserialize)]
struct Body {
    kind: String,
    #[serde(rename = "apiVersion")]
    api_version: String,
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

/// Check the entry: a log of `root` valid at its time signed it, and its body is a
/// `hashedrekord` about this file, this signature and this signer. The signed time.
pub fn verify(entry: &LogEntry, root: &TrustedRoot, about: &About<'_>) -> Result<i64, String> {
    let log = root.log(&entry.log_id).ok_or_else(|| {
        format!(
            "made by a log the trusted root does not name (log id {})",
            hex::encode(&entry.log_id)
        )
    })?;
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
    check_body(&entry.body, about)?;
    Ok(entry.integrated_time)
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
    let b: Body = serde_json::from_slice(body).map_err(|e| format!("its body: {e}"))?;
    if b.kind != "hashedrekord" || b.api_version != "0.0.1" {
        return Err(format!(
            "its body is a {:?} {:?} entry, expected hashedrekord 0.0.1",
            crate::text::clip(&b.kind, 64),
            crate::text::clip(&b.api_version, 16)
        ));
    }
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
