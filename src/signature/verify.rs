//! The decision: does this material prove that a trusted signer signed this file? Pure: the
//! file's bytes, the material, what is trusted and the trusted root in; who signed and when
//! out, or the refusal that names the file, the signer found and the one expected.

use sha2::{Digest, Sha256};

use super::SignatureError;
use super::certificate::{self, ChainError};
use super::keys::PublicKey;
use super::log_entry::{self, About};
use super::material::Material;
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

/// A verified signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub signed_by: SignedBy,
    /// The signed time (Unix seconds) from a transparency log entry; `None`: no signed time
    /// was checked (a keyed signature without an entry, or a keyless one the policy accepts
    /// without).
    pub signed_time: Option<i64>,
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
    let signed_time = match &m.log_entry {
        Some(e) => Some(logged(name, e, root, sha_hex, m, key.spki())?),
        None => None,
    };
    Ok(Verified {
        signed_by: SignedBy::Key {
            fingerprint: key.fingerprint(),
        },
        signed_time,
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
    let signed_time = match &m.log_entry {
        Some(e) => Some(logged(name, e, root, sha_hex, m, cert)?),
        None if trust.without_signed_time => None,
        None => {
            return Err(SignatureError::NoSignedTime {
                file: name.to_string(),
            });
        }
    };
    let at = signed_time.unwrap_or(signer.not_before);
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
    trust.check_identity(name, &signer.identity, &signer.issuer)?;
    Ok(Verified {
        signed_by: SignedBy::Identity {
            identity: signer.identity,
            issuer: signer.issuer,
        },
        signed_time,
        log_index: m.log_entry.as_ref().map(|e| e.log_index),
    })
}

/// The log entry's signed time, once it verifies and is about this file, signature and signer.
fn logged(
    name: &str,
    e: &log_entry::LogEntry,
    root: &TrustedRoot,
    sha_hex: &str,
    m: &Material,
    signer_der: &[u8],
) -> Result<i64, SignatureError> {
    let about = About {
        file_sha256: sha_hex,
        signature: &m.signature,
        signer_der,
    };
    log_entry::verify(e, root, &about).map_err(|detail| SignatureError::LogEntry {
        file: name.to_string(),
        detail,
    })
}
