//! Fetching over loopback HTTP and file://: verification, the store, retries, timeouts,
//! and that every failure leaves the store as it was.

use std::time::Duration;

use shim_agent::artifact::{
    ArtifactError, ArtifactSource, FetchSpec, Fetcher, Limits, Platform, PlatformSource,
    RetryPolicy, Store, node_platform,
};

use crate::support::*;

fn quick_retry(attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(20),
    }
}

fn fetcher() -> Fetcher {
    let limits = Limits {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_millis(500),
        ..Limits::default()
    };
    Fetcher::new(limits, quick_retry(3)).unwrap()
}

fn source(url: String, bytes: &[u8]) -> ArtifactSource {
    ArtifactSource {
        location: url,
        sha256: Some(sha256_hex(bytes)),
    }
}

/// A fresh store, and its contents right after opening.
fn store() -> (tempfile::TempDir, Store, Vec<String>) {
    let d = tempfile::tempdir().unwrap();
    let s = Store::open(d.path().join("store")).unwrap();
    let snap = snapshot(s.path());
    (d, s, snap)
}

/// Fetch and expect failure with `reason`; the store must hold nothing new.
async fn fails(f: &Fetcher, src: &ArtifactSource, reason: &str) -> ArtifactError {
    let (_d, s, before) = store();
    let e = f.fetch_into_store(src, &s).await.unwrap_err();
    assert_eq!(e.reason(), reason, "{e}");
    assert_eq!(snapshot(s.path()), before, "the store changed after: {e}");
    e
}

#[tokio::test]
async fn a_verified_artifact_is_unpacked_into_the_store_and_fetched_once() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/shim.tgz", Route::ok(art.clone()));
    let (_d, s, _) = store();
    let src = source(srv.url("/shim.tgz"), &art);

    let a = fetcher().fetch_into_store(&src, &s).await.unwrap();
    assert!(a.fetched);
    assert_eq!(a.digest, sha256_hex(&art));
    assert_eq!(a.dir, s.path().join("sha256").join(&a.digest));
    assert_eq!(
        std::fs::read(a.dir.join("bin/containerd-shim-demo-v2")).unwrap(),
        real_elf()
    );
    assert_eq!(snapshot(&s.path().join("tmp")), Vec::<String>::new());

    let again = fetcher().fetch_into_store(&src, &s).await.unwrap();
    assert!(!again.fetched);
    assert_eq!(again.dir, a.dir);
    assert_eq!(
        srv.hits("/shim.tgz"),
        1,
        "the second fetch used the network"
    );
}

#[tokio::test]
async fn a_wrong_sha256_is_a_digest_mismatch_and_not_retried() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/shim.tgz", Route::ok(art.clone()));
    let src = ArtifactSource {
        location: srv.url("/shim.tgz"),
        sha256: Some("0".repeat(64)),
    };
    let e = fails(&fetcher(), &src, "DigestMismatch").await;
    let msg = e.to_string();
    assert!(
        msg.contains(&"0".repeat(64)) && msg.contains(&sha256_hex(&art)),
        "{msg}"
    );
    assert!(msg.contains("/shim.tgz"), "{msg}");
    assert_eq!(srv.hits("/shim.tgz"), 1);
}

#[tokio::test]
async fn http_404_fails_at_once() {
    let srv = TestServer::start();
    let src = source(srv.url("/missing.tgz"), b"x");
    let e = fails(&fetcher(), &src, "HttpStatus").await;
    assert!(e.to_string().contains("404"), "{e}");
    assert!(!e.is_transient());
    assert_eq!(srv.hits("/missing.tgz"), 1);
}

#[tokio::test]
async fn http_500_is_retried_then_fails() {
    let srv = TestServer::start();
    srv.route("/flaky.tgz", Route::status(500, "boom"));
    let src = source(srv.url("/flaky.tgz"), b"x");
    let e = fails(&fetcher(), &src, "HttpStatus").await;
    assert!(e.to_string().contains("HTTP 500 after 3 attempt(s)"), "{e}");
    assert_eq!(srv.hits("/flaky.tgz"), 3);
}

