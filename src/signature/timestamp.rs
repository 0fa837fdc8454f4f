//! RFC 3161 timestamps: a timestamp authority's signed token (a CMS SignedData holding a
//! TSTInfo) that it saw a signature at its `genTime`, as a Sigstore bundle carries them in
//! `verificationMaterial.timestampVerificationData.rfc3161Timestamps`. Checked as the
//! Sigstore clients do (sigstore-go's `VerifyTimestampAuthority`, sigstore-python's
//! `_verify_timestamp_authority`):
//!
//! - the token's message imprint is the hash (the algorithm it names) of the signature bytes;
//! - its one signer's signed attributes say the content is a TSTInfo and carry the hash of
//!   that TSTInfo, and their ECDSA signature (P-256 or P-384) verifies with the key of a
//!   certificate the token embeds or, when it embeds none, of a timestamp authority the
//!   trusted root names;
//! - that certificate chains, at `genTime`, to a timestamp authority of the root valid then,
//!   with the time-stamping extended key usage, and was valid then.
//!
//! The token is untrusted input: every failure is an error that says what was wrong.

use cms::cert::CertificateChoices;
use cms::content_info::ContentInfo;
use cms::signed_data::{SignedData, SignerIdentifier};
use der::asn1::{GeneralizedTime, Int, ObjectIdentifier, OctetString};
use der::{Decode, Encode, Sequence};
use sha2::{Digest, Sha256, Sha384, Sha512};
use x509_cert::ext::Extensions;
use x509_cert::ext::pkix::name::GeneralName;
use x509_cert::spki::AlgorithmIdentifierOwned;

use super::certificate::{self, ChainError, Usage};
use super::keys::{EcdsaHash, PublicKey};
use super::trusted_root::{TrustedRoot, shown_time};

const ID_SIGNED_DATA: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.7.2");
const ID_CT_TST_INFO: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.16.1.4");
const ID_CONTENT_TYPE: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.3");
const ID_MESSAGE_DIGEST: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.9.4");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");
const ID_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.2");
const ID_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.3");
const ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const ECDSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");

/// RFC 3161 §2.4.2 `TimeStampResp`, what a Sigstore bundle's `signedTimestamp` holds.
#[derive(Clone, Debug, Eq, PartialEq, Sequence)]
pub struct TimeStampResp {
    pub status: PkiStatusInfo,
    #[asn1(optional = "true")]
    pub time_stamp_token: Option<ContentInfo>,
}

/// RFC 4210 `PKIStatusInfo`: 0 is granted.
#[derive(Clone, Debug, Eq, PartialEq, Sequence)]
pub struct PkiStatusInfo {
    pub status: u8,
    #[asn1(optional = "true")]
    pub status_string: Option<Vec<String>>,
    #[asn1(optional = "true")]
    pub fail_info: Option<der::asn1::BitString>,
}

/// RFC 3161 §2.4.2 `TSTInfo`.
#[derive(Clone, Debug, Eq, PartialEq, Sequence)]
pub struct TstInfo {
    pub version: u8,
    pub policy: ObjectIdentifier,
    pub message_imprint: MessageImprint,
    pub serial_number: Int,
    pub gen_time: GeneralizedTime,
    #[asn1(optional = "true")]
    pub accuracy: Option<Accuracy>,
    #[asn1(default = "Default::default")]
    pub ordering: bool,
    #[asn1(optional = "true")]
    pub nonce: Option<Int>,
    #[asn1(context_specific = "0", tag_mode = "EXPLICIT", optional = "true")]
    pub tsa: Option<GeneralName>,
    #[asn1(context_specific = "1", tag_mode = "IMPLICIT", optional = "true")]
    pub extensions: Option<Extensions>,
}

/// RFC 3161 `MessageImprint`: the hash of what was stamped.
#[derive(Clone, Debug, Eq, PartialEq, Sequence)]
pub struct MessageImprint {
    pub hash_algorithm: AlgorithmIdentifierOwned,
    pub hashed_message: OctetString,
}

