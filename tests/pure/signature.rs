//! Signed shims, verified offline: every acceptance and every refusal of
//! `shim_agent::signature`, with a private CA playing Fulcio and a key playing Rekor made in
//! the test (tests/support/sigstore.rs). Each refusal names the file and what was expected.

use shim_agent::signature::{
    Material, PublicKey, SignedBy, Subject, Trust, TrustedIdentity, TrustedRoot, file_sha256,
    material, verify,
};

use crate::support::sigstore::{
    Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, cosign_bundle, dot_pem,
    dot_sig, pem_of, runwasi_trust, sigstore_bundle, trusted_root,
};

const FILE: &str = "containerd-shim-wasmtime-v1";
const SHIM: &[u8] = b"\x7fELF the shim's bytes";

struct World {
    fulcio: Fulcio,
    rekor: Rekor,
    root: TrustedRoot,
}

fn world() -> World {
    let fulcio = Fulcio::new("test-fulcio");
    let rekor = Rekor::new();
    let root = TrustedRoot::from_json(&trusted_root(&[&fulcio], &[&rekor]), "test root").unwrap();
    World {
        fulcio,
        rekor,
        root,
    }
}

/// A keyless cosign bundle over `file` by `leaf`, logged at `at`.
fn bundle(w: &World, leaf: &Leaf<'_>, file: &[u8], at: i64) -> Material {
    let s = w.fulcio.signer(leaf);
    let sig = s.sign(file);
    let e = w.rekor.entry(file, &sig, &s.cert_der, "CERTIFICATE", at);
    material::bundle(cosign_bundle(&sig, Some(&s.cert_der), Some(&e)).as_bytes()).unwrap()
}

#[test]
fn a_cosign_bundle_proves_the_identity_and_the_signed_time() {
    let w = world();
    let m = bundle(&w, &Leaf::runwasi(), SHIM, SIGNED_AT);
    let v = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap();
    assert_eq!(
        v.signed_by,
        SignedBy::Identity {
            identity: RUNWASI_IDENTITY.into(),
            issuer: GITHUB_ISSUER.into()
        }
    );
    assert_eq!((v.signed_time, v.log_index), (Some(SIGNED_AT), Some(4242)));
}

#[test]
fn runwasis_sig_and_pem_have_no_signed_time_and_are_refused_unless_the_policy_accepts_that() {
    let w = world();
    let s = w.fulcio.signer(&Leaf::runwasi());
    let m = material::detached(
        dot_sig(&s.sign(SHIM)).as_bytes(),
        Some(dot_pem(&s.cert_der).as_bytes()),
    )
    .unwrap();
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "NoSignedTime");
    assert!(e.to_string().starts_with(FILE), "{e}");
    let lenient = Trust {
        without_signed_time: true,
        ..runwasi_trust()
    };
    let v = verify(FILE, &file_sha256(SHIM), &m, &lenient, &w.root).unwrap();
    assert_eq!(v.signed_time, None, "no signed time was checked");
    // a plain PEM .pem reads the same
    let plain = material::detached(
        dot_sig(&s.sign(SHIM)).as_bytes(),
        Some(pem_of("CERTIFICATE", &s.cert_der).as_bytes()),
    )
    .unwrap();
    assert!(verify(FILE, &file_sha256(SHIM), &plain, &lenient, &w.root).is_ok());
}

#[test]
fn another_identity_is_refused_naming_the_one_found_and_the_one_expected() {
    let w = world();
    let fork =
        "https://github.com/someone/runwasi/.github/workflows/action-build.yml@refs/heads/main";
    let m = bundle(&w, &Leaf::of(fork, GITHUB_ISSUER), SHIM, SIGNED_AT);
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignerIdentityMismatch");
    let said = e.to_string();
    assert!(
        said.contains(FILE) && said.contains(fork) && said.contains(RUNWASI_IDENTITY),
        "{said}"
    );
}

#[test]
fn the_right_identity_from_another_issuer_is_refused() {
    let w = world();
    let m = bundle(
        &w,
        &Leaf::of(RUNWASI_IDENTITY, "https://accounts.example"),
        SHIM,
        SIGNED_AT,
    );
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignerIssuerMismatch");
    let said = e.to_string();
    assert!(
        said.contains("https://accounts.example") && said.contains(GITHUB_ISSUER),
        "{said}"
    );
}