#[tokio::test]
async fn a_transient_500_then_success_installs() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.routes(
        "/shim.tgz",
        vec![Route::status(503, "busy"), Route::ok(art.clone())],
    );
    let (_d, s, _) = store();
    let a = fetcher()
        .fetch_into_store(&source(srv.url("/shim.tgz"), &art), &s)
        .await
        .unwrap();
    assert_eq!(a.digest, sha256_hex(&art));
    assert_eq!(srv.hits("/shim.tgz"), 2);
}

#[tokio::test]
async fn a_connection_cut_mid_body_is_retried_from_scratch() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.routes(
        "/shim.tgz",
        vec![
            Route::ok(art.clone()).behave(Behavior::CutAfter(art.len() / 2)),
            Route::ok(art.clone()),
        ],
    );
    let (_d, s, _) = store();
    let a = fetcher()
        .fetch_into_store(&source(srv.url("/shim.tgz"), &art), &s)
        .await
        .unwrap();
    assert_eq!(a.digest, sha256_hex(&art));
    assert_eq!(srv.hits("/shim.tgz"), 2);
    assert_eq!(snapshot(&s.path().join("tmp")), Vec::<String>::new());
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let srv = TestServer::start();
    srv.route(
        "/slow.tgz",
        Route::ok("x").behave(Behavior::Hang(Duration::from_secs(5))),
    );
    let src = source(srv.url("/slow.tgz"), b"x");
    let started = std::time::Instant::now();
    let e = fails(&fetcher(), &src, "Timeout").await;
    assert!(e.to_string().contains("after 3 attempt(s)"), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn connection_refused_is_reported_after_the_retries() {
    // Bind then drop: nothing listens on that port any more.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let src = source(format!("http://127.0.0.1:{port}/shim.tgz"), b"x");
    let e = fails(&fetcher(), &src, "ConnectFailed").await;
    let msg = e.to_string();
    assert!(
        msg.contains("cannot connect") && msg.contains("3 attempt(s)"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_truncated_gzip_is_refused() {
    let art = good_shim_tgz();
    let cut = &art[..art.len() - 100];
    let d = tempfile::tempdir().unwrap();
    let (url, _) = file_url(d.path(), "cut.tgz", cut);
    let e = fails(&fetcher(), &source(url, cut), "TruncatedArchive").await;
    assert!(e.to_string().contains("cut.tgz"), "{e}");
}

#[tokio::test]
async fn an_html_page_is_not_an_archive() {
    let srv = TestServer::start();
    let page = b"<!DOCTYPE html><html><body>Sign in</body></html>".to_vec();
    srv.route("/shim.tgz", Route::ok(page.clone()));
    let e = fails(
        &fetcher(),
        &source(srv.url("/shim.tgz"), &page),
        "NotAnArchive",
    )
    .await;
    assert!(e.to_string().contains("HTML page"), "{e}");
    assert_eq!(srv.hits("/shim.tgz"), 1);
}

#[tokio::test]
async fn a_download_above_the_cap_is_refused() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/shim.tgz", Route::ok(art.clone()));
    let f = Fetcher::new(
        Limits {
            max_download_bytes: 1000,
            ..Limits::default()
        },
        quick_retry(3),
    )
    .unwrap();
    fails(&f, &source(srv.url("/shim.tgz"), &art), "DownloadTooLarge").await;
    assert_eq!(srv.hits("/shim.tgz"), 1);
}

#[tokio::test]
async fn file_urls_serve_air_gapped_nodes_and_plain_tar_works() {
    let d = tempfile::tempdir().unwrap();
    let art = tar_bytes(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let (url, _) = file_url(d.path(), "shim.tar", &art);
    let (_d, s, _) = store();
    let a = fetcher()
        .fetch_into_store(&source(url, &art), &s)
        .await
        .unwrap();
    assert!(a.dir.join("containerd-shim-demo-v2").is_file());
    let missing = ArtifactSource {
        location: format!("file://{}/nope.tgz", d.path().display()),
        sha256: Some("1".repeat(64)),
    };
    fails(&fetcher(), &missing, "LocalFileUnreadable").await;
}

#[tokio::test]
async fn a_bare_elf_download_is_stored_under_its_url_name() {
    let srv = TestServer::start();
    let bin = real_elf();
    srv.route("/dl/containerd-shim-demo-v2", Route::ok(bin.clone()));
    let (_d, s, _) = store();
    let a = fetcher()
        .fetch_into_store(&source(srv.url("/dl/containerd-shim-demo-v2"), &bin), &s)
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(a.dir.join("containerd-shim-demo-v2")).unwrap(),
        bin
    );
}

#[tokio::test]
async fn a_missing_sha256_needs_explicit_permission() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/shim.tgz", Route::ok(art.clone()));
    let src = ArtifactSource {
        location: srv.url("/shim.tgz"),
        sha256: None,
    };
    fails(&fetcher(), &src, "MissingDigest").await;
    assert_eq!(srv.hits("/shim.tgz"), 0);
    let (_d, s, _) = store();
    let a = fetcher()
        .allow_unverified(true)
        .fetch_into_store(&src, &s)
        .await
        .unwrap();
    assert_eq!(a.digest, sha256_hex(&art));
}

#[tokio::test]
async fn the_spec_picks_the_artifact_for_the_node_platform() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/mine.tgz", Route::ok(art.clone()));
    let me = node_platform();
    let spec = FetchSpec {
        strategy: "anonymousHttp".into(),
        anon_http: Some(source(srv.url("/default.tgz"), b"x")),
        platforms: vec![
            PlatformSource {
                os: "linux".into(),
                arch: "other".into(),
                source: source(srv.url("/other.tgz"), b"x"),
                containerd: None,
            },
            PlatformSource {
                os: me.os.clone(),
                arch: me.arch.clone(),
                source: source(srv.url("/mine.tgz"), &art),
                containerd: None,
            },
        ],
        oci: None,
    };
    let (_d, s, _) = store();
    fetcher().fetch(&spec, &s).await.unwrap();
    assert_eq!(srv.hits("/mine.tgz"), 1);
    assert_eq!(srv.total_hits(), 1);

    let e = fetcher()
        .for_platform(Platform::new("linux", "s390x"))
        .fetch(
            &FetchSpec {
                anon_http: None,
                ..spec
            },
            &s,
        )
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "NoPlatformMatch");
}