/// RFC 3161 `Accuracy`.
#[derive(Clone, Debug, Eq, PartialEq, Sequence)]
pub struct Accuracy {
    #[asn1(optional = "true")]
    pub seconds: Option<u64>,
    #[asn1(context_specific = "0", tag_mode = "IMPLICIT", optional = "true")]
    pub millis: Option<u16>,
    #[asn1(context_specific = "1", tag_mode = "IMPLICIT", optional = "true")]
    pub micros: Option<u16>,
}

/// Check the token (DER) over `signature` against the timestamp authorities of `root`.
/// Its `genTime` (Unix seconds).
pub fn verify(token: &[u8], signature: &[u8], root: &TrustedRoot) -> Result<i64, String> {
    let (sd, tst_der, tst) = read(token)?;
    let imprint = &tst.message_imprint;
    if hash(&imprint.hash_algorithm, signature)? != imprint.hashed_message.as_bytes() {
        return Err(
            "it stamps another signature (its message imprint is not the hash of this signature)"
                .into(),
        );
    }
    let gen_time = i64::try_from(tst.gen_time.to_unix_duration().as_secs())
        .map_err(|_| "its genTime is out of range".to_string())?;
    let Signer {
        sid,
        signed_attrs,
        sig,
        sig_hash,
    } = signer(&sd, &tst_der)?;
    if root.timestamp_authorities.is_empty() {
        return Err("the trusted root names no timestamp authority".into());
    }
    let embedded: Vec<Vec<u8>> = sd
        .certificates
        .iter()
        .flat_map(|set| set.0.iter())
        .filter_map(|c| match c {
            CertificateChoices::Certificate(c) => c.to_der().ok(),
            CertificateChoices::Other(_) => None,
        })
        .collect();
    // the certificates it embeds, or without any, those of the root's authorities
    let candidates: Vec<&Vec<u8>> = match embedded.is_empty() {
        false => embedded.iter().collect(),
        true => root
            .timestamp_authorities
            .iter()
            .filter_map(|a| a.chain.first())
            .collect(),
    };
    let leaf = candidates
        .into_iter()
        .filter(|der| names_signer(der, &sid))
        .find(|der| {
            certificate::public_key(der)
                .and_then(|spki| PublicKey::from_spki(&spki))
                .is_ok_and(|k| k.verifies_ecdsa(&signed_attrs, &sig, sig_hash))
        })
        .ok_or("its signature verifies with no certificate it carries nor any timestamp authority of the trusted root")?;
    certificate::chain_to(
        leaf,
        &embedded,
        &root.timestamp_authorities,
        gen_time,
        Usage::TimeStamping,
    )
    .map_err(|e| match e {
        ChainError::Expired { at } => format!(
            "the timestamp authority's certificate was not valid at its genTime {}",
            shown_time(at)
        ),
        ChainError::Untrusted(detail) => format!(
            "its certificate does not chain to a timestamp authority of the trusted root at its genTime {}: {detail}",
            shown_time(gen_time)
        ),
    })?;
    Ok(gen_time)
}

/// The token's SignedData, its TSTInfo's DER (the eContent) and the TSTInfo.
fn read(token: &[u8]) -> Result<(SignedData, Vec<u8>, TstInfo), String> {
    // a TimeStampResp (the status, then the token), or the bare token
    let ci = match TimeStampResp::from_der(token) {
        Ok(TimeStampResp {
            status,
            time_stamp_token,
        }) => {
            if status.status != 0 {
                return Err(format!("its status is {}, not granted (0)", status.status));
            }
            time_stamp_token.ok_or("a response with no token")?
        }
        Err(_) => ContentInfo::from_der(token)
            .map_err(|e| format!("neither a TimeStampResp nor a CMS ContentInfo: {e}"))?,
    };
    if ci.content_type != ID_SIGNED_DATA {
        return Err(format!("a CMS {} content, not SignedData", ci.content_type));
    }
    let sd: SignedData = ci
        .content
        .decode_as()
        .map_err(|e| format!("not a CMS SignedData: {e}"))?;
    let encap = &sd.encap_content_info;
    if encap.econtent_type != ID_CT_TST_INFO {
        return Err(format!(
            "it signs a {} content, not a TSTInfo",
            encap.econtent_type
        ));
    }
    let tst_der = encap
        .econtent
        .as_ref()
        .ok_or("it holds no TSTInfo")?
        .decode_as::<OctetString>()
        .map_err(|e| format!("its eContent: {e}"))?
        .into_bytes();
    let tst = TstInfo::from_der(&tst_der).map_err(|e| format!("not a TSTInfo: {e}"))?;
    if tst.version != 1 {
        return Err(format!("TSTInfo version {}, expected 1", tst.version));
    }
    Ok((sd, tst_der, tst))
}