#[test]
fn an_identity_pattern_matches_the_whole_identity_only() {
    let w = world();
    let trust = |re: &str| Trust {
        identities: vec![TrustedIdentity {
            subject: Subject::pattern(re).unwrap(),
            issuer: GITHUB_ISSUER.into(),
        }],
        ..Trust::default()
    };
    let m = bundle(&w, &Leaf::runwasi(), SHIM, SIGNED_AT);
    let org =
        r"https://github\.com/containerd/runwasi/\.github/workflows/.+@refs/(heads/main|tags/v.*)";
    assert!(verify(FILE, &file_sha256(SHIM), &m, &trust(org), &w.root).is_ok());
    // a prefix is not the whole identity
    let e = verify(
        FILE,
        &file_sha256(SHIM),
        &m,
        &trust(r"https://github\.com/containerd"),
        &w.root,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "SignerIdentityMismatch");
    assert!(
        e.to_string()
            .contains("an identity matching /https://github\\.com/containerd/"),
        "{e}"
    );
    assert!(Subject::pattern("(").is_err());
}

#[test]
fn a_certificate_expired_at_the_signed_time_is_refused() {
    let w = world();
    // logged an hour after the ten-minute certificate ended
    let m = bundle(&w, &Leaf::runwasi(), SHIM, SIGNED_AT + 3600);
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "CertificateExpired");
    assert!(e.to_string().contains("2026-01-01T01:00:00Z"), "{e}");
}

