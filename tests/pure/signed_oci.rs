//! `signature.from: oci` through the whole install path (`install --root`), against a real
//! registry (Debian's docker-registry, TLS from a private CA): the signature attached to the
//! Shim's `oci` artifact as `cosign sign` attaches it (the tag `sha256-<hex>.sig`, simple
//! signing layers with cosign's annotations) or as a Sigstore bundle referring to it (OCI 1.1;
//! docker-registry 2.8 has no referrers API, so its 404 leads to the referrers tag schema's
//! index at `sha256-<hex>`). Checked before anything changes; a refusal leaves the image as
//! it was.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{KeyPair, PublicKeyData, SigningKey};
use serde_json::json;
use std::time::Duration;

use shim_agent::api::signature::{MaterialFrom, SignatureSpec, SignerIdentity};
use shim_agent::artifact::oci_signature::Attached;
use shim_agent::artifact::{Fetcher, Limits, OciSource, RetryPolicy};
use shim_agent::cli::status;
use shim_agent::settings::{IdentitySetting, Settings};
use shim_agent::signature::LogEntry;
use shim_agent::txn::TxnError;

use crate::support::image_root::{self, Image, deep_snapshot, image, run_install_settings};
use crate::support::registry::{Registry, registry};
use crate::support::shim_builder::ShimBuilder;
use crate::support::sigstore::{
    Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, Signer, pem_of,
    sigstore_bundle, trusted_root,
};
use crate::support::{Entry, real_elf, sha256_hex, tar_gz};

const TEST: &str = "signed_oci";
const BIN: &str = "containerd-shim-wasmtime-v1";
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const EMPTY: &str = "application/vnd.oci.empty.v1+json";
const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const BUNDLE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// A registry, a signing authority and log, and an image root whose node trusts them.
struct World {
    reg: Registry,
    rt: tokio::runtime::Runtime,
    fulcio: Fulcio,
    rekor: Rekor,
}

/// An artifact pushed to the registry: its manifest's bytes and digest, its reference.
struct Pushed {
    repo: String,
    manifest: Vec<u8>,
    digest: String,
    reference: String,
}

fn world() -> Option<World> {
    Some(World {
        reg: registry(TEST)?,
        rt: tokio::runtime::Runtime::new().unwrap(),
        fulcio: Fulcio::new("fulcio"),
        rekor: Rekor::new(),
    })
}

impl World {
    fn descriptor(&self, repo: &str, media_type: &str, data: &[u8]) -> serde_json::Value {
        let digest = self.rt.block_on(self.reg.push_blob(repo, data));
        json!({"mediaType": media_type, "digest": digest, "size": data.len()})
    }

