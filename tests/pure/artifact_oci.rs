//! The oci strategy against a scripted registry on loopback: anonymous token flow, bearer
//! token, digest pinning, store reuse without network, and a tampered layer.

use std::time::Duration;

use shim_agent::artifact::{FetchSpec, Fetcher, Limits, OciAuth, OciSource, RetryPolicy, Store};

use crate::support::*;

const REPO: &str = "shims/demo";

struct Registry {
    srv: TestServer,
    reference: String,
    manifest_digest: String,
    layer_digest: String,
}

/// Serve an OCI artifact whose one layer is `layer`; the served blob may differ (`served`).
fn registry(layer: &[u8], served: &[u8], token: Option<&str>) -> Registry {
    let srv = TestServer::start();
    let layer_digest = sha256_hex(layer);
    let config = b"{}".to_vec();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": format!("sha256:{}", sha256_hex(&config)),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{layer_digest}"),
            "size": layer.len(),
            "annotations": {"org.opencontainers.image.title": "shim.tar.gz"},
        }],
    });
    let manifest = serde_json::to_vec(&manifest).unwrap();
    let manifest_digest = sha256_hex(&manifest);
    let guard = |r: Route| match token {
        Some(t) => r.auth(
            &format!("Bearer {t}"),
            Some(&format!(
                "Bearer realm=\"{}\",service=\"test-registry\"",
                srv.url("/token")
            )),
        ),
        None => r,
    };
    srv.route("/v2/", guard(Route::ok("{}")));
    srv.route(
        "/token",
        Route::ok(format!("{{\"token\":\"{}\"}}", token.unwrap_or("none"))),
    );
    srv.route(
        &format!("/v2/{REPO}/manifests/sha256:{manifest_digest}"),
        guard(
            Route::ok(manifest)
                .header("Content-Type", "application/vnd.oci.image.manifest.v1+json")
                .header(
                    "Docker-Content-Digest",
                    &format!("sha256:{manifest_digest}"),
                ),
        ),
    );
    srv.route(
        &format!("/v2/{REPO}/blobs/sha256:{layer_digest}"),
        guard(Route::ok(served.to_vec())),
    );
    Registry {
        reference: format!("{}/{REPO}@sha256:{manifest_digest}", srv.host()),
        srv,
        manifest_digest,
        layer_digest,
    }
}

fn fetcher() -> Fetcher {
    let limits = Limits {
        read_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let retry = RetryPolicy {
        max_attempts: 2,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
    };
    Fetcher::new(limits, retry).unwrap()
}

fn spec(reference: &str, auth: OciAuth) -> FetchSpec {
    FetchSpec {
        strategy: "oci".into(),
        oci: Some(OciSource {
            reference: reference.into(),
            auth,
            layer: None,
            insecure_http: true,
        }),
        ..FetchSpec::default()
    }
}

#[tokio::test]
async fn an_anonymous_pull_follows_the_token_flow_and_is_cached_in_the_store() {
    let art = good_shim_tgz();
    let reg = registry(&art, &art, Some("anon-token"));
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let a = fetcher()
        .fetch(&spec(&reg.reference, OciAuth::Anonymous), &store)
        .await
        .unwrap();
    assert_eq!(a.digest, reg.layer_digest);
    assert!(a.dir.join("bin/containerd-shim-demo-v2").is_file());
    assert!(reg.srv.hits("/token") >= 1);

    let hits = reg.srv.total_hits();
    let again = fetcher()
        .fetch(&spec(&reg.reference, OciAuth::Anonymous), &store)
        .await
        .unwrap();
    assert!(!again.fetched);
    assert_eq!(
        reg.srv.total_hits(),
        hits,
        "the second fetch used the network"
    );
}

#[tokio::test]
async fn a_bearer_token_is_sent_as_given() {
    let art = good_shim_tgz();
    let reg = registry(&art, &art, Some("s3cret"));
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    fetcher()
        .fetch(
            &spec(&reg.reference, OciAuth::Bearer("s3cret".into())),
            &store,
        )
        .await
        .unwrap();
    assert_eq!(reg.srv.hits("/token"), 0);
    let blob = format!("/v2/{REPO}/blobs/sha256:{}", reg.layer_digest);
    assert!(
        reg.srv
            .auth_seen()
            .iter()
            .any(|(p, a)| *p == blob && a.as_deref() == Some("Bearer s3cret"))
    );
}

#[tokio::test]
async fn a_wrong_token_is_refused_without_a_trace() {
    let art = good_shim_tgz();
    let reg = registry(&art, &art, Some("s3cret"));
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let before = snapshot(d.path());
    let e = fetcher()
        .fetch(
            &spec(&reg.reference, OciAuth::Bearer("wrong".into())),
            &store,
        )
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "OciPullFailed", "{e}");
    assert!(e.to_string().contains(REPO), "{e}");
    assert_eq!(snapshot(d.path()), before);
}

