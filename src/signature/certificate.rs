//! A signing certificate (Fulcio's, or a private CA playing it): its chain to a trusted
//! authority at the signed time with the code-signing key usage (rustls-webpki), and what it
//! says of its signer (x509-cert): the subject alternative name (the identity: a URI such as
//! a CI workflow, or an email) and the OIDC issuer that vouched for it (Fulcio's extension
//! 1.3.6.1.4.1.57264.1.8, or the older 1.3.6.1.4.1.57264.1.1).

use rustls_pki_types::{CertificateDer, UnixTime};
use x509_cert::Certificate;
use x509_cert::der::asn1::Utf8StringRef;
use x509_cert::der::{Decode, Encode};
use x509_cert::ext::pkix::SubjectAltName;
use x509_cert::ext::pkix::name::GeneralName;

use super::trusted_root::{CertificateAuthority, TrustedRoot, shown_time};

/// id-kp-codeSigning (1.3.6.1.5.5.7.3.3), DER content octets.
const CODE_SIGNING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// id-kp-timeStamping (1.3.6.1.5.5.7.3.8), DER content octets.
const TIME_STAMPING: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x08];

/// Fulcio's OIDC issuer extensions: v2 (a DER UTF8String) and v1 (the raw string).
const ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
const ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";

/// What a certificate says of its signer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signer {
    /// Its subject alternative name: a URI or an email.
    pub identity: String,
    /// The OIDC issuer that vouched for it (empty when the certificate names none).
    pub issuer: String,
    pub not_before: i64,
    pub not_after: i64,
}

/// Read a leaf's signer; `Err` says what is missing.
pub fn signer(der: &[u8]) -> Result<Signer, String> {
    let cert = Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let tbs = &cert.tbs_certificate;
    let mut identity = None;
    let mut issuer = String::new();
    for ext in tbs.extensions.iter().flatten() {
        let oid = ext.extn_id.to_string();
        let value = ext.extn_value.as_bytes();
        if ext.extn_id == x509_cert::ext::pkix::ID_CE_SUBJECT_ALT_NAME {
            let san = SubjectAltName::from_der(value)
                .map_err(|e| format!("bad subject alternative name: {e}"))?;
            identity = san.0.iter().find_map(|n| match n {
                GeneralName::UniformResourceIdentifier(s) => Some(s.to_string()),
                GeneralName::Rfc822Name(s) => Some(s.to_string()),
                _ => None,
            });
        } else if oid == ISSUER_V2 {
            issuer = Utf8StringRef::from_der(value)
                .map(|s| s.as_str().to_string())
                .map_err(|e| format!("bad issuer extension {ISSUER_V2}: {e}"))?;
        } else if oid == ISSUER_V1 && issuer.is_empty() {
            issuer = String::from_utf8_lossy(value).into_owned();
        }
    }
    let identity = identity
        .ok_or("no URI or email in its subject alternative name: not a signing certificate")?;
    let secs = |t: x509_cert::time::Time| {
        i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
    };
    Ok(Signer {
        identity: crate::text::clip(&identity, 512),
        issuer: crate::text::clip(&issuer, 512),
        not_before: secs(tbs.validity.not_before),
        not_after: secs(tbs.validity.not_after),
    })
}

/// Why a chain was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainError {
    /// Outside its validity at `at`.
    Expired { at: i64 },
    /// Anything else, said for a person.
    Untrusted(String),
}

/// Check that `leaf` chains, at time `at` (Unix seconds), to an authority of `root` valid
/// then, through that authority's chain and `extra` (intermediates the material carries),
/// with the code-signing key usage.
pub fn verify_chain(
    leaf: &[u8],
    extra: &[Vec<u8>],
    root: &TrustedRoot,
    at: i64,
) -> Result<(), ChainError> {
    chain_to(leaf, extra, &root.authorities, at, Usage::CodeSigning)
}

/// The extended key usage a chain is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// id-kp-codeSigning: a signing certificate (Fulcio's).
    CodeSigning,
    /// id-kp-timeStamping: a timestamp authority's certificate.
    TimeStamping,
}

