//! Sigstore parts made in the test, nothing from the network: a private CA playing Fulcio
//! (a root and an intermediate; leaves with the signer's identity in the subject alternative
//! name, Fulcio's issuer extension, the code-signing key usage, a ten-minute validity), a
//! log playing Rekor ([`Rekor`], tests/support/sigstore_rekor.rs: its key signs entries'
//! timestamps, as Rekor's SET, and the checkpoints of its inclusion proofs), a timestamp
//! authority ([`Tsa`], tests/support/sigstore_tsa.rs: real RFC 3161 responses), and the files
//! publishers ship: `.sig`/`.pem`, cosign bundles, Sigstore bundles, a trusted root.
//!
//! For the Sigstore project's own client (tests/pure/signature_python.rs), which needs more
//! than the agent checks: a CT log playing Fulcio's (its key signs the SCT embedded in a
//! leaf, [`Fulcio::signer_with_sct`]), a trusted root naming the CT log, and the client
//! trust config that wraps that root.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{
    BasicConstraints, CertificateParams, CustomExtension, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType, SigningKey,
};
use sha2::{Digest, Sha256};
use shim_agent::signature::{LogEntry, key_id};

pub use super::sigstore_rekor::Rekor;
pub use super::sigstore_tsa::{Tsa, rfc3339};

/// The GitHub Actions issuer runwasi's certificates carry.
pub const GITHUB_ISSUER: &str = "https://token.actions.githubusercontent.com";
/// runwasi's release identity.
pub const RUNWASI_IDENTITY: &str =
    "https://github.com/containerd/runwasi/.github/workflows/action-build.yml@refs/heads/main";

/// A policy that trusts runwasi's release identity from GitHub Actions.
pub fn runwasi_trust() -> shim_agent::signature::Trust {
    use shim_agent::signature::{Subject, Trust, TrustedIdentity};
    Trust {
        identities: vec![TrustedIdentity {
            subject: Subject::Exact(RUNWASI_IDENTITY.into()),
            issuer: GITHUB_ISSUER.into(),
        }],
        ..Trust::default()
    }
}

/// 2026-01-01T00:00:00Z: when the tests' signatures are made.
pub const SIGNED_AT: i64 = 1_767_225_600;

fn time(t: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::from_unix_timestamp(t).expect("a time")
}

/// A certificate authority: a root and an intermediate, valid 2020 to 2040.
pub struct Fulcio {
    pub root_der: Vec<u8>,
    pub intermediate_der: Vec<u8>,
    intermediate: CertificateParams,
    intermediate_key: KeyPair,
}

fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::CodeSigning];
    p.not_before = time(1_577_836_800);
    p.not_after = time(2_208_988_800);
    p
}

/// A leaf's options.
pub struct Leaf<'a> {
    pub identity: &'a str,
    pub issuer: &'a str,
    pub not_before: i64,
    pub not_after: i64,
    pub code_signing: bool,
    /// An email identity instead of a URI.
    pub email: bool,
}

impl<'a> Leaf<'a> {
    /// runwasi's identity and issuer, valid ten minutes around [`SIGNED_AT`].
    pub fn runwasi() -> Leaf<'static> {
        Leaf::of(RUNWASI_IDENTITY, GITHUB_ISSUER)
    }

    pub fn of(identity: &'a str, issuer: &'a str) -> Leaf<'a> {
        Leaf {
            identity,
            issuer,
            not_before: SIGNED_AT - 60,
            not_after: SIGNED_AT + 540,
            code_signing: true,
            email: false,
        }
    }
}

/// A signer: its key and its certificate.
pub struct Signer {
    pub key: KeyPair,
    pub cert_der: Vec<u8>,
}

impl Signer {
    /// Its ECDSA P-256 signature over `data` (ASN.1 DER, as cosign makes it).
    pub fn sign(&self, data: &[u8]) -> Vec<u8> {
        self.key.sign(data).expect("sign")
    }
}

