//! The decision: does this material prove that a trusted signer signed this file? Pure: the
//! file's bytes, the material, what is trusted and the trusted root in; who signed and when
//! out, or the refusal that names the file, the signer found and the one expected.

use sha2::{Digest, Sha256};

use super::SignatureError;
use super::certificate::{self, ChainError};
use super::keys::PublicKey;
use super::log_entry::{self, About};
use super::material::Material;
use super::timestamp;
use super::trust::Trust;
use super::trusted_root::{TrustedRoot, shown_time};

/// Who signed, as verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignedBy {
    /// A trusted key, by its fingerprint (`sha256:<hex>` of its DER).
    Key { fingerprint: String },
    /// A certificate for this identity, from this OIDC issuer.
    Identity { identity: String, issuer: String },
}

impl std::fmt::Display for SignedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SignedBy::Key { fingerprint } => write!(f, "key {fingerprint}"),
            SignedBy::Identity { identity, issuer } => write!(f, "{identity} (issuer {issuer})"),
        }
    }
}

/// Where a signed time comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeSource {
    /// A transparency log entry's signed entry timestamp.
    Log,
    /// A timestamp authority's RFC 3161 token.
    TimestampAuthority,
}

/// A verified signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub signed_by: SignedBy,
    /// The signed time (Unix seconds) from a transparency log entry's signed entry timestamp
    /// or, without one, a timestamp authority's token; `None`: no signed time was checked (a
    /// keyed signature without either, or a keyless one the policy accepts without).
    pub signed_time: Option<i64>,
    /// Where the signed time comes from.
    pub time_source: Option<TimeSource>,
    /// The log entry's index, when there was one.
    pub log_index: Option<i64>,
}

/// The SHA-256 of a file's bytes, as [`verify`] takes it.
pub fn file_sha256(file: &[u8]) -> [u8; 32] {
    Sha256::digest(file).into()
}

/// Verify `m` over the file whose SHA-256 is `sha` (named `name` in errors) against `trust`
/// and `root`. The file itself is not needed: its digest is what ECDSA signs.
pub fn verify(
    name: &str,
    sha: &[u8; 32],
    m: &Material,
    trust: &Trust,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let file = sha.as_slice();
    if let Some(d) = &m.message_sha256
        && d.as_slice() != file
    {
        return Err(SignatureError::Mismatch {
            file: name.to_string(),
            signer: "the bundle's signer (it names another file's digest)".into(),
        });
    }
    let sha_hex = hex::encode(file);
    match &m.certificate {
        None => keyed(name, file, &sha_hex, m, trust, root),
        Some(cert) => keyless(name, file, &sha_hex, cert, m, trust, root),
    }
}

fn keyed(
    name: &str,
    file: &[u8],
    sha_hex: &str,
    m: &Material,
    trust: &Trust,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let untrusted = || SignatureError::UntrustedKey {
        file: name.to_string(),
        expected: if trust.keys.is_empty() {
            "no key: the policy trusts certificate identities only, and this signature has no certificate".into()
        } else {
            trust
                .keys
                .iter()
                .map(PublicKey::fingerprint)
                .collect::<Vec<_>>()
                .join(", ")
        },
    };
    let key = trust
        .keys
        .iter()
        .find(|k| k.verifies_file(file, &m.signature))
        .ok_or_else(untrusted)?;
    let times = signed_times(name, root, sha_hex, m, key.spki())?;
    Ok(Verified {
        signed_by: SignedBy::Key {
            fingerprint: key.fingerprint(),
        },
        signed_time: times.first().map(|t| t.0),
        time_source: times.first().map(|t| t.1),
        log_index: m.log_entry.as_ref().map(|e| e.log_index),
    })
}

fn keyless(
    name: &str,
    file: &[u8],
    sha_hex: &str,
    cert: &[u8],
    m: &Material,
    trust: &Trust,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let material = |detail: String| SignatureError::Material {
        file: name.to_string(),
        detail: format!("the certificate: {detail}"),
    };
    let signer = certificate::signer(cert).map_err(material)?;
    let key = certificate::public_key(cert)
        .and_then(|spki| PublicKey::from_spki(&spki))
        .map_err(material)?;
    if !key.verifies_file(file, &m.signature) {
        return Err(SignatureError::Mismatch {
            file: name.to_string(),
            signer: signer.identity.clone(),
        });
    }
    let times = signed_times(name, root, sha_hex, m, cert)?;
    if times.is_empty() && !trust.without_signed_time {
        return Err(SignatureError::NoSignedTime {
            file: name.to_string(),
        });
    }
    // at every signed time, as the Sigstore clients do; at its start without one
    let at: Vec<i64> = match times.is_empty() {
        true => vec![signer.not_before],
        false => times.iter().map(|t| t.0).collect(),
    };
    for at in at {
        certificate::verify_chain(cert, &m.chain, root, at).map_err(|e| match e {
            ChainError::Expired { at } => SignatureError::CertificateExpired {
                file: name.to_string(),
                signed_at: shown_time(at),
                not_before: shown_time(signer.not_before),
                not_after: shown_time(signer.not_after),
            },
            ChainError::Untrusted(detail) => SignatureError::UntrustedCertificate {
                file: name.to_string(),
                detail,
            },
        })?;
    }
    trust.check_identity(name, &signer.identity, &signer.issuer)?;
    Ok(Verified {
        signed_by: SignedBy::Identity {
            identity: signer.identity,
            issuer: signer.issuer,
        },
        signed_time: times.first().map(|t| t.0),
        time_source: times.first().map(|t| t.1),
        log_index: m.log_entry.as_ref().map(|e| e.log_index),
    })
}

/// The signed times the material proves, the log's first: its entry's, once the entry
/// verifies (SET, inclusion proof, or both) and is about this file, signature and signer;
/// then each timestamp's. Any of them that does not verify refuses the signature.
fn signed_times(
    name: &str,
    root: &TrustedRoot,
    sha_hex: &str,
    m: &Material,
    signer_der: &[u8],
) -> Result<Vec<(i64, TimeSource)>, SignatureError> {
    let mut times = Vec::new();
    if let Some(e) = &m.log_entry {
        let about = About {
            file_sha256: sha_hex,
            signature: &m.signature,
            signer_der,
        };
        let logged =
            log_entry::verify(e, root, &about).map_err(|detail| SignatureError::LogEntry {
                file: name.to_string(),
                detail,
            })?;
        times.extend(logged.map(|t| (t, TimeSource::Log)));
    }
    for token in &m.timestamps {
        let t = timestamp::verify(token, &m.signature, root).map_err(|detail| {
            SignatureError::Timestamp {
                file: name.to_string(),
                detail,
            }
        })?;
        times.push((t, TimeSource::TimestampAuthority));
    }
    Ok(times)
}
