//! The trusted root: the certificate authorities that issue signing certificates (Fulcio),
//! the transparency logs whose signed entries give a signature its time (Rekor), and the
//! timestamp authorities whose RFC 3161 tokens give it a time too, each with the period it
//! may be trusted for. Read from Sigstore's `trusted_root.json` format
//! (`application/vnd.dev.sigstore.trustedroot+json;version=0.1`), as the public-good
//! instance publishes it and as a private instance or an air-gapped copy is written.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::SignatureError;

/// Sigstore's public-good trusted root, shipped with the agent (`trusted-root/`).
pub const PUBLIC_GOOD: &str = include_str!("../../trusted-root/sigstore-public-good.json");

/// A period of trust: from `start`, until `end` when it has one (Unix seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub start: i64,
    pub end: Option<i64>,
}

impl Validity {
    pub fn contains(&self, t: i64) -> bool {
        t >= self.start && self.end.is_none_or(|end| t <= end)
    }
}

/// A certificate authority, or a timestamp authority: its chain (DER), the issuing (or
/// time-stamping) certificate first, the root last.
#[derive(Debug, Clone)]
pub struct CertificateAuthority {
    pub uri: String,
    pub chain: Vec<Vec<u8>>,
    pub valid_for: Validity,
}

/// A transparency log: its public key (DER SubjectPublicKeyInfo) and key id (SHA-256 of it).
#[derive(Debug, Clone)]
pub struct TransparencyLog {
    pub base_url: String,
    pub key_id: Vec<u8>,
    pub spki: Vec<u8>,
    pub valid_for: Validity,
}

