//! Public keys (DER SubjectPublicKeyInfo, as cosign's `cosign.pub` holds in PEM) and the
//! signatures they verify: ECDSA P-256 with SHA-256 and P-384 with SHA-384 (ASN.1 DER
//! signatures, as cosign writes them), and Ed25519.

use ring::signature::{self, UnparsedPublicKey, VerificationAlgorithm};
use x509_cert::der::Decode;
use x509_cert::spki::SubjectPublicKeyInfoRef;

use super::trusted_root::key_id;

const EC_PUBLIC_KEY: &str = "1.2.840.10045.2.1";
const P256: &str = "1.2.840.10045.3.1.7";
const P384: &str = "1.3.132.0.34";
const ED25519: &str = "1.3.101.112";

/// A public key a policy trusts, or a log's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    spki: Vec<u8>,
}

impl PublicKey {
    /// From DER SubjectPublicKeyInfo; `Err` says why it is not a key this verifies with.
    pub fn from_spki(spki: &[u8]) -> Result<PublicKey, String> {
        algorithm(spki)?;
        Ok(PublicKey {
            spki: spki.to_vec(),
        })
    }

    /// From PEM text (`-----BEGIN PUBLIC KEY-----`).
    pub fn from_pem(text: &str) -> Result<PublicKey, String> {
        let block = pem::parse(text.trim()).map_err(|e| format!("bad PEM: {e}"))?;
        if block.tag() != "PUBLIC KEY" {
            return Err(format!(
                "a PEM {:?} block, not a PUBLIC KEY",
                crate::text::clip(block.tag(), 64)
            ));
        }
        PublicKey::from_spki(block.contents())
    }

    pub fn spki(&self) -> &[u8] {
        &self.spki
    }

    /// `sha256:<hex>` of its DER: how a key is named in errors, the state and status.
    pub fn fingerprint(&self) -> String {
        format!("sha256:{}", hex::encode(key_id(&self.spki)))
    }

    /// Whether `sig` is this key's signature over `message`.
    pub fn verifies(&self, message: &[u8], sig: &[u8]) -> bool {
        let Ok((alg, point)) = algorithm(&self.spki) else {
            return false;
        };
        UnparsedPublicKey::new(alg, point)
            .verify(message, sig)
            .is_ok()
    }
}

/// The ring algorithm for a key, and its raw public key bytes.
fn algorithm(spki: &[u8]) -> Result<(&'static dyn VerificationAlgorithm, &[u8]), String> {
    let info = SubjectPublicKeyInfoRef::from_der(spki)
        .map_err(|e| format!("not a SubjectPublicKeyInfo: {e}"))?;
    let key = info
        .subject_public_key
        .as_bytes()
        .ok_or("a public key with unused bits")?;
    let alg = info.algorithm.oid.to_string();
    let curve = info
        .algorithm
        .parameters
        .and_then(|p| p.decode_as::<x509_cert::der::asn1::ObjectIdentifier>().ok())
        .map(|o| o.to_string());
    let verify: &'static dyn VerificationAlgorithm = match (alg.as_str(), curve.as_deref()) {
        (EC_PUBLIC_KEY, Some(P256)) => &signature::ECDSA_P256_SHA256_ASN1,
        (EC_PUBLIC_KEY, Some(P384)) => &signature::ECDSA_P384_SHA384_ASN1,
        (ED25519, _) => &signature::ED25519,
        (a, c) => {
            return Err(format!(
                "an unsupported key (algorithm {a}, curve {}): use ECDSA P-256 or P-384, or Ed25519",
                c.unwrap_or("-")
            ));
        }
    };
    // the subject_public_key borrows spki: give back a slice of the caller's bytes
    let start = spki.len() - key.len();
    Ok((verify, &spki[start..]))
}
