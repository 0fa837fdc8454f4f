//! `oci` artifacts through containerd's registry hosts (`config_path`/`<registry>/hosts.toml`),
//! against a real registry (Debian's docker-registry, TLS from a private CA): the upstream is
//! unreachable, the first mirror is down, the second serves it with its own CA; a change in
//! the directory takes effect at the next fetch; `skip_verify` does without the CA; the digest
//! pin is what decides; a broken hosts.toml is its own reason.

use std::path::Path;
use std::time::Duration;

use shim_agent::artifact::{Fetcher, Limits, RetryPolicy, Store};

use crate::support::registry::{free_port, registry};
use crate::support::{good_shim_tgz, oci_spec, sha256_hex};

const TEST: &str = "artifact_mirrors";
/// The registry the Shim names: `.invalid` never resolves (RFC 2606).
const UPSTREAM: &str = "upstream.invalid:5000";

fn fetcher(hosts: &Path) -> Fetcher {
    let limits = Limits {
        connect_timeout: Duration::from_secs(2),
        read_timeout: Duration::from_secs(5),
        ..Limits::default()
    };
    let retry = RetryPolicy {
        max_attempts: 1,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(10),
    };
    Fetcher::new(limits, retry)
        .unwrap()
        .with_registry_hosts(vec![hosts.to_path_buf()])
}

fn write_hosts(dir: &Path, text: &str) {
    std::fs::create_dir_all(dir.join(UPSTREAM)).unwrap();
    std::fs::write(dir.join(UPSTREAM).join("hosts.toml"), text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mirrors_are_tried_in_order_with_their_own_ca_and_the_pin_decides() {
    let Some(reg) = registry(TEST) else { return };
    let art = good_shim_tgz();
    let manifest = reg.push("shims/demo", "v1", &art).await;
    let reference = format!("{UPSTREAM}/shims/demo@{manifest}");
    let d = tempfile::tempdir().unwrap();
    let hosts = d.path().join("certs.d");
    let store = Store::open(d.path().join("store")).unwrap();
    let down = free_port();

    // no hosts file: only the upstream, which does not resolve
    let e = fetcher(&hosts)
        .fetch(&oci_spec(&reference), &store)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "OciPullFailed", "{e}");

    // a mirror that is down, then the registry as a mirror with its CA
    write_hosts(
        &hosts,
        &format!(
            "server = \"https://{UPSTREAM}\"\n\n[host.\"https://127.0.0.1:{down}\"]\n  capabilities = [\"pull\", \"resolve\"]\n\n[host.\"https://{}\"]\n  capabilities = [\"pull\"]\n  ca = \"{}\"\n",
            reg.host(),
            reg.ca().display()
        ),
    );
    let a = fetcher(&hosts)
        .fetch(&oci_spec(&reference), &store)
        .await
        .unwrap();
    assert_eq!(a.digest, sha256_hex(&art));
    assert!(a.dir.join("bin/containerd-shim-demo-v2").is_file());
    assert_eq!(a.insecure_host, None, "a verified mirror is not insecure");

    // without its CA the mirror's certificate is refused; skip_verify does without it
    let store2 = Store::open(d.path().join("store2")).unwrap();
    write_hosts(
        &hosts,
        &format!(
            "[host.\"https://{}\"]\n  capabilities = [\"pull\"]\n",
            reg.host()
        ),
    );
    let e = fetcher(&hosts)
        .fetch(&oci_spec(&reference), &store2)
        .await
        .unwrap_err();
    let said = e.to_string();
    assert!(
        said.contains(&format!("https://{}", reg.host()))
            && said.contains(&format!("https://{UPSTREAM}")),
        "{said}"
    );
    write_hosts(
        &hosts,
        &format!(
            "[host.\"https://{}\"]\n  capabilities = [\"pull\"]\n  skip_verify = true\n",
            reg.host()
        ),
    );
    let a = fetcher(&hosts)
        .fetch(&oci_spec(&reference), &store2)
        .await
        .unwrap();
    assert_eq!(a.digest, sha256_hex(&art));
    assert_eq!(a.insecure_host, Some(format!("https://{}", reg.host())));

    // the pin decides: a digest the mirror does not have is not taken from it under another
    let store3 = Store::open(d.path().join("store3")).unwrap();
    let other = reg.push("shims/demo", "v2", b"not the shim").await;
    assert_ne!(other, manifest);
    let wrong = format!("{UPSTREAM}/shims/demo@sha256:{}", "0".repeat(64));
    let e = fetcher(&hosts)
        .fetch(&oci_spec(&wrong), &store3)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "OciPullFailed", "{e}");

    // a hosts.toml containerd could not read either
    write_hosts(&hosts, "[host.\"https://m\"\n");
    let e = fetcher(&hosts)
        .fetch(&oci_spec(&wrong), &store3)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryHostsInvalid", "{e}");
    assert!(e.to_string().contains("hosts.toml: not valid TOML"), "{e}");
}

