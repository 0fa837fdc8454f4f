//! Signature material as publishers ship it, read into one [`Material`]:
//! - detached: a `.sig` (base64 of the signature, as `cosign sign-blob` writes it) and, for
//!   keyless, a `.pem` (the certificate in PEM, or base64 of that PEM as cosign writes it);
//!   runwasi ships these inside its release tarballs. No signed time.
//! - a cosign bundle (`cosign sign-blob --bundle`, cosign 1.x and 2.x): `base64Signature`,
//!   `cert`, and `rekorBundle`, the log's signed entry timestamp.
//! - a Sigstore bundle (v0.1 to v0.3, cosign 3 and the Sigstore clients): a message signature
//!   and its verification material: a transparency log entry (with its signed entry
//!   timestamp, its inclusion proof, or both) and RFC 3161 timestamps.
//!
//! All of it is untrusted text: every failure is an error that says what was wrong.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;

use super::certificate::from_pem;
use super::inclusion::InclusionProof;
use super::log_entry::LogEntry;

/// What verifies a signature over one file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Material {
    pub signature: Vec<u8>,
    /// The signing certificate (DER), for a keyless signature.
    pub certificate: Option<Vec<u8>>,
    /// Intermediate certificates the material carries (DER).
    pub chain: Vec<Vec<u8>>,
    /// A transparency log entry with the log's signed promise: the signed time.
    pub log_entry: Option<LogEntry>,
    /// The digest a Sigstore bundle says it signs (SHA-256), checked against the file.
    pub message_sha256: Option<Vec<u8>>,
    /// RFC 3161 timestamp tokens over the signature (DER), from a Sigstore bundle.
    pub timestamps: Vec<Vec<u8>>,
}

/// A `.sig` and, for keyless, its `.pem`.
pub fn detached(sig: &[u8], pem: Option<&[u8]>) -> Result<Material, String> {
    let text = String::from_utf8_lossy(sig);
    let signature = STANDARD
        .decode(text.trim())
        .map_err(|e| format!("the signature is not base64: {e}"))?;
    let certificate = pem
        .map(from_pem)
        .transpose()
        .map_err(|e| format!("the certificate: {e}"))?;
    Ok(Material {
        signature,
        certificate,
        ..Material::default()
    })
}

