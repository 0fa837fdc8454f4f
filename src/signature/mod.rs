//! Who built a shim: cosign signatures, keyed or keyless, verified offline against a Sigstore
//! trusted root (docs/design.md §7).
//!
//! Pure: bytes in, a verdict out; reading files and fetching material is the caller's. The
//! flow: [`material`] reads what the publisher shipped (a `.sig` and `.pem`, a cosign bundle,
//! a Sigstore bundle) into a [`Material`]; [`verify()`] checks it over the file against a
//! [`Trust`] (the identities and keys a policy accepts) and a [`TrustedRoot`].
//!
//! A keyless signature is checked for: the signature over the file with the certificate's
//! key; the signed time from a transparency log entry (the log's signed entry timestamp; its
//! inclusion proof and checkpoint, which sign no time; the entry about this file, signature
//! and certificate) or from RFC 3161 timestamps of a timestamp authority, or none when the
//! policy accepts that; the chain to a certificate authority of the root valid at that time, with the
//! code-signing key usage, the certificate valid then; the identity and its issuer.

mod certificate;
mod error;
mod inclusion;
mod keys;
mod log_entry;
pub mod material;
pub mod simple_signing;
pub mod timestamp;
mod trust;
mod trusted_root;
mod verify;

pub use error::SignatureError;
pub use inclusion::InclusionProof;
pub use keys::PublicKey;
pub use log_entry::{LogEntry, canonical_payload};
pub use material::Material;
pub use trust::{Subject, Trust, TrustedIdentity};
pub use trusted_root::{PUBLIC_GOOD, TrustedRoot, Validity, key_id};
pub use verify::{SignedBy, TimeSource, Verified, file_sha256, verify};
