//! What a registry serves about the signatures attached to an artifact: read purely
//! (src/artifact/oci_attached.rs: the referrers API's index, a referrer's manifest, cosign's
//! signature manifest; hostile replies are errors, never panics), and the referrers API asked
//! first, against a scripted registry that has it (docker-registry 2.8, which
//! tests/pure/signed_oci.rs runs against, has none).

use oci_client::manifest::ImageIndexEntry;
use shim_agent::artifact::oci_attached::{
    BLOB_CAP, BUNDLE_ARTIFACT_TYPE, CANDIDATES_CAP, bundle_layer, bundle_referrers,
    signature_layers, signature_tag,
};

const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
const SUBJECT_DIGEST: &str =
    "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const BUNDLE_DIGEST: &str =
    "sha256:2222222222222222222222222222222222222222222222222222222222222222";

/// The referrers API's reply (distribution-spec "Listing Referrers"): an image index of
/// the referrers' descriptors, each with its artifactType.
#[test]
fn the_referrers_apis_index_lists_the_bundles_only() {
    let reply = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": BUNDLE_DIGEST,
             "size": 700, "artifactType": BUNDLE_ARTIFACT_TYPE,
             "annotations": {"dev.sigstore.bundle.predicateType": "https://sigstore.dev/cosign/sign/v1"}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SUBJECT_DIGEST,
             "size": 500, "artifactType": "application/spdx+json"},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": SUBJECT_DIGEST,
             "size": 500}
        ]
    });
    let index: oci_client::manifest::OciImageIndex =
        serde_json::from_value(reply).expect("an image index");
    assert_eq!(
        bundle_referrers(&index.manifests),
        vec![BUNDLE_DIGEST.to_string()]
    );
    let many: Vec<ImageIndexEntry> = (0..40).map(|_| index.manifests[0].clone()).collect();
    assert_eq!(bundle_referrers(&many).len(), CANDIDATES_CAP);
}

#[test]
fn a_referrer_about_another_manifest_or_without_a_bundle_is_refused() {
    let referrer = |subject: &str, media_type: &str, size: i64| {
        serde_json::json!({
            "schemaVersion": 2, "artifactType": BUNDLE_ARTIFACT_TYPE,
            "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": subject, "size": 1},
            "layers": [{"mediaType": media_type, "digest": BUNDLE_DIGEST, "size": size}]
        })
        .to_string()
    };
    let good = bundle_layer(
        referrer(SUBJECT_DIGEST, BUNDLE_ARTIFACT_TYPE, 9).as_bytes(),
        SUBJECT_DIGEST,
    );
    assert_eq!(good.expect("the bundle").digest, BUNDLE_DIGEST);
    let other = bundle_layer(
        referrer(BUNDLE_DIGEST, BUNDLE_ARTIFACT_TYPE, 9).as_bytes(),
        SUBJECT_DIGEST,
    );
    assert!(other.unwrap_err().contains("is about"));
    let none = bundle_layer(
        referrer(SUBJECT_DIGEST, "text/plain", 9).as_bytes(),
        SUBJECT_DIGEST,
    );
    assert!(none.unwrap_err().contains("no layer"));
    let huge = bundle_layer(
        referrer(SUBJECT_DIGEST, BUNDLE_ARTIFACT_TYPE, 1 << 40).as_bytes(),
        SUBJECT_DIGEST,
    );
    assert!(huge.unwrap_err().contains("bytes"));
}

#[test]
fn hostile_signature_manifests_are_errors_not_panics_when_read() {
    for bad in [
        &b"null"[..],
        b"[]",
        b"{\"schemaVersion\": 2, \"layers\": 3}",
        b"{\"schemaVersion\": 1}",
        b"\xff",
        &[b' '; BLOB_CAP + 1],
    ] {
        assert!(signature_layers(bad).is_err());
    }
    let layer = |digest: &str, size: i64| {
        serde_json::json!({"schemaVersion": 2, "layers": [{"mediaType": SIMPLE_SIGNING, "digest": digest, "size": size}]})
            .to_string()
    };
    assert!(signature_layers(layer("sha256:../../x", 1).as_bytes()).is_err());
    assert!(signature_layers(layer(BUNDLE_DIGEST, -1).as_bytes()).is_err());
    assert_eq!(
        signature_layers(layer(BUNDLE_DIGEST, 5).as_bytes())
            .expect("one")
            .len(),
        1
    );
    assert_eq!(
        signature_tag(SUBJECT_DIGEST),
        format!("sha256-{}.sig", &SUBJECT_DIGEST[7..])
    );
}