#[tokio::test]
async fn a_tampered_layer_is_a_digest_mismatch() {
    let art = good_shim_tgz();
    // A valid archive, but not the one the manifest pins.
    let evil = tar_gz(&[Entry::File("containerd-shim-evil-v2", real_elf(), 0o755)]);
    let reg = registry(&art, &evil, None);
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let before = snapshot(d.path());
    let e = fetcher()
        .fetch(&spec(&reg.reference, OciAuth::Anonymous), &store)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "DigestMismatch", "{e}");
    assert!(e.to_string().contains(&reg.layer_digest), "{e}");
    assert!(!e.is_transient());
    assert_eq!(snapshot(d.path()), before);
}

#[tokio::test]
async fn an_unpinned_reference_needs_explicit_permission() {
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let e = fetcher()
        .fetch(
            &spec("127.0.0.1:1/shims/demo:latest", OciAuth::Anonymous),
            &store,
        )
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "MissingDigest");
}

#[tokio::test]
async fn a_multi_arch_index_resolves_to_the_node_platform() {
    let art = good_shim_tgz();
    let reg = registry(&art, &art, None);
    let me = shim_agent::artifact::node_platform();
    let other = if me.arch == "arm64" { "amd64" } else { "arm64" };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", "0".repeat(64)),
                "size": 10,
                "platform": {"os": "linux", "architecture": other},
            },
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": format!("sha256:{}", reg.manifest_digest),
                "size": 10,
                "platform": {"os": me.os, "architecture": me.arch},
            },
        ],
    });
    let index = serde_json::to_vec(&index).unwrap();
    let index_digest = sha256_hex(&index);
    reg.srv.route(
        &format!("/v2/{REPO}/manifests/sha256:{index_digest}"),
        Route::ok(index)
            .header("Content-Type", "application/vnd.oci.image.index.v1+json")
            .header("Docker-Content-Digest", &format!("sha256:{index_digest}")),
    );
    let reference = format!("{}/{REPO}@sha256:{index_digest}", reg.srv.host());
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let a = fetcher()
        .fetch(&spec(&reference, OciAuth::Anonymous), &store)
        .await
        .unwrap();
    assert_eq!(a.digest, reg.layer_digest);
    let wrong = format!("/v2/{REPO}/manifests/sha256:{}", "0".repeat(64));
    assert_eq!(reg.srv.hits(&wrong), 0);
}

#[tokio::test]
async fn a_registry_503_is_retried() {
    let art = good_shim_tgz();
    let reg = registry(&art, &art, None);
    let blob = format!("/v2/{REPO}/blobs/sha256:{}", reg.layer_digest);
    reg.srv.routes(
        &blob,
        vec![Route::status(503, "busy"), Route::ok(art.clone())],
    );
    let d = tempfile::tempdir().unwrap();
    let store = Store::open(d.path()).unwrap();
    let a = fetcher()
        .fetch(&spec(&reg.reference, OciAuth::Anonymous), &store)
        .await
        .unwrap();
    assert_eq!(a.digest, reg.layer_digest);
    assert_eq!(reg.srv.hits(&blob), 2);
}