/// The token's one signer, once its signed attributes name a TSTInfo and carry its hash.
struct Signer {
    /// Which certificate it names.
    sid: SignerIdentifier,
    /// Its signed attributes (DER): what it signed.
    signed_attrs: Vec<u8>,
    sig: Vec<u8>,
    /// The hash its signature was made over.
    sig_hash: EcdsaHash,
}

fn signer(sd: &SignedData, tst_der: &[u8]) -> Result<Signer, String> {
    let [si] = sd.signer_infos.0.as_slice() else {
        return Err(format!(
            "it has {} signers, expected one",
            sd.signer_infos.0.len()
        ));
    };
    let attrs = si
        .signed_attrs
        .as_ref()
        .ok_or("its signer has no signed attributes")?;
    let value = |oid: ObjectIdentifier| {
        attrs
            .iter()
            .find(|a| a.oid == oid)
            .and_then(|a| a.values.get(0))
            .ok_or_else(|| format!("its signed attributes have no {oid}"))
    };
    let content_type: ObjectIdentifier = value(ID_CONTENT_TYPE)?
        .decode_as()
        .map_err(|e| format!("its content-type attribute: {e}"))?;
    if content_type != ID_CT_TST_INFO {
        return Err("its signed content-type attribute is not TSTInfo".into());
    }
    let digest: OctetString = value(ID_MESSAGE_DIGEST)?
        .decode_as()
        .map_err(|e| format!("its message-digest attribute: {e}"))?;
    if hash(&si.digest_alg, tst_der)? != digest.as_bytes() {
        return Err("its signed message digest is not the hash of its TSTInfo (tampered)".into());
    }
    let sig_hash = match si.signature_algorithm.oid {
        ECDSA_SHA256 => EcdsaHash::Sha256,
        ECDSA_SHA384 => EcdsaHash::Sha384,
        other => {
            return Err(format!(
                "its signature algorithm {other} is not supported (ECDSA with SHA-256 or SHA-384)"
            ));
        }
    };
    let signed = attrs
        .to_der()
        .map_err(|e| format!("its signed attributes: {e}"))?;
    Ok(Signer {
        sid: si.sid.clone(),
        signed_attrs: signed,
        sig: si.signature.as_bytes().to_vec(),
        sig_hash,
    })
}

/// Whether the certificate `der` is the one the signer identifier names (by issuer and
/// serial number; a subject key identifier is left to the signature check).
fn names_signer(der: &[u8], sid: &SignerIdentifier) -> bool {
    match sid {
        SignerIdentifier::IssuerAndSerialNumber(id) => x509_cert::Certificate::from_der(der)
            .is_ok_and(|c| {
                c.tbs_certificate.issuer == id.issuer
                    && c.tbs_certificate.serial_number == id.serial_number
            }),
        SignerIdentifier::SubjectKeyIdentifier(_) => true,
    }
}

/// `data` hashed with the algorithm `alg` names (SHA-256, SHA-384 or SHA-512).
fn hash(alg: &AlgorithmIdentifierOwned, data: &[u8]) -> Result<Vec<u8>, String> {
    Ok(match alg.oid {
        ID_SHA256 => Sha256::digest(data).to_vec(),
        ID_SHA384 => Sha384::digest(data).to_vec(),
        ID_SHA512 => Sha512::digest(data).to_vec(),
        other => return Err(format!("hash algorithm {other} is not supported")),
    })
}
