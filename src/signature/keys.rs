//! Public keys (DER SubjectPublicKeyInfo, as cosign's `cosign.pub` holds in PEM) and the
//! signatures they verify: ECDSA P-256 with SHA-256 and P-384 with SHA-384 (ASN.1 DER
//! signatures, as cosign writes them), and Ed25519, over a message (ring); and over a file
//! by its SHA-256 alone, for ECDSA P-256 (cosign's keys and Fulcio's certificates), so a file
//! is streamed through a hash, never held in memory (p256's prehash verification).

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
        kind(spki)?;
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

    /// Whether `sig` (ASN.1 DER) is this key's ECDSA P-256 signature over the file whose
    /// SHA-256 is `sha256`. Other keys: false (their file signatures are not supported).
    pub fn verifies_file(&self, sha256: &[u8], sig: &[u8]) -> bool {
        use p256::ecdsa::signature::hazmat::PrehashVerifier;
        let Ok((Kind::P256, point)) = kind(&self.spki) else {
            return false;
        };
        let (Ok(key), Ok(sig)) = (
            p256::ecdsa::VerifyingKey::from_sec1_bytes(point),
            p256::ecdsa::Signature::from_der(sig),
        ) else {
            return false;
        };
        key.verify_prehash(sha256, &sig).is_ok()
    }

    /// Whether `sig` is this key's signature over `message`.
    pub fn verifies(&self, message: &[u8], sig: &[u8]) -> bool {
        let Ok((kind, point)) = kind(&self.spki) else {
            return false;
        };
        let alg: &'static dyn VerificationAlgorithm = match kind {
            Kind::P256 => &signature::ECDSA_P256_SHA256_ASN1,
            Kind::P384 => &signature::ECDSA_P384_SHA384_ASN1,
            Kind::Ed25519 => &signature::ED25519,
        };
        UnparsedPublicKey::new(alg, point)
            .verify(message, sig)
            .is_ok()
    }
}

/// The hash an ECDSA signature was made over (a CMS signer says which, apart from its curve).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EcdsaHash {
    Sha256,
    Sha384,
}

impl PublicKey {
    /// Whether `sig` (ASN.1 DER) is this ECDSA key's signature over `message` hashed with
    /// `hash`, on P-256 or P-384 (a timestamp authority's). Other keys: false.
    pub fn verifies_ecdsa(&self, message: &[u8], sig: &[u8], hash: EcdsaHash) -> bool {
        let Ok((kind, point)) = kind(&self.spki) else {
            return false;
        };
        let alg: &'static dyn VerificationAlgorithm = match (kind, hash) {
            (Kind::P256, EcdsaHash::Sha256) => &signature::ECDSA_P256_SHA256_ASN1,
            (Kind::P256, EcdsaHash::Sha384) => &signature::ECDSA_P256_SHA384_ASN1,
            (Kind::P384, EcdsaHash::Sha256) => &signature::ECDSA_P384_SHA256_ASN1,
            (Kind::P384, EcdsaHash::Sha384) => &signature::ECDSA_P384_SHA384_ASN1,
            (Kind::Ed25519, _) => return false,
        };
        UnparsedPublicKey::new(alg, point)
            .verify(message, sig)
            .is_ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    P256,
    P384,
    Ed25519,
}

/// What kind of key, and its raw public key bytes (the end of the DER).
fn kind(spki: &[u8]) -> Result<(Kind, &[u8]), String> {
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
    let kind = match (alg.as_str(), curve.as_deref()) {
        (EC_PUBLIC_KEY, Some(P256)) => Kind::P256,
        (EC_PUBLIC_KEY, Some(P384)) => Kind::P384,
        (ED25519, _) => Kind::Ed25519,
        (a, c) => {
            return Err(format!(
                "an unsupported key (algorithm {a}, curve {}): use ECDSA P-256 or P-384, or Ed25519",
                c.unwrap_or("-")
            ));
        }
    };
    // the key is the last field of the DER: a slice of the caller's bytes
    let start = spki.len().saturating_sub(key.len());
    Ok((kind, &spki[start..]))
}
