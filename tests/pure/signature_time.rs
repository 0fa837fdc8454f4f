//! Signed times besides a log's signed entry timestamp: RFC 3161 timestamps of a timestamp
//! authority, and log entries shown by an inclusion proof and checkpoint alone (Rekor v2's,
//! or v1's without their SET), which prove the log holds them but sign no time. A token or
//! a proof that does not verify refuses the signature, naming the file and what was wrong.

use shim_agent::signature::{
    Material, TimeSource, TrustedRoot, Verified, file_sha256, material, verify,
};

use crate::support::sigstore::{
    Fulcio, Leaf, Rekor, SIGNED_AT, Signer, Tsa, runwasi_trust, sigstore_bundle,
    trusted_root_with_tsa, with_inclusion_proof, with_timestamps,
};

const FILE: &str = "containerd-shim-wasmtime-v1";
const SHIM: &[u8] = b"\x7fELF the shim's bytes";
const V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

struct World {
    fulcio: Fulcio,
    rekor: Rekor,
    tsa: Tsa,
    signer: Signer,
    sig: Vec<u8>,
}

fn world() -> World {
    let fulcio = Fulcio::new("test-fulcio");
    let signer = fulcio.signer(&Leaf::runwasi());
    let sig = signer.sign(SHIM);
    World {
        fulcio,
        rekor: Rekor::new(),
        tsa: Tsa::new("test-tsa"),
        signer,
        sig,
    }
}

impl World {
    fn root(&self) -> TrustedRoot {
        let json = trusted_root_with_tsa(&[&self.fulcio], &[&self.rekor], &[], &[&self.tsa]);
        TrustedRoot::from_json(&json, "test root").unwrap()
    }

    /// A v0.3 bundle with a Rekor v2-shaped entry (its inclusion proof only) and `stamps`.
    fn v2_bundle(&self, stamps: &[Vec<u8>]) -> String {
        let e = self.rekor.entry_v2(SHIM, &self.sig, &self.signer.cert_der);
        let b = sigstore_bundle(V03, SHIM, &self.sig, &self.signer.cert_der, Some(&e));
        with_timestamps(
            &with_inclusion_proof(&b, self.rekor.inclusion_proof(&e)),
            stamps,
        )
    }

    /// A v0.3 bundle with a Rekor v1 entry logged at `at`, with its SET only when `set`, and
    /// its inclusion proof (`proof` changes it).
    fn v1_bundle(&self, set: bool, proof: impl Fn(&mut serde_json::Value)) -> String {
        let mut e = self.rekor.entry(
            SHIM,
            &self.sig,
            &self.signer.cert_der,
            "CERTIFICATE",
            SIGNED_AT,
        );
        let mut p = self.rekor.inclusion_proof(&e);
        proof(&mut p);
        if !set {
            e.set.clear();
        }
        let b = sigstore_bundle(V03, SHIM, &self.sig, &self.signer.cert_der, Some(&e));
        with_inclusion_proof(&b, p)
    }
}

fn check(w: &World, bundle: &str) -> Result<Verified, shim_agent::signature::SignatureError> {
    let m: Material = material::bundle(bundle.as_bytes()).unwrap();
    verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root())
}

/// The refusal's reason, and that its message names the file and says `says`.
fn refused(w: &World, bundle: &str, reason: &str, says: &str) {
    let e = check(w, bundle).unwrap_err();
    let said = e.to_string();
    assert_eq!(e.reason(), reason, "{said}");
    assert!(said.starts_with(FILE) && said.contains(says), "{said}");
}

#[test]
fn a_rekor_v2_entry_with_a_timestamp_is_accepted_at_the_timestamps_time() {
    let w = world();
    let v = check(&w, &w.v2_bundle(&[w.tsa.stamp(&w.sig, SIGNED_AT + 5)])).unwrap();
    assert_eq!(v.signed_time, Some(SIGNED_AT + 5));
    assert_eq!(v.time_source, Some(TimeSource::TimestampAuthority));
}

#[test]
fn a_rekor_v2_entry_without_a_timestamp_has_no_signed_time() {
    let w = world();
    refused(&w, &w.v2_bundle(&[]), "NoSignedTime", "no signed time");
}