impl Fulcio {
    pub fn new(name: &str) -> Fulcio {
        let root_key = KeyPair::generate().expect("key");
        let root = ca_params(&format!("{name} root"));
        let root_der = root.self_signed(&root_key).expect("root").der().to_vec();
        let intermediate_key = KeyPair::generate().expect("key");
        let mut intermediate = ca_params(&format!("{name} intermediate"));
        // RFC 5280 §4.2.1.1, required by the Python client's chain check (cryptography's)
        intermediate.use_authority_key_identifier_extension = true;
        let issuer = Issuer::from_params(&root, &root_key);
        let intermediate_der = intermediate
            .signed_by(&intermediate_key, &issuer)
            .expect("intermediate")
            .der()
            .to_vec();
        Fulcio {
            root_der,
            intermediate_der,
            intermediate,
            intermediate_key,
        }
    }

    /// A signing certificate for `leaf`, with a fresh key.
    pub fn signer(&self, leaf: &Leaf<'_>) -> Signer {
        let key = KeyPair::generate().expect("key");
        let cert_der = self.issue(&leaf_params(leaf), &key);
        Signer { key, cert_der }
    }

    /// A signing certificate for `leaf`, with a fresh key, carrying the SCT `ct` gave for
    /// it at the leaf's start (RFC 6962 §3.3, as Fulcio's certificates do). The SCT signs
    /// the precertificate: this certificate's TBS without the SCT extension, which is what
    /// rcgen writes for the same parameters and key without it (its serial number comes
    /// from the key, and custom extensions come last).
    pub fn signer_with_sct(&self, leaf: &Leaf<'_>, ct: &CtLog) -> Signer {
        let key = KeyPair::generate().expect("key");
        let mut p = leaf_params(leaf);
        let precert = self.issue(&p, &key);
        let issuer_key_id = key_id(&rcgen::PublicKeyData::subject_public_key_info(
            &self.intermediate_key,
        ));
        let sct = ct.sct(&issuer_key_id, tbs_of(&precert), leaf.not_before * 1000);
        // the SignedCertificateTimestampList, as a DER OCTET STRING in the extension's value
        let mut list = u16_len(sct.len() + 2);
        list.extend(u16_len(sct.len()));
        list.extend(sct);
        p.custom_extensions.push(CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 11129, 2, 4, 2],
            der_octet_string(&list),
        ));
        let cert_der = self.issue(&p, &key);
        Signer { key, cert_der }
    }

    fn issue(&self, p: &CertificateParams, key: &KeyPair) -> Vec<u8> {
        let issuer = Issuer::from_params(&self.intermediate, &self.intermediate_key);
        p.signed_by(key, &issuer).expect("leaf").der().to_vec()
    }

    /// The chain a trusted root lists: intermediate first, root last.
    pub fn chain(&self) -> Vec<Vec<u8>> {
        vec![self.intermediate_der.clone(), self.root_der.clone()]
    }
}

/// A leaf's parameters: the identity in the subject alternative name, Fulcio's issuer
/// extensions (v1 and v2), the key usages.
fn leaf_params(leaf: &Leaf<'_>) -> CertificateParams {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    let name = leaf.identity.to_string().try_into().expect("ia5");
    p.subject_alt_names = vec![if leaf.email {
        SanType::Rfc822Name(name)
    } else {
        SanType::URI(name)
    }];
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = if leaf.code_signing {
        vec![ExtendedKeyUsagePurpose::CodeSigning]
    } else {
        vec![ExtendedKeyUsagePurpose::ServerAuth]
    };
    p.not_before = time(leaf.not_before);
    p.not_after = time(leaf.not_after);
    // Fulcio's issuer (v2): a DER UTF8String
    let mut utf8 = vec![0x0c, u8::try_from(leaf.issuer.len()).expect("short issuer")];
    utf8.extend_from_slice(leaf.issuer.as_bytes());
    p.custom_extensions = vec![
        CustomExtension::from_oid_content(&[1, 3, 6, 1, 4, 1, 57264, 1, 8], utf8),
        CustomExtension::from_oid_content(
            &[1, 3, 6, 1, 4, 1, 57264, 1, 1],
            leaf.issuer.as_bytes().to_vec(),
        ),
    ];
    p
}

