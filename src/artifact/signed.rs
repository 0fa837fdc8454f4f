//! A Shim's signature, checked as part of fetch and verify: on the fetched copy, before a
//! slot is asked for and before anything is staged, offline installs included
//! (docs/design.md §7). Which policies apply is decided here, purely ([`plan`]): the Shim's
//! own `signature`, and the node's `signatures` when it requires them, which a Shim can
//! neither skip nor widen. The rest is a thin shell: the material from inside the artifact or
//! beside it, the signed file's SHA-256 streamed from the store, the node's keys and root; for
//! `from: oci`, the signatures attached to the artifact in its registry (`oci_signature.rs`),
//! the first that passes both policies taken ([`attached_verdict`], pure).

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::api::signature::{MaterialFrom, SignatureSpec};
use crate::hostroot::HostRoot;
use crate::settings::SignatureSettings;
use crate::signature::{
    self, Material, PublicKey, SignatureError, Subject, Trust, TrustedIdentity, TrustedRoot,
    Verified,
};

use super::oci_signature::{Attached, Found};
use super::{ArtifactError, FetchSpec, Fetcher, ResolvedSource, StoredArtifact};

/// Largest signature, certificate or bundle read.
const MATERIAL_CAP: usize = 256 * 1024;

/// The node's policy, loaded: whether it requires signatures, whom it trusts, its root.
#[derive(Debug, Clone, Default)]
pub struct NodeSignatures {
    pub require: bool,
    pub allow_without_signed_time: bool,
    pub trust: Trust,
    /// The trusted root the node names; `None`: the public-good root built in.
    pub root: Option<TrustedRoot>,
}

impl NodeSignatures {
    /// From the agent's settings; the key files and the trusted root are read under `host`.
    pub fn load(s: &SignatureSettings, host: &HostRoot) -> Result<NodeSignatures, ArtifactError> {
        let read = |p: &str| -> Result<String, ArtifactError> {
            let path = host
                .resolve(p)
                .map_err(|e| ArtifactError::io("resolve", PathBuf::from(p), e))?;
            std::fs::read_to_string(&path).map_err(|e| ArtifactError::io("read", path, e))
        };
        let mut trust = Trust {
            identities: vec![],
            keys: vec![],
            without_signed_time: s.allow_without_signed_time,
        };
        for id in &s.identities {
            trust.identities.push(TrustedIdentity {
                subject: subject(&id.identity, &id.identity_regexp).map_err(invalid)?,
                issuer: id.issuer.clone(),
            });
        }
        for k in &s.keys {
            let key = PublicKey::from_pem(&read(k)?)
                .map_err(|e| invalid(format!("signatures.keys: {k}: {e}")))?;
            trust.keys.push(key);
        }
        let root = match s.trusted_root.as_str() {
            "" => None,
            p => Some(TrustedRoot::from_json(&read(p)?, p)?),
        };
        Ok(NodeSignatures {
            require: s.require,
            allow_without_signed_time: s.allow_without_signed_time,
            trust,
            root,
        })
    }
}

/// The checks one Shim's shim gets on this node: against the Shim's trust, and against the
/// node's when it requires signatures. Both must pass.
#[derive(Debug, Clone)]
pub struct Checks<'a> {
    pub spec: &'a SignatureSpec,
    pub shim: Trust,
    pub node: Option<Trust>,
}

/// Pure: the checks for `shim` (its `spec`), given the node's policy. `None`: none asked for.
pub fn plan<'a>(
    shim: &str,
    spec: Option<&'a SignatureSpec>,
    node: &NodeSignatures,
) -> Result<Option<Checks<'a>>, ArtifactError> {
    let Some(spec) = spec else {
        if node.require {
            return Err(SignatureError::RequiredByNode {
                shim: shim.to_string(),
            }
            .into());
        }
        return Ok(None);
    };
    // a Shim cannot accept what a requiring node does not
    let without = spec.allow_without_signed_time.unwrap_or(false)
        && (!node.require || node.allow_without_signed_time);
    let mut trust = Trust {
        without_signed_time: without,
        ..Trust::default()
    };
    for id in spec.identities.iter().flatten() {
        let subject = subject(
            id.identity.as_deref().unwrap_or(""),
            id.identity_reg_exp.as_deref().unwrap_or(""),
        )
        .map_err(|e| invalid(format!("Shim {shim}: spec.signature.identities: {e}")))?;
        trust.identities.push(TrustedIdentity {
            subject,
            issuer: id.issuer.clone(),
        });
    }
    for k in spec.keys.iter().flatten() {
        let key = PublicKey::from_pem(k)
            .map_err(|e| invalid(format!("Shim {shim}: spec.signature.keys: {e}")))?;
        trust.keys.push(key);
    }
    let node = node.require.then(|| Trust {
        without_signed_time: without,
        ..node.trust.clone()
    });
    Ok(Some(Checks {
        spec,
        shim: trust,
        node,
    }))
}