#[test]
fn a_timestamp_alone_gives_the_signed_time_of_a_bundle_without_a_log_entry() {
    let w = world();
    let b = sigstore_bundle(V03, SHIM, &w.sig, &w.signer.cert_der, None);
    let v = check(&w, &with_timestamps(&b, &[w.tsa.stamp(&w.sig, SIGNED_AT)])).unwrap();
    assert_eq!(
        (v.signed_time, v.time_source),
        (Some(SIGNED_AT), Some(TimeSource::TimestampAuthority))
    );
}

#[test]
fn a_timestamp_over_another_signature_is_refused() {
    let w = world();
    let other = w.signer.sign(b"another file");
    let b = w.v2_bundle(&[w.tsa.stamp(&other, SIGNED_AT)]);
    refused(&w, &b, "TimestampInvalid", "it stamps another signature");
}

#[test]
fn a_timestamp_by_an_authority_the_root_does_not_name_is_refused() {
    let w = world();
    let rogue = Tsa::new("rogue-tsa");
    let b = w.v2_bundle(&[rogue.stamp(&w.sig, SIGNED_AT)]);
    refused(
        &w,
        &b,
        "TimestampInvalid",
        "does not chain to a timestamp authority",
    );
}

#[test]
fn a_timestamp_outside_the_authoritys_validity_is_refused() {
    let mut w = world();
    w.tsa.valid_for = (SIGNED_AT + 3600, SIGNED_AT + 7200);
    let b = w.v2_bundle(&[w.tsa.stamp(&w.sig, SIGNED_AT)]);
    refused(
        &w,
        &b,
        "TimestampInvalid",
        "no timestamp authority of the trusted root is valid",
    );
}

#[test]
fn a_timestamp_after_the_certificate_ended_is_refused_as_expired() {
    let w = world();
    let b = w.v2_bundle(&[w.tsa.stamp(&w.sig, SIGNED_AT + 3600)]);
    refused(&w, &b, "CertificateExpired", "not valid at the signed time");
}

#[test]
fn a_tampered_or_malformed_timestamp_is_refused_and_nothing_panics() {
    let w = world();
    let good = w.tsa.stamp(&w.sig, SIGNED_AT);
    // each byte flipped in turn: never a panic, and never another time; a flip is accepted
    // only in what nothing signs and nothing needs (the SignedData's version, its list of
    // digest algorithms)
    let mut accepted = 0;
    for i in 0..good.len() {
        let mut t = good.clone();
        t[i] ^= 0x01;
        let m = material::bundle(w.v2_bundle(&[t]).as_bytes()).unwrap();
        if let Ok(v) = verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root()) {
            assert_eq!(v.signed_time, Some(SIGNED_AT), "byte {i} flipped");
            accepted += 1;
        }
    }
    assert!(accepted < 16, "{accepted} flips accepted");
    for junk in [
        vec![],
        vec![0x30],
        vec![0x30, 0x80],
        b"not DER".to_vec(),
        good[..good.len() / 2].to_vec(),
    ] {
        refused(
            &w,
            &w.v2_bundle(&[junk]),
            "TimestampInvalid",
            "RFC 3161 timestamp",
        );
    }
    // more than the Sigstore clients check
    let many = material::bundle(w.v2_bundle(&vec![good.clone(); 33]).as_bytes()).unwrap_err();
    assert!(many.contains("33 RFC 3161 timestamps"), "{many}");
    // the TSTInfo changed after signing: its signed digest no longer matches
    let mut t = good.clone();
    let at = t.windows(15).position(|win| win.ends_with(b"Z")).unwrap();
    t[at + 13] ^= 0x01;
    refused(
        &w,
        &w.v2_bundle(&[t]),
        "TimestampInvalid",
        "RFC 3161 timestamp",
    );
}