#[test]
fn a_tampered_file_and_a_signature_over_another_file_are_refused() {
    let w = world();
    let m = bundle(&w, &Leaf::runwasi(), SHIM, SIGNED_AT);
    let e = verify(
        FILE,
        &file_sha256(b"\x7fELF tampered"),
        &m,
        &runwasi_trust(),
        &w.root,
    )
    .unwrap_err();
    assert_eq!(e.reason(), "SignatureMismatch");
    assert!(e.to_string().contains(FILE), "{e}");
    // the signature and the log entry are about another file
    let other = bundle(&w, &Leaf::runwasi(), b"another file", SIGNED_AT);
    let e = verify(FILE, &file_sha256(SHIM), &other, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignatureMismatch");
}

#[test]
fn a_log_entry_about_another_file_or_from_an_unknown_log_is_refused() {
    let w = world();
    let s = w.fulcio.signer(&Leaf::runwasi());
    let sig = s.sign(SHIM);
    let wrong_file = w
        .rekor
        .entry(b"other", &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
    let m = material::bundle(cosign_bundle(&sig, Some(&s.cert_der), Some(&wrong_file)).as_bytes())
        .unwrap();
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "LogEntryInvalid");
    assert!(e.to_string().contains("about another file"), "{e}");

    let stranger = Rekor::new().entry(SHIM, &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
    let m = material::bundle(cosign_bundle(&sig, Some(&s.cert_der), Some(&stranger)).as_bytes())
        .unwrap();
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "LogEntryInvalid");
    assert!(e.to_string().contains("does not name"), "{e}");

    // a log time moved after signing no longer matches the log's signature
    let mut moved = w
        .rekor
        .entry(SHIM, &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
    moved.integrated_time += 1;
    let m =
        material::bundle(cosign_bundle(&sig, Some(&s.cert_der), Some(&moved)).as_bytes()).unwrap();
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert!(
        e.to_string()
            .contains("signed entry timestamp does not verify"),
        "{e}"
    );
}

#[test]
fn a_certificate_from_an_untrusted_ca_or_not_for_code_signing_is_refused() {
    let w = world();
    let rogue = Fulcio::new("rogue");
    let s = rogue.signer(&Leaf::runwasi());
    let sig = s.sign(SHIM);
    let e_ = w
        .rekor
        .entry(SHIM, &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
    let m = material::bundle(cosign_bundle(&sig, Some(&s.cert_der), Some(&e_)).as_bytes()).unwrap();
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "CertificateUntrusted");
    assert!(e.to_string().contains("unknown issuer"), "{e}");

    let leaf = Leaf {
        code_signing: false,
        ..Leaf::runwasi()
    };
    let m = bundle(&w, &leaf, SHIM, SIGNED_AT);
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "CertificateUntrusted");
    assert!(e.to_string().contains("not for code signing"), "{e}");
}

#[test]
fn a_keyed_signature_verifies_with_a_trusted_key_only() {
    let w = world();
    let signer = rcgen::KeyPair::generate().unwrap();
    let spki = rcgen::PublicKeyData::subject_public_key_info(&signer);
    let key = PublicKey::from_pem(&pem_of("PUBLIC KEY", &spki)).unwrap();
    let sig = rcgen::SigningKey::sign(&signer, SHIM).unwrap();
    let m = material::detached(dot_sig(&sig).as_bytes(), None).unwrap();
    let trust = Trust {
        keys: vec![key.clone()],
        ..Trust::default()
    };
    let v = verify(FILE, &file_sha256(SHIM), &m, &trust, &w.root).unwrap();
    assert_eq!(
        v.signed_by,
        SignedBy::Key {
            fingerprint: key.fingerprint()
        }
    );
    assert_eq!(v.signed_time, None);
    // logged: the entry gives the time
    let e_ = w.rekor.entry(SHIM, &sig, &spki, "PUBLIC KEY", SIGNED_AT);
    let logged = material::bundle(cosign_bundle(&sig, None, Some(&e_)).as_bytes()).unwrap();
    assert_eq!(
        verify(FILE, &file_sha256(SHIM), &logged, &trust, &w.root)
            .unwrap()
            .signed_time,
        Some(SIGNED_AT)
    );

    let other = rcgen::KeyPair::generate().unwrap();
    let other_key =
        PublicKey::from_spki(&rcgen::PublicKeyData::subject_public_key_info(&other)).unwrap();
    let wrong = Trust {
        keys: vec![other_key.clone()],
        ..Trust::default()
    };
    let e = verify(FILE, &file_sha256(SHIM), &m, &wrong, &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignerKeyUntrusted");
    assert!(e.to_string().contains(&other_key.fingerprint()), "{e}");
    // a policy of identities only refuses a keyed signature
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignerKeyUntrusted");
    // a keyless signature under a policy of keys only
    let keyless = bundle(&w, &Leaf::runwasi(), SHIM, SIGNED_AT);
    let e = verify(FILE, &file_sha256(SHIM), &keyless, &trust, &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignerIdentityMismatch");
    assert!(
        e.to_string().contains("trusts no certificate identity"),
        "{e}"
    );
}

#[test]
fn sigstore_bundles_v0_1_to_v0_3_verify_and_their_digest_must_be_the_files() {
    let w = world();
    let s = w.fulcio.signer(&Leaf::runwasi());
    let sig = s.sign(SHIM);
    let e_ = w
        .rekor
        .entry(SHIM, &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
    for media in [
        "application/vnd.dev.sigstore.bundle+json;version=0.1",
        "application/vnd.dev.sigstore.bundle+json;version=0.2",
        "application/vnd.dev.sigstore.bundle+json;version=0.3",
        "application/vnd.dev.sigstore.bundle.v0.3+json",
    ] {
        let m =
            material::bundle(sigstore_bundle(media, SHIM, &sig, &s.cert_der, Some(&e_)).as_bytes())
                .unwrap();
        let v = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap();
        assert_eq!(v.signed_time, Some(SIGNED_AT), "{media}");
        // its digest names another file
        let m = material::bundle(
            sigstore_bundle(media, b"other", &sig, &s.cert_der, Some(&e_)).as_bytes(),
        )
        .unwrap();
        let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
        assert_eq!(e.reason(), "SignatureMismatch", "{media}");
    }
    let e =
        material::bundle(br#"{"mediaType":"application/vnd.dev.sigstore.bundle+json;version=9"}"#)
            .unwrap_err();
    assert!(e.contains("version=9"), "{e}");
}

#[test]
fn hostile_material_is_an_error_never_a_panic() {
    let w = world();
    let good = cosign_bundle(b"sig", None, None);
    let mut inputs: Vec<Vec<u8>> = vec![
        vec![],
        b"{}".to_vec(),
        b"null".to_vec(),
        br#"{"base64Signature":"!!"}"#.to_vec(),
        br#"{"base64Signature":"AA==","cert":"AA=="}"#.to_vec(),
        br#"{"base64Signature":"AA==","rekorBundle":{"SignedEntryTimestamp":"AA==","Payload":{"body":"AA==","integratedTime":-1,"logIndex":0,"logID":"zz"}}}"#.to_vec(),
        br#"{"mediaType":"application/vnd.dev.sigstore.bundle+json;version=0.3","verificationMaterial":{"certificate":{"rawBytes":"AAAA"},"tlogEntries":[{"logIndex":"x","logId":{"keyId":""},"integratedTime":"1","inclusionPromise":{"signedEntryTimestamp":""},"canonicalizedBody":""}]},"messageSignature":{"signature":""}}"#.to_vec(),
        good.as_bytes().to_vec(),
    ];
    // every prefix of a real bundle
    let real = {
        let s = w.fulcio.signer(&Leaf::runwasi());
        let sig = s.sign(SHIM);
        let e_ = w
            .rekor
            .entry(SHIM, &sig, &s.cert_der, "CERTIFICATE", SIGNED_AT);
        cosign_bundle(&sig, Some(&s.cert_der), Some(&e_))
    };
    for n in (0..real.len()).step_by(7) {
        inputs.push(real.as_bytes()[..n].to_vec());
    }
    for input in &inputs {
        if let Ok(m) = material::bundle(input) {
            let _ = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root);
        }
        let _ = material::detached(input, Some(input));
    }
    // a certificate that is not one, with a signature: an error naming the file
    let m = Material {
        signature: vec![1, 2, 3],
        certificate: Some(vec![0x30, 0x03, 0x02, 0x01, 0x01]),
        ..Material::default()
    };
    let e = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root).unwrap_err();
    assert_eq!(e.reason(), "SignatureMaterialInvalid");
    assert!(e.to_string().contains(FILE), "{e}");
}
