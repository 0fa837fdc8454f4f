//! `[signatures]`: the node's own signature policy, which no Shim can override
//! (docs/design.md §7). With `require`, every Shim installed here must be signed by a signer
//! this node trusts, whatever the Shim says; without it, each Shim's own `signature` decides.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The node's signature policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct SignatureSettings {
    /// Refuse every Shim whose shim is not signed by a signer trusted here (`identities`,
    /// `keys`), even one that asks for no signature. `false`: each Shim's `signature`
    /// decides alone.
    pub require: bool,
    /// Sigstore trusted root (`trusted_root.json`) for keyless signatures: a private
    /// instance, an air-gapped copy (empty: Sigstore's public-good root, built in).
    pub trusted_root: String,
    /// With `require`: accept keyless signatures that have no signed time (runwasi's `.sig`
    /// and `.pem`); a Shim's `allowWithoutSignedTime` needs this too.
    pub allow_without_signed_time: bool,
    /// Keyless signers trusted here: `{ identity = "…", issuer = "…" }`, or
    /// `{ identity-regexp = "…", issuer = "…" }` (a regular expression over the whole
    /// identity).
    pub identities: Vec<IdentitySetting>,
    /// PEM files of public keys trusted here for keyed signatures.
    pub keys: Vec<String>,
}

/// A keyless signer the node trusts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct IdentitySetting {
    /// The certificate identity, exactly.
    pub identity: String,
    /// Or a regular expression the whole identity must match.
    pub identity_regexp: String,
    /// The OIDC issuer that must have vouched for it.
    pub issuer: String,
}

impl SignatureSettings {
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.require && self.identities.is_empty() && self.keys.is_empty() {
            return Err(
                "signatures.require needs a signer to trust: signatures.identities or signatures.keys"
                    .into(),
            );
        }
        for (i, id) in self.identities.iter().enumerate() {
            if id.identity.is_empty() == id.identity_regexp.is_empty() {
                return Err(format!(
                    "signatures.identities[{i}] needs exactly one of identity or identity-regexp"
                ));
            }
            if id.issuer.is_empty() {
                return Err(format!("signatures.identities[{i}] needs its issuer"));
            }
            if !id.identity_regexp.is_empty() {
                regex::Regex::new(&id.identity_regexp)
                    .map_err(|e| format!("signatures.identities[{i}].identity-regexp: {e}"))?;
            }
        }
        for (name, p) in self.keys.iter().map(|k| ("signatures.keys", k)).chain(
            (!self.trusted_root.is_empty())
                .then_some(("signatures.trusted-root", &self.trusted_root)),
        ) {
            if !p.starts_with('/') {
                return Err(format!("{name}: {p:?} must be an absolute path"));
            }
        }
        Ok(())
    }
}