#[test]
fn a_rekor_v1_entry_with_only_an_inclusion_proof_signs_no_time() {
    let w = world();
    // integratedTime is outside the tree and unsigned without the SET (as sigstore-go and
    // sigstore-python read it): inclusion, but no signed time
    refused(
        &w,
        &w.v1_bundle(false, |_| ()),
        "NoSignedTime",
        "no signed time",
    );
    // with a timestamp, the timestamp's time
    let b = with_timestamps(
        &w.v1_bundle(false, |_| ()),
        &[w.tsa.stamp(&w.sig, SIGNED_AT)],
    );
    let v = check(&w, &b).unwrap();
    assert_eq!(v.time_source, Some(TimeSource::TimestampAuthority));
    // with its SET and its proof, the log's
    let v = check(&w, &w.v1_bundle(true, |_| ())).unwrap();
    assert_eq!(
        (v.signed_time, v.time_source),
        (Some(SIGNED_AT), Some(TimeSource::Log))
    );
}

#[test]
fn a_bad_inclusion_proof_or_checkpoint_is_refused_even_beside_a_good_set() {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    let w = world();
    let zero = STANDARD.encode([0u8; 32]);
    let other = Rekor::new();
    for (set, why, change, says) in [
        (
            true,
            "an audit path to another root",
            Box::new(|p: &mut serde_json::Value| p["hashes"][0] = zero.clone().into())
                as Box<dyn Fn(&mut serde_json::Value)>,
            "inclusion proof does not verify",
        ),
        (
            false,
            "a checkpoint signed by another key",
            Box::new(|p: &mut serde_json::Value| {
                let root = STANDARD.decode(p["rootHash"].as_str().unwrap()).unwrap();
                p["checkpoint"]["envelope"] = other.checkpoint(3, &root).into();
            }),
            "checkpoint is not signed by",
        ),
        (
            false,
            "a checkpoint of another root",
            Box::new(|p: &mut serde_json::Value| {
                p["checkpoint"]["envelope"] = w.rekor.checkpoint(3, &[7u8; 32]).into();
            }),
            "checkpoint names another root hash",
        ),
        (
            true,
            "a checkpoint of another size",
            Box::new(|p: &mut serde_json::Value| {
                let root = STANDARD.decode(p["rootHash"].as_str().unwrap()).unwrap();
                p["checkpoint"]["envelope"] = w.rekor.checkpoint(4, &root).into();
            }),
            "checkpoint is of another tree size",
        ),
        (
            false,
            "an index outside the tree",
            Box::new(|p: &mut serde_json::Value| p["logIndex"] = "3".into()),
            "names index 3 in a tree of 3",
        ),
        (
            false,
            "a checkpoint with no signature",
            Box::new(|p: &mut serde_json::Value| p["checkpoint"]["envelope"] = "x\n3\n\n".into()),
            "checkpoint",
        ),
    ] {
        let b = w.v1_bundle(set, change);
        let e = check(&w, &b).unwrap_err();
        assert_eq!(e.reason(), "LogEntryInvalid", "{why}: {e}");
        assert!(e.to_string().contains(says), "{why}: {e}");
    }
}

#[test]
fn a_rekor_v2_entry_about_another_signature_or_certificate_is_refused() {
    let w = world();
    let other = w.fulcio.signer(&Leaf::runwasi());
    for (e, says) in [
        (
            w.rekor
                .entry_v2(SHIM, &other.sign(SHIM), &w.signer.cert_der),
            "another signature",
        ),
        (
            w.rekor.entry_v2(SHIM, &w.sig, &other.cert_der),
            "another certificate or key",
        ),
        (
            w.rekor.entry_v2(b"other", &w.sig, &w.signer.cert_der),
            "another file",
        ),
    ] {
        let b = sigstore_bundle(V03, SHIM, &w.sig, &w.signer.cert_der, Some(&e));
        let b = with_timestamps(
            &with_inclusion_proof(&b, w.rekor.inclusion_proof(&e)),
            &[w.tsa.stamp(&w.sig, SIGNED_AT)],
        );
        refused(&w, &b, "LogEntryInvalid", says);
    }
}

