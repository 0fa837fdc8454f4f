//! Signed shims through the whole install path (`install --root` into an image root, the
//! same fetch and verify as on a node): the signature is checked on the fetched copy before
//! anything changes, as the Shim's `signature` and the node's `signatures` say; a refusal
//! leaves the image as it was; the state and `status` say who signed and when.

use shim_agent::api::signature::{MaterialFrom, SignatureSpec, SignerIdentity};
use shim_agent::cli::status;
use shim_agent::settings::{IdentitySetting, Settings};
use shim_agent::state::NodeState;
use shim_agent::txn::TxnError;

use crate::support::image_root::{
    self, Image, deep_snapshot, image, run_install_settings, write_artifact,
};
use crate::support::shim_builder::ShimBuilder;
use crate::support::sigstore::{
    Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, cosign_bundle, dot_pem,
    dot_sig, trusted_root,
};
use crate::support::{Entry, Route, TestServer, real_elf, tar_gz};

const BIN: &str = "containerd-shim-wasmtime-v1";

struct Signed {
    fulcio: Fulcio,
    rekor: Rekor,
}

fn signed() -> Signed {
    Signed {
        fulcio: Fulcio::new("fulcio"),
        rekor: Rekor::new(),
    }
}

/// A runwasi-shaped release tarball: the shim, its `.sig` and `.pem` beside it (signed by
/// `leaf`, over `signed_bytes`), and a cosign bundle logged at [`SIGNED_AT`].
fn tarball(s: &Signed, leaf: &Leaf<'_>, signed_bytes: &[u8]) -> Vec<u8> {
    let signer = s.fulcio.signer(leaf);
    let sig = signer.sign(signed_bytes);
    let entry = s.rekor.entry(
        signed_bytes,
        &sig,
        &signer.cert_der,
        "CERTIFICATE",
        SIGNED_AT,
    );
    tar_gz(&[
        Entry::File(BIN, real_elf(), 0o755),
        Entry::File(
            "containerd-shim-wasmtime-v1.sig",
            dot_sig(&sig).into_bytes(),
            0o644,
        ),
        Entry::File(
            "containerd-shim-wasmtime-v1.pem",
            dot_pem(&signer.cert_der).into_bytes(),
            0o644,
        ),
        Entry::File(
            "containerd-shim-wasmtime-v1.bundle",
            cosign_bundle(&sig, Some(&signer.cert_der), Some(&entry)).into_bytes(),
            0o644,
        ),
    ])
}