/// A bundle: a Sigstore bundle when it has a `mediaType`, else a cosign bundle.
pub fn bundle(text: &[u8]) -> Result<Material, String> {
    let probe: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| format!("the bundle is not JSON: {e}"))?;
    if probe.get("mediaType").is_some() {
        sigstore_bundle(probe)
    } else {
        cosign_bundle(probe)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CosignBundle {
    base64_signature: String,
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    rekor_bundle: Option<RekorBundle>,
}

#[derive(Deserialize)]
struct RekorBundle {
    #[serde(rename = "SignedEntryTimestamp")]
    signed_entry_timestamp: String,
    #[serde(rename = "Payload")]
    payload: RekorPayload,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RekorPayload {
    body: String,
    integrated_time: i64,
    log_index: i64,
    #[serde(rename = "logID")]
    log_id: String,
}

fn cosign_bundle(v: serde_json::Value) -> Result<Material, String> {
    let b: CosignBundle =
        serde_json::from_value(v).map_err(|e| format!("not a cosign bundle: {e}"))?;
    let signature = b64(&b.base64_signature, "base64Signature")?;
    let certificate = match b.cert.as_deref().map(str::trim) {
        Some(c) if !c.is_empty() => Some(from_pem(c.as_bytes()).map_err(|e| format!("cert: {e}"))?),
        _ => None,
    };
    let log_entry = match b.rekor_bundle {
        Some(r) => Some(LogEntry {
            log_id: hex::decode(r.payload.log_id.trim())
                .map_err(|e| format!("rekorBundle.Payload.logID: not hex: {e}"))?,
            log_index: r.payload.log_index,
            integrated_time: r.payload.integrated_time,
            body: b64(&r.payload.body, "rekorBundle.Payload.body")?,
            set: b64(
                &r.signed_entry_timestamp,
                "rekorBundle.SignedEntryTimestamp",
            )?,
            proof: None,
        }),
        None => None,
    };
    Ok(Material {
        signature,
        certificate,
        chain: vec![],
        log_entry,
        message_sha256: None,
        timestamps: vec![],
    })
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SigstoreBundle {
    verification_material: VerificationMaterial,
    #[serde(default)]
    message_signature: Option<MessageSignature>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct VerificationMaterial {
    #[serde(default)]
    x509_certificate_chain: Option<Chain>,
    #[serde(default)]
    certificate: Option<Raw>,
    #[serde(default)]
    tlog_entries: Vec<TlogEntry>,
    #[serde(default)]
    timestamp_verification_data: Option<TimestampData>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TimestampData {
    #[serde(default)]
    rfc3161_timestamps: Vec<SignedTimestamp>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SignedTimestamp {
    signed_timestamp: String,
}

#[derive(Deserialize)]
struct Chain {
    certificates: Vec<Raw>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Raw {
    raw_bytes: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlogEntry {
    log_index: serde_json::Value,
    log_id: LogId,
    /// Absent or 0 in a Rekor v2 entry.
    #[serde(default)]
    integrated_time: Option<serde_json::Value>,
    #[serde(default)]
    inclusion_promise: Option<Promise>,
    #[serde(default)]
    inclusion_proof: Option<ProofDoc>,
    canonicalized_body: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ProofDoc {
    log_index: serde_json::Value,
    root_hash: String,
    tree_size: serde_json::Value,
    #[serde(default)]
    hashes: Vec<String>,
    /// Absent in some v0.1 bundles (Rekor's checkpoints came later).
    #[serde(default)]
    checkpoint: Option<Envelope>,
}

#[derive(Deserialize)]
struct Envelope {
    envelope: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogId {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Promise {
    signed_entry_timestamp: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MessageSignature {
    #[serde(default)]
    message_digest: Option<MessageDigest>,
    signature: String,
}

#[derive(Deserialize)]
struct MessageDigest {
    algorithm: String,
    digest: String,
}

/// At most this many timestamps are checked, as the Sigstore clients cap them.
const MAX_TIMESTAMPS: usize = 32;

const SIGSTORE_BUNDLES: [&str; 4] = [
    "application/vnd.dev.sigstore.bundle+json;version=0.1",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle.v0.3+json",
];

fn sigstore_bundle(v: serde_json::Value) -> Result<Material, String> {
    let media_type = v.get("mediaType").and_then(|m| m.as_str()).unwrap_or("");
    if !SIGSTORE_BUNDLES.contains(&media_type) {
        return Err(format!(
            "mediaType {:?} is not a Sigstore bundle this reads (v0.1 to v0.3)",
            crate::text::clip(media_type, 128)
        ));
    }
    let v01 = media_type.ends_with("version=0.1");
    let b: SigstoreBundle =
        serde_json::from_value(v).map_err(|e| format!("not a Sigstore bundle: {e}"))?;
    let m = b
        .message_signature
        .ok_or("it holds no messageSignature (a DSSE envelope signs an attestation, not a file)")?;
    let vm = b.verification_material;
    let mut certs = match (vm.x509_certificate_chain, vm.certificate) {
        (Some(chain), _) => chain.certificates,
        (None, Some(c)) => vec![c],
        (None, None) => vec![],
    }
    .iter()
    .map(|c| b64(&c.raw_bytes, "verificationMaterial certificate"))
    .collect::<Result<Vec<_>, _>>()?;
    let certificate = (!certs.is_empty()).then(|| certs.remove(0));
    let message_sha256 = match m.message_digest {
        Some(d) if d.algorithm == "SHA2_256" => Some(b64(&d.digest, "messageDigest.digest")?),
        Some(d) => {
            return Err(format!(
                "messageDigest.algorithm {:?}, expected SHA2_256",
                crate::text::clip(&d.algorithm, 32)
            ));
        }
        None => None,
    };
    // the first entry: the Sigstore clients write one; a bad one is refused, not skipped
    let log_entry = vm
        .tlog_entries
        .first()
        .map(|e| tlog_entry(e, v01))
        .transpose()?;
    let timestamps = vm
        .timestamp_verification_data
        .map(|t| t.rfc3161_timestamps)
        .unwrap_or_default();
    if timestamps.len() > MAX_TIMESTAMPS {
        return Err(format!(
            "it holds {} RFC 3161 timestamps, more than {MAX_TIMESTAMPS}",
            timestamps.len()
        ));
    }
    let timestamps = timestamps
        .iter()
        .map(|t| b64(&t.signed_timestamp, "rfc3161Timestamps.signedTimestamp"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Material {
        signature: b64(&m.signature, "messageSignature.signature")?,
        certificate,
        chain: certs,
        log_entry,
        message_sha256,
        timestamps,
    })
}

/// A bundle's log entry; `v01`: of a v0.1 bundle, whose inclusion proof without a
/// checkpoint is not read (as the Sigstore clients do), where a later bundle's is refused.
fn tlog_entry(e: &TlogEntry, v01: bool) -> Result<LogEntry, String> {
    let set = match &e.inclusion_promise {
        Some(p) => b64(
            &p.signed_entry_timestamp,
            "inclusionPromise.signedEntryTimestamp",
        )?,
        None => vec![],
    };
    let proof = match &e.inclusion_proof {
        Some(ProofDoc {
            checkpoint: None, ..
        }) if v01 => None,
        Some(ProofDoc {
            checkpoint: None, ..
        }) => return Err("tlogEntries.inclusionProof: no checkpoint".into()),
        Some(p) => Some(InclusionProof {
            log_index: int64(&p.log_index, "inclusionProof.logIndex")?,
            tree_size: int64(&p.tree_size, "inclusionProof.treeSize")?,
            root_hash: b64(&p.root_hash, "inclusionProof.rootHash")?,
            hashes: p
                .hashes
                .iter()
                .map(|h| b64(h, "inclusionProof.hashes"))
                .collect::<Result<_, _>>()?,
            checkpoint: p
                .checkpoint
                .as_ref()
                .map(|c| c.envelope.clone())
                .unwrap_or_default(),
        }),
        None => None,
    };
    Ok(LogEntry {
        log_id: b64(&e.log_id.key_id, "tlogEntries.logId.keyId")?,
        log_index: int64(&e.log_index, "tlogEntries.logIndex")?,
        integrated_time: match &e.integrated_time {
            Some(t) => int64(t, "tlogEntries.integratedTime")?,
            None => 0,
        },
        body: b64(&e.canonicalized_body, "tlogEntries.canonicalizedBody")?,
        set,
        proof,
    })
}

/// A protobuf JSON int64: a string of digits, or a number.
fn int64(v: &serde_json::Value, field: &str) -> Result<i64, String> {
    match v {
        serde_json::Value::String(s) => s.parse().ok(),
        serde_json::Value::Number(n) => n.as_i64(),
        _ => None,
    }
    .ok_or_else(|| format!("{field}: not an integer"))
}

fn b64(s: &str, field: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(s.trim())
        .map_err(|e| format!("{field}: bad base64: {e}"))
}