fn subject(exact: &str, pattern: &str) -> Result<Subject, String> {
    match (exact, pattern) {
        (e, "") if !e.is_empty() => Ok(Subject::Exact(e.to_string())),
        ("", p) if !p.is_empty() => Subject::pattern(p),
        _ => Err("needs exactly one of identity or identityRegExp".into()),
    }
}

fn invalid(detail: String) -> ArtifactError {
    ArtifactError::InvalidSpec { detail }
}

impl Fetcher {
    /// Check `stored`'s signature as `checks` say; who signed, and when. `source` is the
    /// Shim's fetch strategy, whose `oci` artifact carries the signatures of `from: oci`.
    pub async fn verify_signature(
        &self,
        checks: &Checks<'_>,
        source: &FetchSpec,
        stored: &StoredArtifact,
        node: &NodeSignatures,
    ) -> Result<Verified, ArtifactError> {
        let spec = checks.spec;
        let root = match &node.root {
            Some(r) => r.clone(),
            None => TrustedRoot::public_good()?,
        };
        if spec.from == MaterialFrom::Oci {
            let src = match source.resolve(&self.platform, self.containerd.as_ref())? {
                ResolvedSource::Oci(src) => src,
                ResolvedSource::Http(_) => {
                    return Err(invalid(
                        "spec.signature.from: oci needs fetchStrategy.type oci".into(),
                    ));
                }
            };
            let found = self.attached_signatures(&src).await?;
            return Ok(attached_verdict(&found, checks, &root)?);
        }
        let (name, sha) = match &spec.signed_file {
            Some(rel) => {
                let path = inside(&stored.dir, rel)?;
                let sha = tokio::task::spawn_blocking(move || sha256_file(&path))
                    .await
                    .map_err(|e| {
                        ArtifactError::io("hash", PathBuf::from(rel), std::io::Error::other(e))
                    })??;
                (rel.clone(), sha)
            }
            None => (
                format!("the artifact (sha256 {})", stored.digest),
                digest(&stored.digest)?,
            ),
        };
        let material = self.material(spec, &stored.dir, &name).await?;
        Ok(check_both(&name, &sha, &material, checks, &root)?)
    }

    /// The material as the spec says: read from the artifact's tree, or fetched beside it.
    async fn material(
        &self,
        spec: &SignatureSpec,
        dir: &Path,
        name: &str,
    ) -> Result<Material, ArtifactError> {
        let get = async |what: &str, at: &str| -> Result<Vec<u8>, ArtifactError> {
            match spec.from {
                MaterialFrom::Artifact => {
                    let path = inside(dir, at)?;
                    read_capped(&path).map_err(|e| missing(name, what, at, &e.to_string()))
                }
                MaterialFrom::Oci => Err(invalid(
                    "spec.signature.from: oci has no signature, certificate or bundle".into(),
                )),
                MaterialFrom::Url => {
                    self.fetch_small(at, MATERIAL_CAP)
                        .await
                        .map_err(|e| match e {
                            ArtifactError::HttpStatus { status: 404, .. }
                            | ArtifactError::LocalFile { .. } => {
                                missing(name, what, at, &e.to_string())
                            }
                            other => other,
                        })
                }
            }
        };
        let bad = |detail: String| -> ArtifactError {
            SignatureError::Material {
                file: name.to_string(),
                detail,
            }
            .into()
        };
        if let Some(b) = &spec.bundle {
            let text = get("bundle", b).await?;
            return signature::material::bundle(&text).map_err(bad);
        }
        let sig_at = spec.signature.as_deref().unwrap_or_default();
        let sig = get("signature", sig_at).await?;
        let cert = match &spec.certificate {
            Some(c) => Some(get("certificate", c).await?),
            None => None,
        };
        signature::material::detached(&sig, cert.as_deref()).map_err(bad)
    }
}

/// `m` over `sha` under the Shim's policy, and the node's when it requires signatures.
fn check_both(
    name: &str,
    sha: &[u8; 32],
    m: &Material,
    checks: &Checks<'_>,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let by_shim = signature::verify(name, sha, m, &checks.shim, root)?;
    match &checks.node {
        Some(trust) => signature::verify(name, sha, m, trust, root)
            .map_err(|e| SignatureError::RefusedByNode(Box::new(e))),
        None => Ok(by_shim),
    }
}