fn runwasi(identity: SignerIdentity) -> SignatureSpec {
    SignatureSpec {
        from: MaterialFrom::Artifact,
        signed_file: Some(BIN.into()),
        signature: Some(format!("{BIN}.sig")),
        certificate: Some(format!("{BIN}.pem")),
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

/// The node's settings, with the test's trusted root written into the image.
fn settings(img: &Image, s: &Signed) -> Settings {
    let path = "/etc/shim-agent/trusted-root.json";
    let host = img.root.resolve(path).unwrap();
    std::fs::create_dir_all(host.parent().unwrap()).unwrap();
    std::fs::write(&host, trusted_root(&[&s.fulcio], &[&s.rekor])).unwrap();
    let mut st = Settings::default();
    st.signatures.trusted_root = path.into();
    st
}

fn install(img: &Image, st: &Settings, shim: ShimBuilder) -> anyhow::Result<()> {
    run_install_settings(img, &shim.yaml(), &image_root::opts(), st).map(|_| ())
}

fn state_of(img: &Image) -> NodeState {
    status::read_state(&img.root, &Settings::default()).unwrap()
}

/// Fails with `reason`, saying `says`, and changes nothing in the image.
fn refused(img: &Image, st: &Settings, shim: ShimBuilder, reason: &str, says: &str) {
    let before = deep_snapshot(img.root.path());
    let e = install(img, st, shim).unwrap_err();
    let typed = e
        .chain()
        .find_map(|c| c.downcast_ref::<TxnError>())
        .unwrap();
    assert_eq!(typed.reason(), reason, "{e:#}");
    let said = format!("{e:#}");
    assert!(said.contains(says), "expected {says:?} in: {said}");
    assert_eq!(
        deep_snapshot(img.root.path()),
        before,
        "the image changed: {said}"
    );
}

#[test]
fn runwasis_sig_and_pem_install_when_accepted_without_a_signed_time_and_status_says_so() {
    let (img, s) = (image(), signed());
    let st = settings(&img, &s);
    let (url, sha) = write_artifact(
        &img,
        "wasmtime.tgz",
        &tarball(&s, &Leaf::runwasi(), &real_elf()),
    );
    let shim = |allow: Option<bool>| {
        let mut spec = runwasi(exactly(RUNWASI_IDENTITY));
        spec.allow_without_signed_time = allow;
        ShimBuilder::new("wasmtime")
            .artifact(&url, &sha)
            .signature(spec)
    };
    // by default a signature without a signed time is refused
    refused(&img, &st, shim(None), "NoSignedTime", "has no signed time");
    install(&img, &st, shim(Some(true))).unwrap();
    let rec = state_of(&img).shims["wasmtime"].signature.clone().unwrap();
    assert_eq!(
        (
            rec.file.as_str(),
            rec.signed_by.as_str(),
            rec.signed_time,
            rec.node_policy
        ),
        (BIN, RUNWASI_IDENTITY, None, false)
    );
    let table = status::format_status_table(&state_of(&img));
    assert!(
        table.contains(&format!(
            "signed: wasmtime {BIN}: verified, signed by {RUNWASI_IDENTITY} (issuer {GITHUB_ISSUER}), with no signed time checked"
        )),
        "{table}"
    );
}

#[test]
fn a_bundle_in_the_artifact_gives_the_signed_time() {
    let (img, s) = (image(), signed());
    let st = settings(&img, &s);
    let (url, sha) = write_artifact(
        &img,
        "wasmtime.tgz",
        &tarball(&s, &Leaf::runwasi(), &real_elf()),
    );
    let mut spec = runwasi(exactly(RUNWASI_IDENTITY));
    (spec.signature, spec.certificate, spec.bundle) = (None, None, Some(format!("{BIN}.bundle")));
    install(
        &img,
        &st,
        ShimBuilder::new("wasmtime")
            .artifact(&url, &sha)
            .signature(spec),
    )
    .unwrap();
    let rec = state_of(&img).shims["wasmtime"].signature.clone().unwrap();
    assert_eq!(rec.signed_time, Some(SIGNED_AT));
    assert!(
        status::format_status_table(&state_of(&img)).contains("signed at 2026-01-01T00:00:00Z"),
    );
}

#[test]
fn a_tampered_shim_another_signer_and_missing_material_are_refused_with_the_image_unchanged() {
    let (img, s) = (image(), signed());
    let st = settings(&img, &s);
    let accept = |mut spec: SignatureSpec| {
        spec.allow_without_signed_time = Some(true);
        spec
    };
    // signed over other bytes than the shim it ships
    let (url, sha) = write_artifact(
        &img,
        "tampered.tgz",
        &tarball(&s, &Leaf::runwasi(), b"other"),
    );
    let shim = ShimBuilder::new("wasmtime")
        .artifact(&url, &sha)
        .signature(accept(runwasi(exactly(RUNWASI_IDENTITY))));
    refused(
        &img,
        &st,
        shim,
        "SignatureMismatch",
        "does not match containerd-shim-wasmtime-v1",
    );
    // signed by a fork
    let fork = "https://github.com/fork/runwasi/.github/workflows/action-build.yml@refs/heads/main";
    let (url, sha) = write_artifact(
        &img,
        "fork.tgz",
        &tarball(&s, &Leaf::of(fork, GITHUB_ISSUER), &real_elf()),
    );
    let shim = ShimBuilder::new("wasmtime")
        .artifact(&url, &sha)
        .signature(accept(runwasi(exactly(RUNWASI_IDENTITY))));
    refused(&img, &st, shim, "SignerIdentityMismatch", fork);
    // the policy names a .sig the artifact does not have
    let (url, sha) = write_artifact(
        &img,
        "good.tgz",
        &tarball(&s, &Leaf::runwasi(), &real_elf()),
    );
    let mut spec = accept(runwasi(exactly(RUNWASI_IDENTITY)));
    spec.signature = Some("missing.sig".into());
    let shim = ShimBuilder::new("wasmtime")
        .artifact(&url, &sha)
        .signature(spec);
    refused(
        &img,
        &st,
        shim,
        "SignatureMissing",
        "no signature at missing.sig",
    );
}

#[test]
fn a_node_that_requires_signatures_refuses_an_unsigned_shim_before_downloading_it() {
    let (img, s) = (image(), signed());
    let mut st = settings(&img, &s);
    st.signatures.require = true;
    st.signatures.identities = vec![IdentitySetting {
        identity: RUNWASI_IDENTITY.into(),
        identity_regexp: String::new(),
        issuer: GITHUB_ISSUER.into(),
    }];
    let server = TestServer::start();
    server.route("/demo.tgz", Route::ok(crate::support::good_shim_tgz()));
    let shim = ShimBuilder::new("demo").artifact(&server.url("/demo.tgz"), &"ab".repeat(32));
    refused(
        &img,
        &st,
        shim,
        "SignatureRequiredByNode",
        "this node requires signed shims",
    );
    assert_eq!(
        server.hits("/demo.tgz"),
        0,
        "downloaded before the node's policy was asked"
    );
}

#[test]
fn a_node_policy_stricter_than_the_shims_refuses_what_the_shim_accepts() {
    let (img, s) = (image(), signed());
    let mut st = settings(&img, &s);
    st.signatures.require = true;
    st.signatures.allow_without_signed_time = true;
    st.signatures.identities = vec![IdentitySetting {
        identity: RUNWASI_IDENTITY.into(),
        identity_regexp: String::new(),
        issuer: GITHUB_ISSUER.into(),
    }];
    // the Shim trusts any workflow of runwasi's; the node only its release workflow
    let nightly =
        "https://github.com/containerd/runwasi/.github/workflows/nightly.yml@refs/heads/main";
    let (url, sha) = write_artifact(
        &img,
        "nightly.tgz",
        &tarball(&s, &Leaf::of(nightly, GITHUB_ISSUER), &real_elf()),
    );
    let mut spec = runwasi(SignerIdentity {
        identity: None,
        identity_reg_exp: Some(r"https://github\.com/containerd/runwasi/.+".into()),
        issuer: GITHUB_ISSUER.into(),
    });
    spec.allow_without_signed_time = Some(true);
    let shim = ShimBuilder::new("wasmtime")
        .artifact(&url, &sha)
        .signature(spec.clone());
    // the registry is the process's: other tests count too, so only a rise is asserted (no
    // other test is refused for this reason)
    let before = counted("refused", "SignatureRefusedByNode");
    refused(&img, &st, shim, "SignatureRefusedByNode", nightly);
    assert!(counted("refused", "SignatureRefusedByNode") > before);
    let verified = counted("verified", "");
    // the release workflow's build passes both, and the record says the node checked it too
    let (url, sha) = write_artifact(
        &img,
        "release.tgz",
        &tarball(&s, &Leaf::runwasi(), &real_elf()),
    );
    install(
        &img,
        &st,
        ShimBuilder::new("wasmtime")
            .artifact(&url, &sha)
            .signature(spec),
    )
    .unwrap();
    assert!(
        state_of(&img).shims["wasmtime"]
            .signature
            .as_ref()
            .unwrap()
            .node_policy
    );
    assert!(counted("verified", "") > verified);
}

#[test]
fn material_beside_the_artifact_is_fetched_from_its_url() {
    let (img, s) = (image(), signed());
    let st = settings(&img, &s);
    let signer = s.fulcio.signer(&Leaf::runwasi());
    let art = crate::support::good_shim_tgz();
    // a keyless signature over the artifact as downloaded, logged
    let sig = signer.sign(&art);
    let entry = s
        .rekor
        .entry(&art, &sig, &signer.cert_der, "CERTIFICATE", SIGNED_AT);
    let server = TestServer::start();
    server.route("/demo.tgz", Route::ok(art.clone()));
    server.route(
        "/demo.tgz.bundle",
        Route::ok(cosign_bundle(&sig, Some(&signer.cert_der), Some(&entry)).into_bytes()),
    );
    let spec = SignatureSpec {
        from: MaterialFrom::Url,
        signed_file: None,
        signature: None,
        certificate: None,
        bundle: Some(server.url("/demo.tgz.bundle")),
        identities: Some(vec![exactly(RUNWASI_IDENTITY)]),
        keys: None,
        allow_without_signed_time: None,
    };
    let shim = ShimBuilder::new("demo")
        .artifact(&server.url("/demo.tgz"), &crate::support::sha256_hex(&art))
        .signature(spec);
    install(&img, &st, shim).unwrap();
    let rec = state_of(&img).shims["demo"].signature.clone().unwrap();
    assert_eq!(
        (rec.file.as_str(), rec.signed_time),
        ("artifact", Some(SIGNED_AT))
    );
}

/// `shim_agent_signature_checks_total` for this result and reason.
fn counted(result: &str, reason: &str) -> u64 {
    let text = shim_agent::telemetry::metrics().encode();
    let (result, reason) = (
        format!("result=\"{result}\""),
        format!("reason=\"{reason}\""),
    );
    text.lines()
        .filter(|l| l.starts_with("shim_agent_signature_checks_total{"))
        .filter(|l| l.contains(&result) && l.contains(&reason))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}
