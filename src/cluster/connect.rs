//! Reaching the cluster: which kubeconfig, which node, and credentials that rotate on disk.
//!
//! The kubeconfig is `kubernetes.kubeconfig` when set; else the kubelet's
//! ([`KUBELET_KUBECONFIGS`], the first that exists), so the agent acts with the node's own
//! identity; else the in-cluster service account. The kubelet rotates its client certificate
//! (`kubelet-client-current.pem`) in place: [`CredentialWatch`] fingerprints the kubeconfig
//! and every file it names, and the agent reconnects with the new certificate when the
//! fingerprint changes, without a restart.

use std::path::{Path, PathBuf};

use anyhow::Context;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use sha2::{Digest, Sha256};

use crate::settings::Settings;

/// The kubelet's kubeconfigs, in the order they are tried (kubeadm's, then the others').
pub const KUBELET_KUBECONFIGS: &[&str] = &[
    "/etc/kubernetes/kubelet.conf",
    "/var/lib/kubelet/kubeconfig",
];

/// How often rotated credentials are looked for.
pub const CREDENTIAL_CHECK_SECS: u64 = 30;

/// Where the agent's credentials come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Kubeconfig(PathBuf),
    InCluster,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Kubeconfig(p) => write!(f, "kubeconfig {}", p.display()),
            Source::InCluster => f.write_str("in-cluster service account"),
        }
    }
}

/// Pick the credentials: the configured kubeconfig, the kubelet's, or in-cluster; `None`
/// when there is no cluster to talk to (the agent then runs static Shims only).
pub fn find_source(settings: &Settings) -> anyhow::Result<Option<Source>> {
    let configured = settings.kubernetes.kubeconfig.trim();
    if !configured.is_empty() {
        let p = PathBuf::from(configured);
        anyhow::ensure!(
            p.is_file(),
            "kubernetes.kubeconfig {} does not exist; fix the setting in the agent's config",
            p.display()
        );
        return Ok(Some(Source::Kubeconfig(p)));
    }
    if let Some(p) = KUBELET_KUBECONFIGS
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
    {
        return Ok(Some(Source::Kubeconfig(p.to_path_buf())));
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Ok(Some(Source::InCluster));
    }
    Ok(None)
}

/// A client for `source`, with every file read now.
pub async fn client(source: &Source) -> anyhow::Result<Client> {
    let config = match source {
        Source::Kubeconfig(p) => {
            let kc = Kubeconfig::read_from(p)
                .with_context(|| format!("cannot read kubeconfig {}", p.display()))?;
            Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {} is not usable", p.display()))?
        }
        Source::InCluster => Config::incluster().context("in-cluster configuration")?,
    };
    Client::try_from(config).context("cannot build the Kubernetes client")
}

/// The node's name in Kubernetes: `node.name`, else the host name (lower-cased, as the
/// kubelet registers it).
pub fn node_name(settings: &Settings) -> anyhow::Result<String> {
    let configured = settings.node.name.trim();
    if !configured.is_empty() {
        return Ok(configured.to_string());
    }
    // gethostname(2), not /proc/sys/kernel/hostname: the unit hides /proc's non-process files
    let host = nix::unistd::gethostname().context("cannot read the host name (gethostname)")?;
    let host = host.to_string_lossy().trim().to_lowercase();
    anyhow::ensure!(
        !host.is_empty(),
        "the host name is empty; set node.name in the agent's config"
    );
    Ok(host)
}

/// Fingerprint of the credentials on disk: the kubeconfig and the files it names.
#[derive(Debug, Clone)]
pub struct CredentialWatch {
    source: Source,
    last: Option<[u8; 32]>,
}

impl CredentialWatch {
    pub fn new(source: Source) -> Self {
        let mut w = CredentialWatch { source, last: None };
        w.last = w.fingerprint();
        w
    }

    /// True when the credentials changed since the last call (or since `new`).
    pub fn changed(&mut self) -> bool {
        let now = self.fingerprint();
        if now.is_some() && now != self.last {
            self.last = now;
            return true;
        }
        false
    }

    fn fingerprint(&self) -> Option<[u8; 32]> {
        let Source::Kubeconfig(path) = &self.source else {
            return None;
        };
        let mut h = Sha256::new();
        let text = std::fs::read(path).ok()?;
        h.update(&text);
        let base = path.parent().unwrap_or(Path::new("/"));
        if let Ok(kc) = Kubeconfig::read_from(path) {
            for a in kc.auth_infos.iter().filter_map(|a| a.auth_info.as_ref()) {
                for f in [&a.client_certificate, &a.client_key].into_iter().flatten() {
                    h.update(std::fs::read(base.join(f)).unwrap_or_default());
                }
            }
        }
        Some(h.finalize().into())
    }
}