/// The TBSCertificate of a certificate's DER: the first element of its outer SEQUENCE.
fn tbs_of(cert_der: &[u8]) -> &[u8] {
    let (outer, _) = der_header(cert_der);
    let rest = &cert_der[outer..];
    let (header, len) = der_header(rest);
    &rest[..header + len]
}

/// A DER element's header length and content length.
fn der_header(der: &[u8]) -> (usize, usize) {
    match der[1] {
        n if n < 0x80 => (2, usize::from(n)),
        n => {
            let k = usize::from(n & 0x7f);
            let len = der[2..2 + k]
                .iter()
                .fold(0, |acc, b| (acc << 8) | usize::from(*b));
            (2 + k, len)
        }
    }
}

fn der_octet_string(content: &[u8]) -> Vec<u8> {
    let mut out = vec![0x04];
    match content.len() {
        n if n < 0x80 => out.push(u8::try_from(n).expect("short")),
        n if n < 0x100 => out.extend([0x81, u8::try_from(n).expect("short")]),
        n => out.extend([0x82].into_iter().chain(u16_len(n))),
    }
    out.extend_from_slice(content);
    out
}

fn u16_len(n: usize) -> Vec<u8> {
    u16::try_from(n)
        .expect("under 64 KiB")
        .to_be_bytes()
        .to_vec()
}

/// A certificate transparency log: its key signs the SCTs embedded in leaves.
pub struct CtLog {
    key: KeyPair,
}

impl Default for CtLog {
    fn default() -> Self {
        CtLog::new()
    }
}

impl CtLog {
    pub fn new() -> CtLog {
        CtLog {
            key: KeyPair::generate().expect("key"),
        }
    }

    pub fn spki(&self) -> Vec<u8> {
        rcgen::PublicKeyData::subject_public_key_info(&self.key)
    }

    /// A v1 SCT (RFC 6962 §3.2) for a precertificate entry: `tbs` issued by the CA whose key
    /// id is `issuer_key_id`, at `at_ms` (Unix milliseconds).
    fn sct(&self, issuer_key_id: &[u8], tbs: &[u8], at_ms: i64) -> Vec<u8> {
        let at = u64::try_from(at_ms).expect("after 1970").to_be_bytes();
        let tbs_len = u32::try_from(tbs.len()).expect("short").to_be_bytes();
        // digitally-signed: version, signature type (certificate_timestamp), timestamp,
        // entry type (precert_entry), issuer key hash, the TBS (u24 length), no extensions
        let mut signed = vec![0, 0];
        signed.extend(at);
        signed.extend([0, 1]);
        signed.extend_from_slice(issuer_key_id);
        signed.extend_from_slice(&tbs_len[1..]);
        signed.extend_from_slice(tbs);
        signed.extend([0, 0]);
        let sig = self.key.sign(&signed).expect("sign");
        // the SCT: version, log id, timestamp, no extensions, SHA-256 with ECDSA, signature
        let mut sct = vec![0];
        sct.extend(key_id(&self.spki()));
        sct.extend(at);
        sct.extend([0, 0, 4, 3]);
        sct.extend(u16_len(sig.len()));
        sct.extend(sig);
        sct
    }
}

/// `bundle` (a Sigstore bundle of [`sigstore_bundle`]) with `proof` added to its log entry.
pub fn with_inclusion_proof(bundle: &str, proof: serde_json::Value) -> String {
    let mut b: serde_json::Value = serde_json::from_str(bundle).expect("a bundle");
    b["verificationMaterial"]["tlogEntries"][0]["inclusionProof"] = proof;
    b.to_string()
}

/// `bundle` with these RFC 3161 responses (DER) in its timestamp verification data.
pub fn with_timestamps(bundle: &str, responses: &[Vec<u8>]) -> String {
    let mut b: serde_json::Value = serde_json::from_str(bundle).expect("a bundle");
    b["verificationMaterial"]["timestampVerificationData"] = serde_json::json!({
        "rfc3161Timestamps": responses.iter().map(|r| serde_json::json!({"signedTimestamp": STANDARD.encode(r)})).collect::<Vec<_>>()
    });
    b.to_string()
}