    /// A manifest of these layers (and `extra` fields) at `repo:tag`: its bytes and digest.
    fn manifest(
        &self,
        repo: &str,
        tag: &str,
        layers: Vec<serde_json::Value>,
        extra: serde_json::Value,
    ) -> (Vec<u8>, String) {
        let mut m = json!({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": self.descriptor(repo, EMPTY, b"{}"), "layers": layers,
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            m[k] = v.clone();
        }
        let bytes = m.to_string().into_bytes();
        let digest = self
            .rt
            .block_on(self.reg.put_manifest(repo, tag, &bytes, MANIFEST));
        (bytes, digest)
    }

    /// The shim as the one layer of an artifact in `repo`.
    fn artifact(&self, repo: &str) -> Pushed {
        let layer = tar_gz(&[Entry::File(BIN, real_elf(), 0o755)]);
        let layers =
            vec![self.descriptor(repo, "application/vnd.oci.image.layer.v1.tar+gzip", &layer)];
        let (manifest, digest) = self.manifest(repo, "v1", layers, json!({}));
        Pushed {
            reference: format!("{}/{repo}@{digest}", self.reg.host()),
            repo: repo.to_string(),
            manifest,
            digest,
        }
    }

    /// cosign's signature manifest for `a`: one simple signing layer per `(payload, annotations)`.
    fn sign_tag(&self, a: &Pushed, layers: &[(Vec<u8>, serde_json::Value)]) {
        let layers = layers
            .iter()
            .map(|(payload, annotations)| {
                let mut d = self.descriptor(&a.repo, SIMPLE_SIGNING, payload);
                d["annotations"] = annotations.clone();
                d
            })
            .collect();
        let tag = format!("{}.sig", a.digest.replace(':', "-"));
        self.manifest(&a.repo, &tag, layers, json!({}));
    }

    /// A keyless simple signing layer over `payload` by `signer`, logged at [`SIGNED_AT`].
    fn keyless(&self, signer: &Signer, payload: &[u8]) -> (Vec<u8>, serde_json::Value) {
        let sig = signer.sign(payload);
        let e = self
            .rekor
            .entry(payload, &sig, &signer.cert_der, "CERTIFICATE", SIGNED_AT);
        let chain = format!(
            "{}{}",
            pem_of("CERTIFICATE", &self.fulcio.intermediate_der),
            pem_of("CERTIFICATE", &self.fulcio.root_der)
        );
        let annotations = json!({
            "dev.cosignproject.cosign/signature": STANDARD.encode(&sig),
            "dev.sigstore.cosign/certificate": pem_of("CERTIFICATE", &signer.cert_der),
            "dev.sigstore.cosign/chain": chain,
            "dev.sigstore.cosign/bundle": rekor_bundle(&e).to_string(),
        });
        (payload.to_vec(), annotations)
    }

    /// A Sigstore bundle over `a`'s manifest by `signer`, referring to it, listed in the
    /// referrers tag schema's index.
    fn refer_bundle(&self, a: &Pushed, signer: &Signer) {
        let sig = signer.sign(&a.manifest);
        let e = self.rekor.entry(
            &a.manifest,
            &sig,
            &signer.cert_der,
            "CERTIFICATE",
            SIGNED_AT,
        );
        let bundle = sigstore_bundle(BUNDLE, &a.manifest, &sig, &signer.cert_der, Some(&e));
        let subject = json!({"mediaType": MANIFEST, "digest": a.digest, "size": a.manifest.len()});
        let layers = vec![self.descriptor(&a.repo, BUNDLE, bundle.as_bytes())];
        let extra = json!({"artifactType": BUNDLE, "subject": subject});
        let (referrer, digest) = self.manifest(&a.repo, "referrer", layers, extra);
        let index = json!({
            "schemaVersion": 2, "mediaType": INDEX,
            "manifests": [{"mediaType": MANIFEST, "digest": digest, "size": referrer.len(), "artifactType": BUNDLE}],
        });
        let tag = a.digest.replace(':', "-");
        let bytes = index.to_string().into_bytes();
        self.rt
            .block_on(self.reg.put_manifest(&a.repo, &tag, &bytes, INDEX));
    }

    /// The node's settings: the test's trusted root written into the image, the registry's CA.
    fn settings(&self, img: &Image) -> Settings {
        let path = "/etc/shim-agent/trusted-root.json";
        let host = img.root.resolve(path).unwrap();
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::write(&host, trusted_root(&[&self.fulcio], &[&self.rekor])).unwrap();
        let mut st = Settings::default();
        st.signatures.trusted_root = path.into();
        st.fetch.ca_file = self.reg.ca().display().to_string();
        st.fetch.attempts = 1;
        st
    }
}

/// cosign's simple signing payload about `digest`.
fn payload(repo: &str, digest: &str) -> Vec<u8> {
    json!({
        "critical": {
            "identity": {"docker-reference": repo},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature"
        },
        "optional": null
    })
    .to_string()
    .into_bytes()
}

/// The `dev.sigstore.cosign/bundle` annotation: the log's signed entry.
fn rekor_bundle(e: &LogEntry) -> serde_json::Value {
    json!({
        "SignedEntryTimestamp": STANDARD.encode(&e.set),
        "Payload": {
            "body": STANDARD.encode(&e.body),
            "integratedTime": e.integrated_time,
            "logIndex": e.log_index,
            "logID": hex::encode(&e.log_id)
        }
    })
}

fn from_oci(identity: SignerIdentity) -> SignatureSpec {
    SignatureSpec {
        from: MaterialFrom::Oci,
        signed_file: None,
        signature: None,
        certificate: None,
        bundle: None,
        identities: Some(vec![identity]),
        keys: None,
        allow_without_signed_time: None,
    }
}

fn exactly(identity: &str) -> SignerIdentity {
    SignerIdentity {
        identity: Some(identity.into()),
        identity_reg_exp: None,
        issuer: GITHUB_ISSUER.into(),
    }
}

fn shim(a: &Pushed, spec: SignatureSpec) -> ShimBuilder {
    ShimBuilder::new("wasmtime")
        .oci(&a.reference)
        .signature(spec)
}

fn install(img: &Image, st: &Settings, shim: ShimBuilder) -> anyhow::Result<()> {
    run_install_settings(img, &shim.yaml(), &image_root::opts(), st).map(|_| ())
}

/// Fails with `reason`, saying `says`, and changes nothing in the image.
fn refused(img: &Image, st: &Settings, shim: ShimBuilder, reason: &str, says: &str) {
    let before = deep_snapshot(img.root.path());
    let e = install(img, st, shim).unwrap_err();
    let typed = e
        .chain()
        .find_map(|c| c.downcast_ref::<TxnError>())
        .unwrap();
    let said = format!("{e:#}");
    assert_eq!(typed.reason(), reason, "{said}");
    assert!(said.contains(says), "expected {says:?} in: {said}");
    assert_eq!(
        deep_snapshot(img.root.path()),
        before,
        "the image changed: {said}"
    );
}

fn signature_of(img: &Image) -> shim_agent::state::SignatureRecord {
    let state = status::read_state(&img.root, &Settings::default()).unwrap();
    state.shims["wasmtime"].signature.clone().unwrap()
}

#[test]
fn cosigns_signature_tag_is_verified_keyless_and_keyed_before_the_install() {
    let Some(w) = world() else { return };
    // keyless, with the log's signed time; a stranger's signature before it is passed over
    let a = w.artifact("shims/keyless");
    let signer = w.fulcio.signer(&Leaf::runwasi());
    let evil = "https://github.com/evil/shims/.github/workflows/release.yml@refs/heads/main";
    let stranger = w.fulcio.signer(&Leaf::of(evil, GITHUB_ISSUER));
    let p = payload(&a.repo, &a.digest);
    w.sign_tag(&a, &[w.keyless(&stranger, &p), w.keyless(&signer, &p)]);
    let img = image();
    let st = w.settings(&img);
    install(&img, &st, shim(&a, from_oci(exactly(RUNWASI_IDENTITY)))).unwrap();
    let rec = signature_of(&img);
    assert_eq!(
        (rec.signed_by.as_str(), rec.signed_time),
        (RUNWASI_IDENTITY, Some(SIGNED_AT))
    );

    // keyed: cosign.pub in the Shim, the signature alone in the annotations
    let a = w.artifact("shims/keyed");
    let key = KeyPair::generate().unwrap();
    let p = payload(&a.repo, &a.digest);
    let sig = key.sign(&p).unwrap();
    w.sign_tag(
        &a,
        &[(
            p,
            json!({"dev.cosignproject.cosign/signature": STANDARD.encode(sig)}),
        )],
    );
    let spec = SignatureSpec {
        identities: None,
        keys: Some(vec![pem_of("PUBLIC KEY", &key.subject_public_key_info())]),
        ..from_oci(exactly(RUNWASI_IDENTITY))
    };
    let img = image();
    let st = w.settings(&img);
    install(&img, &st, shim(&a, spec)).unwrap();
    assert!(signature_of(&img).signed_by.starts_with("key sha256:"));
}

#[test]
fn a_sigstore_bundle_referring_to_the_artifact_is_found_through_the_referrers_tag_schema() {
    let Some(w) = world() else { return };
    let a = w.artifact("shims/bundled");
    w.refer_bundle(&a, &w.fulcio.signer(&Leaf::runwasi()));
    let img = image();
    let st = w.settings(&img);
    install(&img, &st, shim(&a, from_oci(exactly(RUNWASI_IDENTITY)))).unwrap();
    let rec = signature_of(&img);
    assert_eq!(
        (rec.signed_by.as_str(), rec.signed_time),
        (RUNWASI_IDENTITY, Some(SIGNED_AT))
    );
}

#[test]
fn attached_signatures_that_do_not_prove_the_artifact_are_refused_with_the_image_unchanged() {
    let Some(w) = world() else { return };
    let img = image();
    let st = w.settings(&img);
    let runwasi = w.fulcio.signer(&Leaf::runwasi());
    let spec = || from_oci(exactly(RUNWASI_IDENTITY));

    let a = w.artifact("shims/unsigned");
    refused(&img, &st, shim(&a, spec()), "SignatureMissing", &a.digest);

    // a payload about another manifest, signed and logged
    let a = w.artifact("shims/other");
    let other = format!("sha256:{}", sha256_hex(b"another manifest"));
    w.sign_tag(&a, &[w.keyless(&runwasi, &payload(&a.repo, &other))]);
    let says = format!(
        "the signature is over manifest {other}, the artifact is {}",
        a.digest
    );
    refused(&img, &st, shim(&a, spec()), "SignatureMismatch", &says);

    // another signer
    let a = w.artifact("shims/stranger");
    let evil = "https://github.com/evil/shims/.github/workflows/release.yml@refs/heads/main";
    let stranger = w.fulcio.signer(&Leaf::of(evil, GITHUB_ISSUER));
    w.sign_tag(&a, &[w.keyless(&stranger, &payload(&a.repo, &a.digest))]);
    refused(&img, &st, shim(&a, spec()), "SignerIdentityMismatch", evil);

    // a payload changed after it was signed
    let a = w.artifact("shims/tampered");
    let (_, annotations) = w.keyless(&runwasi, &payload(&a.repo, &a.digest));
    let mut changed: serde_json::Value =
        serde_json::from_slice(&payload(&a.repo, &a.digest)).unwrap();
    changed["optional"] = json!({"note": "changed"});
    w.sign_tag(&a, &[(changed.to_string().into_bytes(), annotations)]);
    refused(
        &img,
        &st,
        shim(&a, spec()),
        "SignatureMismatch",
        "does not match",
    );
}

#[test]
fn hostile_signature_manifests_are_refused_with_a_clear_reason() {
    let Some(w) = world() else { return };
    let img = image();
    let st = w.settings(&img);
    // a signature manifest past the 256 KiB read
    let a = w.artifact("shims/huge");
    let p = payload(&a.repo, &a.digest);
    let padding = json!({"dev.cosignproject.cosign/signature": "A".repeat(300 * 1024)});
    w.sign_tag(&a, &[(p, padding)]);
    let spec = || from_oci(exactly(RUNWASI_IDENTITY));
    refused(
        &img,
        &st,
        shim(&a, spec()),
        "SignatureMaterialInvalid",
        "larger than",
    );

    // a layer that says it is a terabyte (docker-registry checks that the blob exists, not
    // its size)
    let a = w.artifact("shims/liar");
    let mut layer = w.descriptor(&a.repo, SIMPLE_SIGNING, &payload(&a.repo, &a.digest));
    layer["size"] = json!(1_i64 << 40);
    let tag = format!("{}.sig", a.digest.replace(':', "-"));
    w.manifest(&a.repo, &tag, vec![layer], json!({}));
    refused(
        &img,
        &st,
        shim(&a, spec()),
        "SignatureMaterialInvalid",
        "bytes, not 0 to",
    );

    // a signature that is not base64
    let a = w.artifact("shims/garbled");
    let p = payload(&a.repo, &a.digest);
    w.sign_tag(
        &a,
        &[(
            p,
            json!({"dev.cosignproject.cosign/signature": "%%% not base64"}),
        )],
    );
    refused(
        &img,
        &st,
        shim(&a, spec()),
        "SignatureMaterialInvalid",
        "not base64",
    );
}

#[test]
fn a_node_requiring_signatures_refuses_an_oci_signed_shim_by_a_signer_it_does_not_trust() {
    let Some(w) = world() else { return };
    let img = image();
    let mut st = w.settings(&img);
    st.signatures.require = true;
    st.signatures.identities = vec![IdentitySetting {
        identity: RUNWASI_IDENTITY.into(),
        identity_regexp: String::new(),
        issuer: GITHUB_ISSUER.into(),
    }];
    // the Shim trusts any workflow of runwasi's; the node only its release workflow
    let nightly =
        "https://github.com/containerd/runwasi/.github/workflows/nightly.yml@refs/heads/main";
    let a = w.artifact("shims/nightly");
    let signer = w.fulcio.signer(&Leaf::of(nightly, GITHUB_ISSUER));
    w.sign_tag(&a, &[w.keyless(&signer, &payload(&a.repo, &a.digest))]);
    let spec = from_oci(SignerIdentity {
        identity: None,
        identity_reg_exp: Some(r"https://github\.com/containerd/runwasi/.+".into()),
        issuer: GITHUB_ISSUER.into(),
    });
    refused(&img, &st, shim(&a, spec), "SignatureRefusedByNode", nightly);
}

#[test]
fn attached_signatures_come_through_containerds_mirror_like_the_artifact() {
    let Some(w) = world() else { return };
    let a = w.artifact("shims/mirrored");
    let signer = w.fulcio.signer(&Leaf::runwasi());
    w.sign_tag(&a, &[w.keyless(&signer, &payload(&a.repo, &a.digest))]);
    w.refer_bundle(&a, &signer);
    // the Shim names a registry that never resolves (RFC 2606); the mirror is the real one
    let upstream = "upstream.invalid:5000";
    let hosts = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(hosts.path().join(upstream)).unwrap();
    std::fs::write(
        hosts.path().join(upstream).join("hosts.toml"),
        format!(
            "[host.\"https://{}\"]\n  capabilities = [\"pull\"]\n  ca = \"{}\"\n",
            w.reg.host(),
            w.reg.ca().display()
        ),
    )
    .unwrap();
    let retry = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
    };
    let fetcher = Fetcher::new(Limits::default(), retry)
        .unwrap()
        .with_registry_hosts(vec![hosts.path().to_path_buf()]);
    let src = OciSource {
        reference: format!("{upstream}/{}@{}", a.repo, a.digest),
        ..OciSource::default()
    };
    let found = w.rt.block_on(fetcher.attached_signatures(&src)).unwrap();
    let kinds: Vec<&str> = found
        .attached
        .iter()
        .map(|x| match x {
            Attached::Bundle { .. } => "bundle",
            Attached::SimpleSigning { .. } => "simple signing",
            Attached::Unreadable { .. } => "unreadable",
        })
        .collect();
    assert_eq!(kinds, ["bundle", "simple signing"]);
    assert_eq!(found.digest, a.digest);

    // a tag is refused: the signature is over a pinned manifest
    let tagged = OciSource {
        reference: format!("{upstream}/{}:v1", a.repo),
        ..OciSource::default()
    };
    let e =
        w.rt.block_on(fetcher.attached_signatures(&tagged))
            .unwrap_err();
    assert!(e.to_string().contains("pinned by digest"), "{e}");
}