#[test]
fn hostile_proofs_checkpoints_and_timestamps_are_errors_never_panics() {
    let w = world();
    let real = w.v2_bundle(&[w.tsa.stamp(&w.sig, SIGNED_AT)]);
    let mut inputs: Vec<Vec<u8>> = (0..real.len())
        .step_by(5)
        .map(|n| real.as_bytes()[..n].to_vec())
        .collect();
    let edits: [(&str, serde_json::Value); 12] = [
        ("/inclusionProof/logIndex", "-1".into()),
        ("/inclusionProof/treeSize", "9223372036854775807".into()),
        ("/inclusionProof/treeSize", "0".into()),
        ("/inclusionProof/hashes", serde_json::json!(["AA==", "!!"])),
        (
            "/inclusionProof/hashes",
            serde_json::json!(vec!["AA=="; 70]),
        ),
        ("/inclusionProof/rootHash", "".into()),
        ("/inclusionProof/checkpoint/envelope", "".into()),
        ("/inclusionProof/checkpoint/envelope", "\n\n".into()),
        (
            "/inclusionProof/checkpoint/envelope",
            "é\n3\n—\n\n— é AAAA\n— x ////\n".into(),
        ),
        (
            "/inclusionProof/checkpoint/envelope",
            "\u{2014}\n\n\u{2014} \u{2014} \u{2014}".into(),
        ),
        ("/logId/keyId", "AAAA".into()),
        ("/canonicalizedBody", "e30=".into()),
    ];
    for (at, value) in edits {
        let mut b: serde_json::Value = serde_json::from_str(&real).unwrap();
        let entry = &mut b["verificationMaterial"]["tlogEntries"][0];
        let path: Vec<&str> = at.trim_start_matches('/').split('/').collect();
        let mut slot = entry;
        for p in &path {
            slot = &mut slot[*p];
        }
        *slot = value;
        inputs.push(b.to_string().into_bytes());
    }
    for input in &inputs {
        if let Ok(m) = material::bundle(input) {
            assert!(
                verify(FILE, &file_sha256(SHIM), &m, &runwasi_trust(), &w.root()).is_err(),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
    }
}

#[test]
fn a_proof_without_checkpoint_is_not_read_in_a_v0_1_bundle_and_refused_in_later_ones() {
    let w = world();
    let e = w
        .rekor
        .entry(SHIM, &w.sig, &w.signer.cert_der, "CERTIFICATE", SIGNED_AT);
    let mut proof = w.rekor.inclusion_proof(&e);
    proof.as_object_mut().unwrap().remove("checkpoint");
    let v01 = "application/vnd.dev.sigstore.bundle+json;version=0.1";
    let old = sigstore_bundle(v01, SHIM, &w.sig, &w.signer.cert_der, Some(&e));
    let v = check(&w, &with_inclusion_proof(&old, proof.clone())).unwrap();
    assert_eq!(v.time_source, Some(TimeSource::Log));
    let new = sigstore_bundle(V03, SHIM, &w.sig, &w.signer.cert_der, Some(&e));
    let said = material::bundle(with_inclusion_proof(&new, proof).as_bytes()).unwrap_err();
    assert!(said.contains("no checkpoint"), "{said}");
}

#[test]
fn a_real_rekor_v2_bundle_of_sigstores_staging_instance_verifies_at_its_timestamp() {
    use shim_agent::signature::{SignedBy, Subject, Trust, TrustedIdentity};
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/sigstore/staging-rekor-v2");
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let root = TrustedRoot::from_json(
        &String::from_utf8(read("trusted_root.json")).unwrap(),
        "staging",
    )
    .unwrap();
    let file = read("staging-rekor-v2.txt");
    let m = material::bundle(&read("staging-rekor-v2.txt.sigstore.json")).unwrap();
    assert!(
        m.log_entry
            .as_ref()
            .is_some_and(|e| e.set.is_empty() && e.proof.is_some())
    );
    let trust = Trust {
        identities: vec![TrustedIdentity {
            subject: Subject::Exact("jku@goto.fi".into()),
            issuer: "https://github.com/login/oauth".into(),
        }],
        ..Trust::default()
    };
    let v = verify(
        "staging-rekor-v2.txt",
        &file_sha256(&file),
        &m,
        &trust,
        &root,
    )
    .unwrap();
    assert!(
        matches!(v.signed_by, SignedBy::Identity { ref identity, .. } if identity == "jku@goto.fi")
    );
    // 2025-06-09T11:57:38Z, the token's genTime
    assert_eq!(
        (v.signed_time, v.time_source),
        (Some(1_749_470_258), Some(TimeSource::TimestampAuthority))
    );
    // another file's digest: refused
    assert!(verify("x", &file_sha256(b"x"), &m, &trust, &root).is_err());
}
