//! A node without a system CA bundle (a minimal node image): the agent runs with
//! `SSL_CERT_FILE`/`SSL_CERT_DIR` pointing at nothing, so the system has no CA certificate.
//! - `file://` and `http://` artifacts install;
//! - an `https://` artifact fails with an error that says what is missing and how to fix it,
//!   and leaves the image root as it was;
//! - with `fetch.ca-file` naming the server's CA, the same `https://` artifact installs.
//!
//! The https server is `openssl s_server -WWW` with a certificate from a test CA
//! (`support::tls`).

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, Route, TestServer, real_elf, sha256_hex, tar_gz};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args(args)
        // no system CA certificates at all
        .env("SSL_CERT_FILE", "/nonexistent/ca.pem")
        .env("SSL_CERT_DIR", "/nonexistent")
        .output()
        .expect("run shim-agent")
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `openssl s_server -WWW` serving `dir` over https on a free port.
fn https_server(dir: &Path) -> (Server, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(port.to_string())
        .args(["-cert", "server.pem", "-key", "server.key"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    let server = Server(child);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "openssl s_server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (server, port)
}

fn image_root(dir: &Path) -> (String, Vec<u8>) {
    let root = dir.join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    let original = b"version = 2\n".to_vec();
    std::fs::write(root.join("etc/containerd/config.toml"), &original).unwrap();
    (root.to_str().unwrap().to_string(), original)
}

fn shim_file(dir: &Path, name: &str, url: &str, sha: &str) -> String {
    let f = dir.join(format!("{name}.yaml"));
    std::fs::write(&f, ShimBuilder::new(name).artifact(url, sha).yaml()).unwrap();
    f.to_str().unwrap().to_string()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn without_system_ca_certificates_file_and_http_work_and_https_needs_a_ca_file() {
    let d = tempfile::tempdir().unwrap();
    support::tls::make_certs(d.path(), "localhost");
    let art = tar_gz(&[Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)]);
    let sha = sha256_hex(&art);
    std::fs::write(d.path().join("demo.tar.gz"), &art).unwrap();

    // file://
    let (root, original) = image_root(&d.path().join("file"));
    let url = format!("file://{}", d.path().join("demo.tar.gz").display());
    let f = shim_file(d.path(), "demo", &url, &sha);
    let out = agent(&["install", "--root", &root, "-f", &f]);
    assert!(out.status.success(), "file://: {}", text(&out.stderr));

    // http://
    let http = TestServer::start();
    http.route("/demo.tar.gz", Route::ok(art.clone()));
    let (root, _) = image_root(&d.path().join("http"));
    let f = shim_file(d.path(), "demo", &http.url("/demo.tar.gz"), &sha);
    let out = agent(&["install", "--root", &root, "-f", &f]);
    assert!(out.status.success(), "http://: {}", text(&out.stderr));

    // https:// without a CA: a clear error, the root as it was
    let (_server, port) = https_server(d.path());
    let https = format!("https://127.0.0.1:{port}/demo.tar.gz");
    let (root, _) = image_root(&d.path().join("https"));
    let f = shim_file(d.path(), "demo", &https, &sha);
    let out = agent(&["install", "--root", &root, "-f", &f]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "https without any CA must fail");
    assert!(
        err.contains(&https)
            && err.contains("https needs CA certificates")
            && err.contains("fetch.ca-file"),
        "the error says what is missing and how to fix it: {err}"
    );
    assert_eq!(
        std::fs::read(Path::new(&root).join("etc/containerd/config.toml")).unwrap(),
        original
    );
    assert!(!Path::new(&root).join("opt").exists(), "nothing placed");

    // https:// with fetch.ca-file: installs
    let config = d.path().join("agent.toml");
    std::fs::write(
        &config,
        format!(
            "[fetch]\nca-file = \"{}\"\n",
            d.path().join("ca.pem").display()
        ),
    )
    .unwrap();
    let out = agent(&[
        "--config",
        config.to_str().unwrap(),
        "install",
        "--root",
        &root,
        "-f",
        &f,
    ]);
    assert!(
        out.status.success(),
        "https with fetch.ca-file: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("installed demo"),
        "{}",
        text(&out.stdout)
    );

    // a ca-file that is no certificate is an error naming the setting
    std::fs::write(d.path().join("bad.pem"), "not a certificate\n").unwrap();
    std::fs::write(
        &config,
        format!(
            "[fetch]\nca-file = \"{}\"\n",
            d.path().join("bad.pem").display()
        ),
    )
    .unwrap();
    let (root, _) = image_root(&d.path().join("bad"));
    let out = agent(&[
        "--config",
        config.to_str().unwrap(),
        "install",
        "--root",
        &root,
        "-f",
        &f,
    ]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("fetch.ca-file holds no"),
        "{}",
        text(&out.stderr)
    );
}