/// Rekor's `hashedrekord` 0.0.1 body for a signature.
pub fn hashedrekord(file: &[u8], sig: &[u8], signer_der: &[u8], pem_tag: &str) -> String {
    let pem = pem_of(pem_tag, signer_der);
    serde_json::json!({
        "apiVersion": "0.0.1",
        "kind": "hashedrekord",
        "spec": {
            "data": {"hash": {"algorithm": "sha256", "value": hex::encode(Sha256::digest(file))}},
            "signature": {
                "content": STANDARD.encode(sig),
                "publicKey": {"content": STANDARD.encode(pem)}
            }
        }
    })
    .to_string()
}

/// PEM text of DER.
pub fn pem_of(tag: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).expect("ascii"))
        .collect();
    format!(
        "-----BEGIN {tag}-----\n{}\n-----END {tag}-----\n",
        lines.join("\n")
    )
}

/// A trusted root naming these authorities and logs, trusted from 2020 on.
pub fn trusted_root(cas: &[&Fulcio], logs: &[&Rekor]) -> String {
    trusted_root_with_ct(cas, logs, &[])
}

/// A trusted root naming these authorities, logs and CT logs, trusted from 2020 on.
pub fn trusted_root_with_ct(cas: &[&Fulcio], logs: &[&Rekor], cts: &[&CtLog]) -> String {
    trusted_root_with_tsa(cas, logs, cts, &[])
}

/// A trusted root naming these authorities, logs, CT logs and timestamp authorities, the
/// first three trusted from 2020 on, each timestamp authority for its `valid_for`.
pub fn trusted_root_with_tsa(
    cas: &[&Fulcio],
    logs: &[&Rekor],
    cts: &[&CtLog],
    tsas: &[&Tsa],
) -> String {
    let start = "2020-01-01T00:00:00Z";
    serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
        "tlogs": logs.iter().map(|l| serde_json::json!({
            "baseUrl": "https://rekor.test",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": STANDARD.encode(l.spki()), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": {"start": start}},
            "logId": {"keyId": STANDARD.encode(l.log_id())}
        })).collect::<Vec<_>>(),
        "certificateAuthorities": cas.iter().map(|c| serde_json::json!({
            "subject": {"organization": "shim-agent tests", "commonName": "fulcio.test"},
            "uri": "https://fulcio.test",
            "certChain": {"certificates": c.chain().iter().map(|d| serde_json::json!({"rawBytes": STANDARD.encode(d)})).collect::<Vec<_>>()},
            "validFor": {"start": start}
        })).collect::<Vec<_>>(),
        "ctlogs": cts.iter().map(|c| serde_json::json!({
            "baseUrl": "https://ctfe.test",
            "hashAlgorithm": "SHA2_256",
            "publicKey": {"rawBytes": STANDARD.encode(c.spki()), "keyDetails": "PKIX_ECDSA_P256_SHA_256", "validFor": {"start": start}},
            "logId": {"keyId": STANDARD.encode(key_id(&c.spki()))}
        })).collect::<Vec<_>>(),
        "timestampAuthorities": tsas.iter().map(|t| serde_json::json!({
            "subject": {"organization": "shim-agent tests", "commonName": "tsa.test"},
            "uri": "https://tsa.test",
            "certChain": {"certificates": t.chain().iter().map(|d| serde_json::json!({"rawBytes": STANDARD.encode(d)})).collect::<Vec<_>>()},
            "validFor": {"start": rfc3339(t.valid_for.0), "end": rfc3339(t.valid_for.1)}
        })).collect::<Vec<_>>()
    })
    .to_string()
}

