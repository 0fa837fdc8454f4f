//! Why a signature was refused: one variant per refusal, each naming the file and, for an
//! identity, the one found and the one expected; a stable [`SignatureError::reason`].

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// The trusted root (Sigstore's `trusted_root.json` format) cannot be used.
    #[error("trusted root {source_name}: {detail}")]
    TrustedRoot { source_name: String, detail: String },

    /// The signature material (a `.sig`, a `.pem`, a bundle) cannot be read.
    #[error("signature material for {file}: {detail}")]
    Material { file: String, detail: String },

    /// The policy requires a signature and none was found where it says to look.
    #[error("{file} is not signed: no {looked} ({why})")]
    Missing {
        file: String,
        looked: String,
        why: String,
    },

    /// The signature does not verify over the file with the signer's key: it signs other
    /// bytes, or it was made with another key.
    #[error(
        "the signature does not match {file}: it was made over other bytes or with another key than {signer}'s"
    )]
    Mismatch { file: String, signer: String },

    /// A keyed signature whose key is none of those trusted.
    #[error(
        "{file} is signed with a key that is not trusted: the signature verifies with none of {expected}"
    )]
    UntrustedKey { file: String, expected: String },

    /// A keyless signature whose certificate is not the policy's, or the policy names no
    /// identity to accept a certificate for.
    #[error("{file}: the signing certificate does not chain to the trusted root: {detail}")]
    UntrustedCertificate { file: String, detail: String },

    /// The certificate was not valid when the file was signed (by the signed time).
    #[error(
        "{file}: the signing certificate was not valid at the signed time {signed_at} (valid {not_before} to {not_after})"
    )]
    CertificateExpired {
        file: String,
        signed_at: String,
        not_before: String,
        not_after: String,
    },

    /// The certificate's identity (its subject alternative name) is not an expected one.
    #[error("{file} was signed by {found} (issuer {issuer}); expected {expected}")]
    WrongIdentity {
        file: String,
        found: String,
        issuer: String,
        expected: String,
    },

    /// The identity is expected, but vouched for by another OIDC issuer.
    #[error("{file} was signed by {identity} with issuer {found}; expected issuer {expected}")]
    WrongIssuer {
        file: String,
        identity: String,
        found: String,
        expected: String,
    },

    /// A keyless signature with no signed time, and a policy that requires one.
    #[error(
        "{file}: the signature has no signed time (no transparency log entry or timestamp), so nothing shows its short-lived certificate was valid when it signed; ship a bundle, or accept signatures without a signed time in the policy"
    )]
    NoSignedTime { file: String },

    /// The node's policy requires a signature, and the Shim says where none is.
    #[error(
        "Shim {shim}: this node requires signed shims (signatures.require in the agent's config), and the Shim has no spec.signature saying where its signature is"
    )]
    RequiredByNode { shim: String },

    /// The signature meets the Shim's policy but not the node's.
    #[error("refused by this node's signature policy (signatures in the agent's config): {0}")]
    RefusedByNode(Box<SignatureError>),

    /// The transparency log entry does not verify, or is about other bytes.
    #[error("{file}: transparency log entry: {detail}")]
    LogEntry { file: String, detail: String },

    /// A signature attached to an OCI artifact that is over another manifest.
    #[error("{file}: the signature is over manifest {signed}, the artifact is {expected}")]
    OtherManifest {
        file: String,
        signed: String,
        expected: String,
    },
    /// An RFC 3161 timestamp does not verify, stamps another signature, or is by a
    /// timestamp authority the trusted root does not name (or not at its time).
    #[error("{file}: RFC 3161 timestamp: {detail}")]
    Timestamp { file: String, detail: String },
}

impl SignatureError {
    /// Stable machine-readable reason: a Shim condition's `reason` and a metric label.
    pub fn reason(&self) -> &'static str {
        use SignatureError::*;
        match self {
            TrustedRoot { .. } => "TrustedRootInvalid",
            Material { .. } => "SignatureMaterialInvalid",
            Missing { .. } => "SignatureMissing",
            Mismatch { .. } => "SignatureMismatch",
            UntrustedKey { .. } => "SignerKeyUntrusted",
            UntrustedCertificate { .. } => "CertificateUntrusted",
            CertificateExpired { .. } => "CertificateExpired",
            WrongIdentity { .. } => "SignerIdentityMismatch",
            WrongIssuer { .. } => "SignerIssuerMismatch",
            NoSignedTime { .. } => "NoSignedTime",
            LogEntry { .. } => "LogEntryInvalid",
            Timestamp { .. } => "TimestampInvalid",
            RequiredByNode { .. } => "SignatureRequiredByNode",
            RefusedByNode(_) => "SignatureRefusedByNode",
            OtherManifest { .. } => "SignatureMismatch",
        }
    }
}