impl Usage {
    fn oid(self) -> &'static [u8] {
        match self {
            Usage::CodeSigning => CODE_SIGNING,
            Usage::TimeStamping => TIME_STAMPING,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Usage::CodeSigning => "code signing (no id-kp-codeSigning",
            Usage::TimeStamping => "time-stamping (no id-kp-timeStamping",
        }
    }
}

/// Check that `leaf` chains, at time `at`, to one of `authorities` valid then, through its
/// chain and `extra`, with the extended key usage `usage`.
pub fn chain_to(
    leaf: &[u8],
    extra: &[Vec<u8>],
    authorities: &[CertificateAuthority],
    at: i64,
    usage: Usage,
) -> Result<(), ChainError> {
    let leaf_der = CertificateDer::from(leaf);
    let ee = webpki::EndEntityCert::try_from(&leaf_der)
        .map_err(|e| ChainError::Untrusted(format!("cannot read the certificate: {e}")))?;
    let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        u64::try_from(at).unwrap_or(0),
    ));
    let kind = match usage {
        Usage::CodeSigning => "certificate authority",
        Usage::TimeStamping => "timestamp authority",
    };
    let mut last = format!(
        "no {kind} of the trusted root is valid at {}",
        shown_time(at)
    );
    for ca in authorities.iter().filter(|a| a.valid_for.contains(at)) {
        let Some((anchor_der, inter)) = ca.chain.split_last() else {
            continue;
        };
        let anchor_der = CertificateDer::from(anchor_der.as_slice());
        let Ok(anchor) = webpki::anchor_from_trusted_cert(&anchor_der) else {
            last = format!(
                "the authority {} has an unreadable root certificate",
                ca.uri
            );
            continue;
        };
        let intermediates: Vec<CertificateDer<'_>> = inter
            .iter()
            .chain(extra)
            .map(|c| CertificateDer::from(c.as_slice()))
            .collect();
        match ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &[anchor],
            &intermediates,
            time,
            webpki::KeyUsage::required(usage.oid()),
            None,
            None,
        ) {
            Ok(_) => return Ok(()),
            Err(webpki::Error::CertExpired { .. } | webpki::Error::CertNotValidYet { .. }) => {
                return Err(ChainError::Expired { at });
            }
            Err(e) => last = describe(&e, &ca.uri, usage),
        }
    }
    Err(ChainError::Untrusted(last))
}

fn describe(e: &webpki::Error, ca: &str, usage: Usage) -> String {
    match e {
        webpki::Error::UnknownIssuer => format!("it is not issued by {ca} (unknown issuer)"),
        webpki::Error::RequiredEkuNotFoundContext(_) => {
            format!("it is not for {} extended key usage)", usage.name())
        }
        other => format!("{other:?} (against {ca})"),
    }
}

/// The certificate's public key (DER SubjectPublicKeyInfo).
pub fn public_key(der: &[u8]) -> Result<Vec<u8>, String> {
    let cert = Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    cert.tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| format!("cannot encode its public key: {e}"))
}

/// A certificate from PEM text (`-----BEGIN CERTIFICATE-----`), or from base64 of such PEM
/// (cosign writes its `.pem` that way), as DER.
pub fn from_pem(text: &[u8]) -> Result<Vec<u8>, String> {
    let text = String::from_utf8_lossy(text);
    let pem_text = if text.contains("-----BEGIN") {
        text.into_owned()
    } else {
        use base64::Engine;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| format!("neither PEM nor base64 of PEM: {e}"))?;
        String::from_utf8(bytes).map_err(|_| "base64 of something else than PEM".to_string())?
    };
    let block = pem::parse(pem_text.trim()).map_err(|e| format!("bad PEM: {e}"))?;
    if block.tag() != "CERTIFICATE" {
        return Err(format!("a PEM {:?} block, not a CERTIFICATE", block.tag()));
    }
    Ok(block.into_contents())
}