/// Pure: the first signature attached to the artifact that passes [`check_both`]; else the
/// most telling refusal: the node's refusal of one the Shim accepts, else the first one's,
/// or [`SignatureError::Missing`] when nothing is attached.
pub fn attached_verdict(
    found: &Found,
    checks: &Checks<'_>,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let (mut first, mut by_node) = (None, None);
    for a in &found.attached {
        match check_attached(found, a, checks, root) {
            Ok(v) => return Ok(v),
            Err(e @ SignatureError::RefusedByNode(_)) => {
                by_node.get_or_insert(e);
            }
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(by_node.or(first).unwrap_or_else(|| SignatureError::Missing {
        file: found.reference.clone(),
        looked: format!(
            "signature attached to manifest {} (Sigstore bundles referring to it, cosign's tag {})",
            found.digest,
            super::oci_attached::signature_tag(&found.digest)
        ),
        why: "its registry has none".into(),
    }))
}

fn check_attached(
    found: &Found,
    a: &Attached,
    checks: &Checks<'_>,
    root: &TrustedRoot,
) -> Result<Verified, SignatureError> {
    let name = |at: &str| format!("{} ({at})", found.reference);
    match a {
        Attached::SimpleSigning {
            at,
            payload,
            annotations,
        } => {
            let name = name(at);
            let (sha, m) =
                signature::simple_signing::read(&name, payload, annotations, &found.digest)?;
            check_both(&name, &sha, &m, checks, root)
        }
        Attached::Bundle { at, bundle } => {
            let name = name(at);
            let m =
                signature::material::bundle(bundle).map_err(|detail| SignatureError::Material {
                    file: name.clone(),
                    detail,
                })?;
            let sha = found
                .digest
                .strip_prefix("sha256:")
                .and_then(|h| hex::decode(h).ok())
                .and_then(|v| <[u8; 32]>::try_from(v).ok())
                .ok_or_else(|| SignatureError::Material {
                    file: name.clone(),
                    detail: format!("the manifest digest {} is not a sha256", found.digest),
                })?;
            check_both(&name, &sha, &m, checks, root)
        }
        Attached::Unreadable { at, detail } => Err(SignatureError::Material {
            file: name(at),
            detail: detail.clone(),
        }),
    }
}

fn missing(file: &str, what: &str, at: &str, why: &str) -> ArtifactError {
    SignatureError::Missing {
        file: file.to_string(),
        looked: format!("{what} at {}", crate::text::clip(at, 512)),
        why: crate::text::clip(why, 512),
    }
    .into()
}

/// `rel` under `dir`, refusing a path that leaves it (through `..` or a link).
fn inside(dir: &Path, rel: &str) -> Result<PathBuf, ArtifactError> {
    let leaves = || ArtifactError::InvalidSpec {
        detail: format!(
            "spec.signature: {:?} is not a path inside the artifact",
            crate::text::clip(rel, 256)
        ),
    };
    let p = Path::new(rel);
    if p.is_absolute()
        || p.components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(leaves());
    }
    let joined = dir.join(p);
    match (joined.canonicalize(), dir.canonicalize()) {
        (Ok(real), Ok(base)) if !real.starts_with(&base) => Err(leaves()),
        _ => Ok(joined),
    }
}

fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(u64::try_from(MATERIAL_CAP).unwrap_or(u64::MAX) + 1)
        .read_to_end(&mut out)?;
    if out.len() > MATERIAL_CAP {
        return Err(std::io::Error::other(format!(
            "larger than {MATERIAL_CAP} bytes"
        )));
    }
    Ok(out)
}

fn sha256_file(path: &Path) -> Result<[u8; 32], ArtifactError> {
    use sha2::Digest;
    let mut f = std::fs::File::open(path).map_err(|e| ArtifactError::io("open", path, e))?;
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = f
            .read(&mut buf)
            .map_err(|e| ArtifactError::io("read", path, e))?;
        if n == 0 {
            return Ok(h.finalize().into());
        }
        h.update(&buf[..n]);
    }
}

fn digest(hex_digest: &str) -> Result<[u8; 32], ArtifactError> {
    hex::decode(hex_digest)
        .ok()
        .and_then(|v| <[u8; 32]>::try_from(v).ok())
        .ok_or_else(|| {
            invalid(format!(
                "the artifact's digest {hex_digest:?} is not a sha256"
            ))
        })
}