#[derive(Debug, Clone)]
pub struct TrustedRoot {
    pub authorities: Vec<CertificateAuthority>,
    pub logs: Vec<TransparencyLog>,
    /// Timestamp authorities (RFC 3161): the time-stamping certificate first, the root last.
    pub timestamp_authorities: Vec<CertificateAuthority>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootDoc {
    media_type: String,
    #[serde(default)]
    tlogs: Vec<TlogDoc>,
    #[serde(default)]
    certificate_authorities: Vec<CaDoc>,
    #[serde(default)]
    timestamp_authorities: Vec<CaDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TlogDoc {
    #[serde(default)]
    base_url: String,
    public_key: KeyDoc,
    log_id: LogIdDoc,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct KeyDoc {
    raw_bytes: String,
    #[serde(default)]
    valid_for: Option<ValidityDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogIdDoc {
    key_id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CaDoc {
    #[serde(default)]
    uri: String,
    cert_chain: ChainDoc,
    valid_for: ValidityDoc,
}

#[derive(Deserialize)]
struct ChainDoc {
    certificates: Vec<RawDoc>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawDoc {
    raw_bytes: String,
}

#[derive(Deserialize)]
struct ValidityDoc {
    start: String,
    #[serde(default)]
    end: Option<String>,
}

const MEDIA_TYPE: &str = "application/vnd.dev.sigstore.trustedroot+json;version=0.1";

impl TrustedRoot {
    /// The shipped public-good root.
    pub fn public_good() -> Result<TrustedRoot, SignatureError> {
        TrustedRoot::from_json(PUBLIC_GOOD, "the shipped Sigstore public-good root")
    }

    /// Read a root; `source_name` (its path) names it in errors.
    pub fn from_json(text: &str, source_name: &str) -> Result<TrustedRoot, SignatureError> {
        let bad = |detail: String| SignatureError::TrustedRoot {
            source_name: source_name.to_string(),
            detail,
        };
        let doc: RootDoc =
            serde_json::from_str(text).map_err(|e| bad(format!("not a trusted root: {e}")))?;
        if doc.media_type != MEDIA_TYPE {
            return Err(bad(format!(
                "mediaType {:?}, expected {MEDIA_TYPE:?}",
                crate::text::clip(&doc.media_type, 128)
            )));
        }
        let authorities =
            read_authorities(doc.certificate_authorities, "certificateAuthorities").map_err(bad)?;
        let timestamp_authorities =
            read_authorities(doc.timestamp_authorities, "timestampAuthorities").map_err(bad)?;
        let mut logs = Vec::new();
        for (i, t) in doc.tlogs.into_iter().enumerate() {
            let spki = b64(&t.public_key.raw_bytes).map_err(|e| bad(format!("tlogs[{i}]: {e}")))?;
            let key_id = b64(&t.log_id.key_id).map_err(|e| bad(format!("tlogs[{i}]: {e}")))?;
            let valid_for = match &t.public_key.valid_for {
                Some(v) => validity(v).map_err(|e| bad(format!("tlogs[{i}].validFor: {e}")))?,
                None => Validity {
                    start: i64::MIN,
                    end: None,
                },
            };
            logs.push(TransparencyLog {
                base_url: t.base_url,
                key_id,
                spki,
                valid_for,
            });
        }
        if authorities.is_empty() && logs.is_empty() {
            return Err(bad("it names no certificate authority and no log".into()));
        }
        Ok(TrustedRoot {
            authorities,
            logs,
            timestamp_authorities,
        })
    }

    /// The log with this key id (SHA-256 of its key), if the root trusts one.
    pub fn log(&self, key_id: &[u8]) -> Option<&TransparencyLog> {
        self.logs.iter().find(|l| l.key_id == key_id)
    }
}

/// The authorities of a `certificateAuthorities` or `timestampAuthorities` list (`field`).
fn read_authorities(docs: Vec<CaDoc>, field: &str) -> Result<Vec<CertificateAuthority>, String> {
    let mut authorities = Vec::new();
    for (i, ca) in docs.into_iter().enumerate() {
        let chain = ca
            .cert_chain
            .certificates
            .iter()
            .map(|c| b64(&c.raw_bytes))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{field}[{i}]: {e}"))?;
        if chain.is_empty() {
            return Err(format!("{field}[{i}] has no certificate"));
        }
        let valid_for =
            validity(&ca.valid_for).map_err(|e| format!("{field}[{i}].validFor: {e}"))?;
        authorities.push(CertificateAuthority {
            uri: ca.uri,
            chain,
            valid_for,
        });
    }
    Ok(authorities)
}

/// SHA-256 of a public key's DER: a log's key id, a key's fingerprint.
pub fn key_id(spki: &[u8]) -> Vec<u8> {
    Sha256::digest(spki).to_vec()
}

fn b64(s: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(s.trim())
        .map_err(|e| format!("bad base64: {e}"))
}

fn validity(v: &ValidityDoc) -> Result<Validity, String> {
    Ok(Validity {
        start: rfc3339(&v.start)?,
        end: v.end.as_deref().map(rfc3339).transpose()?,
    })
}

/// Unix seconds of an RFC 3339 time.
pub(crate) fn rfc3339(s: &str) -> Result<i64, String> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .map(|t| t.as_second())
        .map_err(|e| format!("bad time {:?}: {e}", crate::text::clip(s, 64)))
}

/// An RFC 3339 time for a person, from Unix seconds.
pub(crate) fn shown_time(t: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(t)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_public_good_root_reads_with_its_fulcio_and_rekor() {
        let root = TrustedRoot::public_good().unwrap();
        assert!(
            root.authorities
                .iter()
                .any(|a| a.uri == "https://fulcio.sigstore.dev" && a.chain.len() == 2)
        );
        let rekor = root
            .logs
            .iter()
            .find(|l| l.base_url == "https://rekor.sigstore.dev")
            .unwrap();
        // a log's id is the SHA-256 of its key
        assert_eq!(rekor.key_id, key_id(&rekor.spki));
        assert!(root.log(&rekor.key_id).is_some());
    }

    #[test]
    fn a_broken_root_says_what_is_wrong_and_where() {
        for (text, says) in [
            ("[]", "not a trusted root"),
            (r#"{"mediaType":"x"}"#, "mediaType \"x\""),
            (
                r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1"}"#,
                "no certificate authority and no log",
            ),
            (
                r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1","certificateAuthorities":[{"certChain":{"certificates":[{"rawBytes":"!!"}]},"validFor":{"start":"2021-01-01T00:00:00Z"}}]}"#,
                "certificateAuthorities[0]: bad base64",
            ),
            (
                r#"{"mediaType":"application/vnd.dev.sigstore.trustedroot+json;version=0.1","certificateAuthorities":[{"certChain":{"certificates":[{"rawBytes":"AA=="}]},"validFor":{"start":"yesterday"}}]}"#,
                "certificateAuthorities[0].validFor: bad time",
            ),
        ] {
            let e = TrustedRoot::from_json(text, "/etc/root.json").unwrap_err();
            assert_eq!(e.reason(), "TrustedRootInvalid");
            let said = e.to_string();
            assert!(
                said.contains("/etc/root.json") && said.contains(says),
                "{said}"
            );
        }
    }
}
