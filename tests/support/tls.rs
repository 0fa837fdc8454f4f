//! A test certificate authority made with the `openssl` command: a CA and a P-256 server
//! certificate signed by it, for loopback HTTPS servers in tests.

use std::path::Path;
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (the openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// In `dir`: `ca.pem` (the CA), `server.pem` and `server.key` (for 127.0.0.1 and `dns`).
pub fn make_certs(dir: &Path, dns: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "2",
        "-subj",
        "/CN=shim-agent test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/CN=test server",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        format!("subjectAltName=IP:127.0.0.1,DNS:{dns}\nbasicConstraints=CA:FALSE\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
            "-out",
            "server.pem",
        ],
    );
}