#[tokio::test]
async fn an_unknown_fetch_strategy_is_refused_without_side_effects() {
    let (_d, s, before) = store();
    let spec = FetchSpec {
        strategy: "bittorrent".into(),
        ..FetchSpec::default()
    };
    let e = fetcher().fetch(&spec, &s).await.unwrap_err();
    assert_eq!(e.reason(), "UnknownFetchStrategy");
    assert!(e.to_string().contains("bittorrent"), "{e}");
    assert_eq!(snapshot(s.path()), before);
}

#[tokio::test]
async fn fetch_find_and_place_install_the_shim_end_to_end() {
    use shim_agent::artifact::{find_shim_binary, place_binary};
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route("/shim.tgz", Route::ok(art.clone()));
    let host = tempfile::tempdir().unwrap();
    let root = shim_agent::hostroot::HostRoot::new(host.path()).unwrap();
    let store_dir = root.resolve("/var/lib/shim-agent/store").unwrap();
    let s = Store::open(&store_dir).unwrap();
    let f = fetcher();
    let a = f
        .fetch_into_store(&source(srv.url("/shim.tgz"), &art), &s)
        .await
        .unwrap();
    let bin = find_shim_binary(&a.dir, None, &f.platform().arch).unwrap();
    let placed = place_binary(&root, "demo", &a.digest, &bin).unwrap();
    assert_eq!(
        placed.host_path.display().to_string(),
        format!(
            "/opt/shim-agent/shims/demo/{}/containerd-shim-demo-v2",
            a.digest
        )
    );
    let out = std::process::Command::new(&placed.local_path)
        .status()
        .unwrap();
    assert!(out.success(), "the installed shim does not run");
}

#[tokio::test]
async fn an_attempt_that_takes_too_long_as_a_whole_times_out() {
    let srv = TestServer::start();
    srv.route(
        "/drip.tgz",
        Route::ok("x").behave(Behavior::Hang(Duration::from_secs(5))),
    );
    let f = Fetcher::new(
        Limits {
            read_timeout: Duration::from_secs(30),
            attempt_timeout: Duration::from_millis(200),
            ..Limits::default()
        },
        quick_retry(2),
    )
    .unwrap();
    let e = fails(&f, &source(srv.url("/drip.tgz"), b"x"), "Timeout").await;
    assert!(e.to_string().contains("the attempt took longer"), "{e}");
    assert_eq!(srv.hits("/drip.tgz"), 2);
}