/// A Sigstore client trust config (`application/vnd.dev.sigstore.clienttrustconfig.v0.1+json`,
/// what sigstore-python's `--trust-config` reads): `trusted_root` and a signing config
/// naming the test's (unreachable) services, which verifying does not use.
pub fn client_trust_config(trusted_root: &str) -> String {
    let root: serde_json::Value = serde_json::from_str(trusted_root).expect("a trusted root");
    let service = |url: &str| {
        serde_json::json!({
            "url": url, "majorApiVersion": 1, "operator": "test",
            "validFor": {"start": "2020-01-01T00:00:00Z"}
        })
    };
    serde_json::json!({
        "mediaType": "application/vnd.dev.sigstore.clienttrustconfig.v0.1+json",
        "trustedRoot": root,
        "signingConfig": {
            "mediaType": "application/vnd.dev.sigstore.signingconfig.v0.2+json",
            "caUrls": [service("https://fulcio.test")],
            "oidcUrls": [service("https://oauth2.test")],
            "rekorTlogUrls": [service("https://rekor.test")],
            "tsaUrls": [],
            "rekorTlogConfig": {"selector": "ANY"},
            "tsaConfig": {"selector": "ANY"}
        }
    })
    .to_string()
}

/// A `.sig` as `cosign sign-blob --output-signature` writes it.
pub fn dot_sig(sig: &[u8]) -> String {
    STANDARD.encode(sig)
}

/// A `.pem` as `cosign sign-blob --output-certificate` writes it: base64 of the PEM.
pub fn dot_pem(cert_der: &[u8]) -> String {
    STANDARD.encode(pem_of("CERTIFICATE", cert_der))
}

/// A cosign 2.x bundle (`cosign sign-blob --bundle`).
pub fn cosign_bundle(sig: &[u8], cert_der: Option<&[u8]>, entry: Option<&LogEntry>) -> String {
    let mut b = serde_json::json!({"base64Signature": STANDARD.encode(sig)});
    if let Some(c) = cert_der {
        b["cert"] = STANDARD.encode(pem_of("CERTIFICATE", c)).into();
    }
    if let Some(e) = entry {
        b["rekorBundle"] = serde_json::json!({
            "SignedEntryTimestamp": STANDARD.encode(&e.set),
            "Payload": {
                "body": STANDARD.encode(&e.body),
                "integratedTime": e.integrated_time,
                "logIndex": e.log_index,
                "logID": hex::encode(&e.log_id)
            }
        });
    }
    b.to_string()
}

/// A Sigstore bundle of `media_type`, signing `file` with `sig`.
pub fn sigstore_bundle(
    media_type: &str,
    file: &[u8],
    sig: &[u8],
    cert_der: &[u8],
    entry: Option<&LogEntry>,
) -> String {
    let cert = serde_json::json!({"rawBytes": STANDARD.encode(cert_der)});
    let mut vm = if media_type.ends_with("0.1") {
        serde_json::json!({"x509CertificateChain": {"certificates": [cert]}})
    } else {
        serde_json::json!({"certificate": cert})
    };
    vm["tlogEntries"] = match entry {
        Some(e) => {
            let body: serde_json::Value = serde_json::from_slice(&e.body).expect("a body");
            let mut t = serde_json::json!({
                "logIndex": e.log_index.to_string(),
                "logId": {"keyId": STANDARD.encode(&e.log_id)},
                "kindVersion": {"kind": "hashedrekord", "version": body["apiVersion"]},
                "canonicalizedBody": STANDARD.encode(&e.body)
            });
            // Rekor v2: no integrated time; an entry without a SET: no promise
            if e.integrated_time != 0 {
                t["integratedTime"] = e.integrated_time.to_string().into();
            }
            if !e.set.is_empty() {
                t["inclusionPromise"] =
                    serde_json::json!({"signedEntryTimestamp": STANDARD.encode(&e.set)});
            }
            serde_json::json!([t])
        }
        None => serde_json::json!([]),
    };
    serde_json::json!({
        "mediaType": media_type,
        "verificationMaterial": vm,
        "messageSignature": {
            "messageDigest": {"algorithm": "SHA2_256", "digest": STANDARD.encode(Sha256::digest(file))},
            "signature": STANDARD.encode(sig)
        }
    })
    .to_string()
}
