//! `spec.signature`: who must have signed a Shim's shim, and where the signature is. Checked
//! on the node before anything changes (docs/design.md §7); a node's own policy can require
//! it and narrow whom it trusts (`signatures` in the agent's config), never widen it.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// A path inside the artifact: relative, no `..` segment, no empty segment.
const IN_ARTIFACT_PATH: &str = "self.size() > 0 && self.size() <= 1024 && !self.startsWith('/') && !self.matches('(^|/)[.][.]?(/|$)') && !self.contains('//')";

/// The signature of a Shim's artifact or of a file in it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("self.from == 'oci' || has(self.bundle) != has(self.signature)")
        .message("signature needs exactly one of bundle, or signature (with certificate for a keyless signature)"),
    validation = Rule::new("self.from != 'oci' || (!has(self.signature) && !has(self.certificate) && !has(self.bundle) && !has(self.signedFile))")
        .message("with from: oci, the signature is found attached to the artifact in its registry: signature, certificate, bundle and signedFile are not allowed"),
    validation = Rule::new("!has(self.certificate) || has(self.signature)")
        .message("signature.certificate goes with signature.signature (a bundle carries its own)"),
    validation = Rule::new("(has(self.identities) && self.identities.size() > 0) || (has(self.keys) && self.keys.size() > 0)")
        .message("signature needs at least one trusted signer: identities (keyless) or keys"),
    validation = Rule::new("self.from != 'artifact' || ((!has(self.signature) || (self.signature.size() > 0 && self.signature.size() <= 1024 && !self.signature.startsWith('/') && !self.signature.matches('(^|/)[.][.]?(/|$)') && !self.signature.contains('//'))) && (!has(self.certificate) || (self.certificate.size() > 0 && self.certificate.size() <= 1024 && !self.certificate.startsWith('/') && !self.certificate.matches('(^|/)[.][.]?(/|$)') && !self.certificate.contains('//'))) && (!has(self.bundle) || (self.bundle.size() > 0 && self.bundle.size() <= 1024 && !self.bundle.startsWith('/') && !self.bundle.matches('(^|/)[.][.]?(/|$)') && !self.bundle.contains('//'))))")
        .message("with from: artifact, signature, certificate and bundle must be relative paths inside the artifact, without '.' or '..' segments, at most 1024 characters"),
    validation = Rule::new("self.from != 'url' || ((!has(self.signature) || self.signature.startsWith('https://') || self.signature.startsWith('http://') || self.signature.startsWith('file:///')) && (!has(self.certificate) || self.certificate.startsWith('https://') || self.certificate.startsWith('http://') || self.certificate.startsWith('file:///')) && (!has(self.bundle) || self.bundle.startsWith('https://') || self.bundle.startsWith('http://') || self.bundle.startsWith('file:///')))")
        .message("with from: url, signature, certificate and bundle must be http://, https:// or file:/// URLs"),
)]
pub struct SignatureSpec {
    /// Where `signature`, `certificate` and `bundle` are: `artifact` (paths inside the
    /// unpacked artifact, as runwasi ships a `.sig` and a `.pem` beside its shim binary),
    /// `url` (http, https or file:/// URLs, beside the artifact), or `oci` (attached to the
    /// Shim's `oci` artifact in its registry, as `cosign sign` attaches them: the tag
    /// `sha256-<digest>.sig`, or a Sigstore bundle referring to it, found through the
    /// referrers API or its `sha256-<digest>` tag). With `oci`, the fetch strategy must be
    /// `oci` with a reference pinned by digest, and `signature`, `certificate`, `bundle` and
    /// `signedFile` are not set: what is signed is the artifact's manifest (its pinned
    /// digest), which pins the digests of its layers, and the fetch checks those.
    pub from: MaterialFrom,
    /// The file the signature is over: a path inside the artifact (runwasi signs its shim
    /// binary, not the tarball). Absent: the artifact as downloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(IN_ARTIFACT_PATH)
        .message("signature.signedFile must be a relative path inside the artifact, without '.' or '..' segments, at most 1024 characters"))]
    #[schemars(length(max = 1024))]
    pub signed_file: Option<String>,
    /// The signature (base64, as `cosign sign-blob --output-signature` writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub signature: Option<String>,
    /// The signing certificate of a keyless signature (PEM, or base64 of PEM as
    /// `cosign sign-blob --output-certificate` writes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub certificate: Option<String>,
    /// A bundle: cosign's (`cosign sign-blob --bundle`, cosign 1.x and 2.x) or a Sigstore
    /// bundle v0.1 to v0.3 (cosign 3, the Sigstore clients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub bundle: Option<String>,
    /// Keyless signers trusted: a certificate identity and the OIDC issuer that vouched for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub identities: Option<Vec<SignerIdentity>>,
    /// Public keys trusted for keyed signatures (`cosign.pub`: PEM, ECDSA P-256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(k, k.size() <= 4096 && k.contains('-----BEGIN PUBLIC KEY-----'))")
        .message("signature.keys must each be a PEM public key (-----BEGIN PUBLIC KEY-----) of at most 4096 characters"))]
    #[schemars(length(max = 8), inner(length(max = 4096)))]
    pub keys: Option<Vec<String>>,
    /// Accept a keyless signature that has no signed time (no log entry: runwasi's `.sig` and
    /// `.pem`). Its short-lived certificate is then checked at its own start, which nothing
    /// proves was when it signed. Default false; a node whose policy requires signatures
    /// must allow it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_without_signed_time: Option<bool>,
}

/// Where the signature material is.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum MaterialFrom {
    /// Paths inside the unpacked artifact.
    Artifact,
    /// URLs (`http://`, `https://`, `file:///`).
    Url,
    /// Attached to the `oci` artifact in its registry (cosign's signature tag, or a Sigstore
    /// bundle as an OCI 1.1 referrer).
    Oci,
}

/// A keyless signer: an identity, exact or as a regular expression over the whole of it, and
/// the OIDC issuer that must have vouched for it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("has(self.identity) != has(self.identityRegExp)")
        .message("an identity needs exactly one of identity or identityRegExp"),
)]
pub struct SignerIdentity {
    /// The certificate's subject alternative name, exactly: a URI (a CI workflow, e.g.
    /// `https://github.com/containerd/runwasi/.github/workflows/action-build.yml@refs/heads/main`)
    /// or an email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub identity: Option<String>,
    /// A regular expression (RE2 syntax) the whole identity must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub identity_reg_exp: Option<String>,
    /// The OIDC issuer, exactly (`https://token.actions.githubusercontent.com` for GitHub
    /// Actions).
    #[schemars(length(min = 1, max = 1024))]
    pub issuer: String,
}