#[tokio::test]
async fn the_download_cap_holds_when_the_server_sends_no_length() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    srv.route(
        "/shim.tgz",
        Route::ok(art.clone()).behave(Behavior::NoLength),
    );
    let (_d, s, _) = store();
    // Without a cap problem the length-less body installs fine...
    fetcher()
        .fetch_into_store(&source(srv.url("/shim.tgz"), &art), &s)
        .await
        .unwrap();
    // ...and with a cap below its size it is cut off while streaming.
    let f = Fetcher::new(
        Limits {
            max_download_bytes: 4096,
            ..Limits::default()
        },
        quick_retry(3),
    )
    .unwrap();
    let e = fails(&f, &source(srv.url("/shim.tgz"), &art), "DownloadTooLarge").await;
    assert!(e.to_string().contains("4096"), "{e}");
}

/// More file:// artifacts at once than tokio's blocking pool has threads: each unpacker holds
/// a thread of the pool while it waits for bytes, so reads that needed the pool too would wait
/// forever (1000 agents in one process stalled on this).
#[test]
fn more_local_artifacts_at_once_than_blocking_threads_all_arrive() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let d = tempfile::tempdir().unwrap();
    let (_sd, s, _) = store();
    let sources: Vec<ArtifactSource> = (0..8)
        .map(|i| {
            let art = tar_bytes(&[Entry::File(
                "containerd-shim-demo-v2",
                [real_elf(), vec![i as u8; 300 * 1024]].concat(),
                0o755,
            )]);
            let (url, _) = file_url(d.path(), &format!("shim-{i}.tar"), &art);
            source(url, &art)
        })
        .collect();
    let f = fetcher();
    let all = rt.block_on(async {
        let each = sources.iter().map(|src| f.fetch_into_store(src, &s));
        tokio::time::timeout(
            Duration::from_secs(60),
            futures_util::future::join_all(each),
        )
        .await
    });
    let got = all.expect("the fetches stalled");
    assert!(got.iter().all(|r| r.is_ok()), "{got:?}");
}

#[tokio::test]
async fn an_artifact_server_gets_the_nodes_credential_for_its_host_only() {
    let srv = TestServer::start();
    let art = good_shim_tgz();
    // basic "ci:art-s3cret"
    srv.route(
        "/private.tgz",
        Route::ok(art.clone()).auth("Basic Y2k6YXJ0LXMzY3JldA==", Some("Basic realm=\"a\"")),
    );
    let d = tempfile::tempdir().unwrap();
    let creds = d.path().join("http-credentials.toml");
    let src = source(srv.url("/private.tgz"), &art);

    // without the file: refused
    let e = fails(&fetcher(), &src, "HttpStatus").await;
    assert!(e.to_string().contains("HTTP 401"), "{e}");

    // with it: the server gets the host's credential
    std::fs::write(
        &creds,
        format!(
            "[hosts.\"{}\"]\nusername = \"ci\"\npassword = \"art-s3cret\"\n",
            srv.host()
        ),
    )
    .unwrap();
    let (_d2, s, _) = store();
    let f = fetcher().with_http_credentials(Some(creds.clone()));
    let a = f.fetch_into_store(&src, &s).await.unwrap();
    assert_eq!(a.digest, sha256_hex(&art));

    // a wrong password: refused, and the error never shows it
    std::fs::write(
        &creds,
        format!(
            "[hosts.\"{}\"]\nusername = \"ci\"\npassword = \"wr0ng-s3cret\"\n",
            srv.host()
        ),
    )
    .unwrap();
    let f = fetcher().with_http_credentials(Some(creds.clone()));
    let e = fails(&f, &src, "HttpStatus").await;
    assert!(!format!("{e} {e:?}").contains("wr0ng"), "{e}");

    // a file that cannot be used is its own reason, naming the host and the file
    std::fs::write(
        &creds,
        format!("[hosts.\"{}\"]\nusername = \"ci\"\n", srv.host()),
    )
    .unwrap();
    let e = fails(&f, &src, "RegistryCredentialsFailed").await;
    assert!(
        e.to_string()
            .contains("give username and password, or bearer-token"),
        "{e}"
    );
}
