//! A real OCI registry for the tests: Debian's docker-registry (the CNCF distribution
//! registry), unpacked by scripts/lib.sh's `debian_tool` (scripts/test exports its path as
//! `SHIM_AGENT_DOCKER_REGISTRY`), serving TLS with a certificate from the test CA
//! ([`super::tls`]) on a free loopback port, its storage in a temporary directory. Stopped
//! on drop. Without it the caller skips, unless `SHIM_AGENT_REQUIRE_REGISTRY=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

pub struct Registry {
    child: Child,
    pub port: u16,
    /// The test CA that signed its certificate.
    pub ca_pem: PathBuf,
    _dir: tempfile::TempDir,
}

fn binary() -> Option<PathBuf> {
    let p = std::env::var_os("SHIM_AGENT_DOCKER_REGISTRY")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            "/var/tmp/shim-agent-tools/docker-registry/root/usr/bin/docker-registry".into()
        });
    p.is_file().then_some(p)
}

pub use super::free_port;

/// The user and password of [`registry_with_login`]'s registry (bcrypt, as htpasswd -B).
pub const USER: &str = "shims";
pub const PASSWORD: &str = "reg-pa55";
const HTPASSWD: &str = "shims:$2b$04$Tz7KMSAzji9ahN2KCOTHN.dmv0e55oU6qww3iTgO4toOUW9VZVRc.\n";

/// A running registry, or `None` (skipped, saying why) without docker-registry here.
pub fn registry(test: &str) -> Option<Registry> {
    start(test, false)
}

/// A registry that serves only [`USER`] with [`PASSWORD`] (htpasswd).
pub fn registry_with_login(test: &str) -> Option<Registry> {
    start(test, true)
}

fn start(test: &str, login: bool) -> Option<Registry> {
    let Some(bin) = binary() else {
        super::skip(
            test,
            "SHIM_AGENT_REQUIRE_REGISTRY",
            "no docker-registry: run scripts/test, or set SHIM_AGENT_DOCKER_REGISTRY (Debian's docker-registry)",
        );
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    super::tls::make_certs(dir.path(), "registry.test");
    let port = free_port();
    let d = dir.path().display();
    let conf = dir.path().join("config.yml");
    let mut yaml = format!(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {d}/data\nhttp:\n  addr: 127.0.0.1:{port}\n  tls:\n    certificate: {d}/server.pem\n    key: {d}/server.key\n"
    );
    if login {
        std::fs::write(dir.path().join("htpasswd"), HTPASSWD).expect("write htpasswd");
        yaml.push_str(&format!(
            "auth:\n  htpasswd:\n    realm: test-registry\n    path: {d}/htpasswd\n"
        ));
    }
    std::fs::write(&conf, yaml).expect("write the registry's config");
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg(&conf);
    let child = super::spawn_listening(cmd, port, "docker-registry", 20);
    Some(Registry {
        child,
        port,
        ca_pem: dir.path().join("ca.pem"),
        _dir: dir,
    })
}

impl Registry {
    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Push `layer` as the one layer of an artifact `repo:tag`; its manifest digest.
    pub async fn push(&self, repo: &str, tag: &str, layer: &[u8]) -> String {
        self.push_as(repo, tag, layer, &RegistryAuth::Anonymous)
            .await
    }

    /// [`Registry::push`] with these credentials.
    pub async fn push_as(
        &self,
        repo: &str,
        tag: &str,
        layer: &[u8],
        auth: &RegistryAuth,
    ) -> String {
        let client = self.client();
        let reference: Reference = format!("{}/{repo}:{tag}", self.host())
            .parse()
            .expect("reference");
        let layers = [ImageLayer::new(
            layer.to_vec(),
            "application/vnd.oci.image.layer.v1.tar+gzip".into(),
            None,
        )];
        let config = Config::new(
            b"{}".to_vec(),
            "application/vnd.oci.empty.v1+json".into(),
            None,
        );
        client
            .push(&reference, &layers, config, auth, None)
            .await
            .expect("push to docker-registry");
        client
            .fetch_manifest_digest(&reference, auth)
            .await
            .expect("the pushed manifest's digest")
    }

    fn client(&self) -> Client {
        // as the agent does before its first client (a second install is refused: fine)
        let _ = rustls::crypto::ring::default_provider().install_default();
        Client::new(ClientConfig {
            extra_root_certificates: vec![Certificate {
                encoding: CertificateEncoding::Pem,
                data: std::fs::read(&self.ca_pem).expect("the test CA"),
            }],
            ..ClientConfig::default()
        })
    }

    /// Push `data` as a blob of `repo`; its descriptor's digest (`sha256:<hex>`).
    pub async fn push_blob(&self, repo: &str, data: &[u8]) -> String {
        let digest = format!("sha256:{}", super::sha256_hex(data));
        let reference: Reference = format!("{}/{repo}:unused", self.host())
            .parse()
            .expect("reference");
        self.client()
            .push_blob(&reference, data.to_vec(), &digest)
            .await
            .expect("push a blob to docker-registry");
        digest
    }

    /// Put `manifest` at `repo:tag` as `media_type`, as is; its digest.
    pub async fn put_manifest(
        &self,
        repo: &str,
        tag: &str,
        manifest: &[u8],
        media_type: &str,
    ) -> String {
        let reference: Reference = format!("{}/{repo}:{tag}", self.host())
            .parse()
            .expect("reference");
        let client = self.client();
        client
            .auth(
                &reference,
                &RegistryAuth::Anonymous,
                oci_client::RegistryOperation::Push,
            )
            .await
            .expect("auth");
        client
            .push_manifest_raw(
                &reference,
                manifest.to_vec(),
                reqwest::header::HeaderValue::from_str(media_type).expect("a media type"),
            )
            .await
            .expect("put a manifest to docker-registry");
        format!("sha256:{}", super::sha256_hex(manifest))
    }

    /// The CA file's path.
    pub fn ca(&self) -> &Path {
        &self.ca_pem
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
