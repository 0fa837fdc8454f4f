//! Artifact fetches through a real HTTP proxy (Debian's tinyproxy, with basic
//! authentication), as a node owner sets one: `HTTP_PROXY`/`HTTPS_PROXY` and `NO_PROXY` in the
//! agent's environment (a unit drop-in). The real binary, `install --root`, so the environment
//! is the process's own: the proxy's log shows the fetch went through it; a `NO_PROXY` host goes
//! around it; a refused proxy login fails the install, leaves the image as it was, and never
//! shows the password.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::proxy::{self, tinyproxy};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, Route, TestServer, real_elf, sha256_hex, tar_gz};

const TEST: &str = "artifact_proxy";

/// `shim-agent install --root` of a Shim whose artifact is `url`, with exactly these proxy
/// variables in its environment.
fn install(root: &Path, url: &str, sha: &str, proxy_env: &[(&str, &str)]) -> Output {
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    if !root.join("etc/containerd/config.toml").exists() {
        std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    }
    let shim = root.with_extension("yaml");
    std::fs::write(&shim, ShimBuilder::new("demo").artifact(url, sha).yaml()).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shim-agent"));
    cmd.args(["--config", "/dev/null", "install", "--root"])
        .arg(root)
        .arg("-f")
        .arg(&shim);
    for k in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "all_proxy",
    ] {
        cmd.env_remove(k);
    }
    cmd.envs(proxy_env.iter().copied());
    cmd.output().expect("run shim-agent")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn fetches_go_through_the_proxy_of_the_environment_and_around_it_for_no_proxy_hosts() {
    let Some(proxy) = tinyproxy(TEST) else { return };
    let server = TestServer::start();
    let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let sha = sha256_hex(&art);
    server.route("/demo.tar.gz", Route::ok(art.clone()));
    let url = server.url("/demo.tar.gz");
    let d = tempfile::tempdir().unwrap();

    // through the proxy, logged in
    let out = install(
        &d.path().join("a"),
        &url,
        &sha,
        &[("HTTP_PROXY", &proxy.url_with(proxy::PASSWORD))],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        proxy.requests(),
        vec![format!("GET {url} HTTP/1.1")],
        "the proxy's log"
    );
    assert_eq!(server.hits("/demo.tar.gz"), 1);

    // NO_PROXY names the host: straight to it, the proxy sees nothing new
    let host = server.host();
    let out = install(
        &d.path().join("b"),
        &url,
        &sha,
        &[
            ("HTTP_PROXY", &proxy.url_with(proxy::PASSWORD)),
            ("NO_PROXY", host.split(':').next().unwrap()),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        proxy.requests().len(),
        1,
        "NO_PROXY went through the proxy: {:?}",
        proxy.requests()
    );
    assert_eq!(server.hits("/demo.tar.gz"), 2);
}

#[test]
fn a_refused_proxy_login_fails_the_install_without_the_password() {
    let Some(proxy) = tinyproxy(TEST) else { return };
    let server = TestServer::start();
    let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    server.route("/demo.tar.gz", Route::ok(art.clone()));
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("img");
    let wrong = "wr0ng-pa55word";
    let out = install(
        &root,
        &server.url("/demo.tar.gz"),
        &sha256_hex(&art),
        &[("HTTP_PROXY", &proxy.url_with(wrong))],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert_eq!(
        server.hits("/demo.tar.gz"),
        0,
        "the server was reached around the proxy"
    );
    assert!(
        !said.contains(wrong) && !said.contains(proxy::PASSWORD),
        "the password reached the output: {said}"
    );
    assert!(
        said.contains("returned HTTP 401 after 1 attempt(s); the server, or the proxy in HTTP_PROXY/HTTPS_PROXY, refused access"),
        "{said}"
    );
    assert!(
        !root.join("opt/shim-agent").exists()
            || std::fs::read_dir(root.join("opt/shim-agent/shims"))
                .map(|mut d| d.next().is_none())
                .unwrap_or(true),
        "a shim was placed"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/containerd/config.toml")).unwrap(),
        "version = 2\n"
    );
}

/// An https fetch goes through the proxy's CONNECT tunnel: a refused login there is the
/// proxy's own refusal (`ProxyRefused`, naming the proxy and never its password), and an
/// unreachable proxy stays a connection failure. The target port is closed: nothing but the
/// proxy is asked.
#[test]
fn a_proxy_that_refuses_the_tunnel_is_named_and_an_unreachable_one_is_a_connect_failure() {
    let Some(proxy) = tinyproxy(TEST) else { return };
    let d = tempfile::tempdir().unwrap();
    let url = format!(
        "https://127.0.0.1:{}/demo.tar.gz",
        crate::support::free_port()
    );
    let sha = "ab".repeat(32);
    let wrong = "wr0ng-pa55word";
    let out = install(
        &d.path().join("img"),
        &url,
        &sha,
        &[("HTTPS_PROXY", &proxy.url_with(wrong))],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    let named = format!(
        "the proxy 127.0.0.1:{} refused to forward the request",
        proxy.port
    );
    assert!(said.contains(&named), "{said}");
    assert!(
        !said.contains(wrong) && !said.contains(proxy::PASSWORD),
        "the password reached the output: {said}"
    );

    let gone = format!(
        "http://{}:{wrong}@127.0.0.1:{}",
        proxy::USER,
        crate::support::free_port()
    );
    let out = install(
        &d.path().join("img2"),
        &url,
        &sha,
        &[("HTTPS_PROXY", &gone)],
    );
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("cannot connect to"), "{said}");
    assert!(!said.contains("refused to forward"), "{said}");
    assert!(
        !said.contains(wrong),
        "the password reached the output: {said}"
    );
}