/// A node without a system CA bundle (a minimal image): the OCI client library cannot start
/// there (it builds a default client that panics); the agent says so, with its reason, and
/// never panics. The real binary, with the system's roots hidden from it.
#[test]
fn an_oci_pull_on_a_node_without_a_ca_bundle_is_an_error_not_a_panic() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(root.join("etc/containerd/config.toml"), "version = 2\n").unwrap();
    let shim = d.path().join("s.yaml");
    let reference = format!("127.0.0.1:1/shims/np@sha256:{}", "0".repeat(64));
    std::fs::write(
        &shim,
        crate::support::shim_builder::ShimBuilder::new("np")
            .oci(&reference)
            .yaml(),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shim-agent"))
        .args(["--config", "/dev/null", "install", "--root"])
        .arg(&root)
        .arg("-f")
        .arg(&shim)
        .env("SSL_CERT_FILE", d.path().join("none.pem"))
        .env("SSL_CERT_DIR", d.path().join("none"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(!said.contains("panicked"), "{said}");
    assert!(
        said.contains("https://127.0.0.1:1: oci pulls need the node's CA bundle"),
        "{said}"
    );
}

/// An image root whose containerd config names a registry hosts directory with a
/// `skip_verify` mirror: `install --root` fetches through it, and `status --root` says the
/// shim came from a host whose certificate was not verified (the state records the host).
#[test]
fn a_shim_fetched_through_a_skip_verify_host_is_reported_insecure_in_status() {
    let Some(reg) = registry(TEST) else { return };
    let art = good_shim_tgz();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let manifest = rt.block_on(reg.push("shims/demo", "v1", &art));
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("img");
    std::fs::create_dir_all(root.join("etc/containerd")).unwrap();
    std::fs::write(
        root.join("etc/containerd/config.toml"),
        "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\n  config_path = \"/etc/containerd/certs.d\"\n",
    )
    .unwrap();
    write_hosts(
        &root.join("etc/containerd/certs.d"),
        &format!(
            "[host.\"https://{}\"]\n  capabilities = [\"pull\"]\n  skip_verify = true\n",
            reg.host()
        ),
    );
    let shim = d.path().join("shim.yaml");
    let yaml = crate::support::shim_builder::ShimBuilder::new("demo")
        .oci(&format!("{UPSTREAM}/shims/demo@{manifest}"))
        .yaml();
    std::fs::write(&shim, yaml).unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shim-agent"))
            .args(["--config", "/dev/null"])
            .args(args)
            .arg("--root")
            .arg(&root)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{args:?}: {said}");
        said
    };
    run(&["install", "-f", shim.to_str().unwrap()]);
    let status = run(&["status"]);
    let line = format!(
        "insecure: demo was fetched from https://{} without verifying its certificate",
        reg.host()
    );
    assert!(status.contains(&line), "{status}");
    let json = run(&["status", "--json"]);
    assert!(
        json.contains(&format!("\"insecure_source\": \"https://{}\"", reg.host())),
        "{json}"
    );
}