/// A registry with the referrers API (scripted: docker-registry 2.8 has none): the bundle it
/// lists is found there, the tag schema's index is not asked for, and the bundle verifies.
#[tokio::test]
async fn the_referrers_api_is_asked_first_and_the_bundle_it_lists_verifies() {
    use crate::support::sigstore::{
        Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, sigstore_bundle,
        trusted_root,
    };
    use crate::support::{Route, TestServer, sha256_hex};
    use shim_agent::api::signature::{MaterialFrom, SignatureSpec, SignerIdentity};
    use shim_agent::artifact::signed::{NodeSignatures, attached_verdict, plan};
    use shim_agent::artifact::{Fetcher, Limits, OciSource, RetryPolicy};
    use shim_agent::signature::TrustedRoot;

    let (fulcio, rekor) = (Fulcio::new("fulcio"), Rekor::new());
    let signer = fulcio.signer(&Leaf::runwasi());
    let manifest = br#"{"schemaVersion":2,"layers":[]}"#;
    let subject = format!("sha256:{}", sha256_hex(manifest));
    let sig = signer.sign(manifest);
    let entry = rekor.entry(manifest, &sig, &signer.cert_der, "CERTIFICATE", SIGNED_AT);
    let bundle = sigstore_bundle(
        BUNDLE_ARTIFACT_TYPE,
        manifest,
        &sig,
        &signer.cert_der,
        Some(&entry),
    );
    let bundle_digest = format!("sha256:{}", sha256_hex(bundle.as_bytes()));
    let referrer = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": BUNDLE_ARTIFACT_TYPE,
        "config": {"mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", sha256_hex(b"{}")), "size": 2},
        "layers": [{"mediaType": BUNDLE_ARTIFACT_TYPE, "digest": bundle_digest, "size": bundle.len()}],
        "subject": {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": subject, "size": manifest.len()}
    })
    .to_string();
    let referrer_digest = format!("sha256:{}", sha256_hex(referrer.as_bytes()));
    let index = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": referrer_digest, "size": referrer.len(), "artifactType": BUNDLE_ARTIFACT_TYPE}]
    })
    .to_string();
    let srv = TestServer::start();
    srv.route("/v2/", Route::ok("{}"));
    srv.route(
        &format!("/v2/shims/demo/referrers/{subject}"),
        Route::ok(index).header("Content-Type", "application/vnd.oci.image.index.v1+json"),
    );
    srv.route(
        &format!("/v2/shims/demo/manifests/{referrer_digest}"),
        Route::ok(referrer)
            .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
            .header("Docker-Content-Digest", &referrer_digest),
    );
    srv.route(
        &format!("/v2/shims/demo/blobs/{bundle_digest}"),
        Route::ok(bundle),
    );
    let retry = RetryPolicy {
        max_attempts: 1,
        initial_backoff: std::time::Duration::from_millis(10),
        max_backoff: std::time::Duration::from_millis(10),
    };
    let src = OciSource {
        reference: format!("{}/shims/demo@{subject}", srv.host()),
        insecure_http: true,
        ..OciSource::default()
    };
    let found = Fetcher::new(Limits::default(), retry)
        .unwrap()
        .attached_signatures(&src)
        .await
        .unwrap();
    assert_eq!(found.attached.len(), 1, "{:?}", found.attached);
    let tag_schema = format!("/v2/shims/demo/manifests/{}", subject.replace(':', "-"));
    assert_eq!(srv.hits(&tag_schema), 0, "the tag schema was asked");

    let spec = SignatureSpec {
        from: MaterialFrom::Oci,
        signed_file: None,
        signature: None,
        certificate: None,
        bundle: None,
        identities: Some(vec![SignerIdentity {
            identity: Some(RUNWASI_IDENTITY.into()),
            identity_reg_exp: None,
            issuer: GITHUB_ISSUER.into(),
        }]),
        keys: None,
        allow_without_signed_time: None,
    };
    let checks = plan("demo", Some(&spec), &NodeSignatures::default())
        .unwrap()
        .unwrap();
    let root = TrustedRoot::from_json(&trusted_root(&[&fulcio], &[&rekor]), "test").unwrap();
    let v = attached_verdict(&found, &checks, &root).unwrap();
    assert_eq!(v.signed_time, Some(SIGNED_AT));
}
