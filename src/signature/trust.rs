//! What a policy accepts: the certificate identities (exact, or a pattern over the whole
//! identity) with the OIDC issuer that must vouch for each, the keys, and whether a keyless
//! signature without a signed time is accepted.

use super::SignatureError;
use super::keys::PublicKey;

/// How a certificate's identity is matched.
#[derive(Debug, Clone)]
pub enum Subject {
    Exact(String),
    /// A regular expression over the whole identity (anchored).
    Pattern(regex::Regex),
}

impl Subject {
    /// A pattern anchored at both ends; `Err` says why it is not one.
    pub fn pattern(re: &str) -> Result<Subject, String> {
        regex::Regex::new(&format!("^(?:{re})$"))
            .map(Subject::Pattern)
            .map_err(|e| {
                format!(
                    "bad regular expression {:?}: {e}",
                    crate::text::clip(re, 128)
                )
            })
    }

    fn matches(&self, identity: &str) -> bool {
        match self {
            Subject::Exact(s) => s == identity,
            Subject::Pattern(re) => re.is_match(identity),
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Exact(s) => write!(f, "{s}"),
            Subject::Pattern(re) => {
                let s = re.as_str();
                let inner = s
                    .strip_prefix("^(?:")
                    .and_then(|s| s.strip_suffix(")$"))
                    .unwrap_or(s);
                write!(f, "an identity matching /{inner}/")
            }
        }
    }
}

/// An identity a policy trusts: a certificate subject and the OIDC issuer that vouches for it.
#[derive(Debug, Clone)]
pub struct TrustedIdentity {
    pub subject: Subject,
    pub issuer: String,
}

/// What a policy accepts.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    pub identities: Vec<TrustedIdentity>,
    pub keys: Vec<PublicKey>,
    /// Accept a keyless signature with no signed time (runwasi's `.sig` + `.pem`): its
    /// certificate is then checked at its own start, which nothing proves was the signing
    /// time. Off by default.
    pub without_signed_time: bool,
}

impl Trust {
    /// Whether `identity` from `issuer` is trusted; the refusal names both and what is.
    pub fn check_identity(
        &self,
        file: &str,
        identity: &str,
        issuer: &str,
    ) -> Result<(), SignatureError> {
        let by_subject: Vec<&TrustedIdentity> = self
            .identities
            .iter()
            .filter(|t| t.subject.matches(identity))
            .collect();
        if by_subject.iter().any(|t| t.issuer == issuer) {
            return Ok(());
        }
        if !by_subject.is_empty() {
            return Err(SignatureError::WrongIssuer {
                file: file.to_string(),
                identity: identity.to_string(),
                found: issuer.to_string(),
                expected: by_subject
                    .iter()
                    .map(|t| t.issuer.as_str())
                    .collect::<Vec<_>>()
                    .join(" or "),
            });
        }
        Err(SignatureError::WrongIdentity {
            file: file.to_string(),
            found: identity.to_string(),
            issuer: issuer.to_string(),
            expected: if self.identities.is_empty() {
                "a trusted key: the policy trusts no certificate identity".into()
            } else {
                self.identities
                    .iter()
                    .map(|t| format!("{} (issuer {})", t.subject, t.issuer))
                    .collect::<Vec<_>>()
                    .join(" or ")
            },
        })
    }
}
