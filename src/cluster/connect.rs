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

/// The credentials there are now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Ready to connect with.
    Ready(Source),
    /// A kubeconfig is expected but not usable yet (first boot: the kubelet's TLS bootstrap
    /// or `kubeadm join` writes it, and its client certificate, after the agent started);
    /// what is missing.
    Waiting(String),
    /// No cluster to talk to: static Shims only.
    Nothing,
}

/// How often a node without usable credentials looks for them again.
pub const KUBECONFIG_POLL_SECS: u64 = 2;

/// Pick the credentials: the configured kubeconfig, the kubelet's, or in-cluster. A
/// kubeconfig counts once it parses and the client certificate and key it names exist.
pub fn find(settings: &Settings) -> Found {
    let configured = settings.kubernetes.kubeconfig.trim();
    if !configured.is_empty() {
        let p = PathBuf::from(configured);
        if !p.is_file() {
            return Found::Waiting(format!(
                "kubernetes.kubeconfig {} does not exist (yet); fix the setting if it never will",
                p.display()
            ));
        }
        return ready_or_waiting(p);
    }
    if let Some(p) = KUBELET_KUBECONFIGS
        .iter()
        .map(Path::new)
        .find(|p| p.is_file())
    {
        return ready_or_waiting(p.to_path_buf());
    }
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return Found::Ready(Source::InCluster);
    }
    Found::Nothing
}

fn ready_or_waiting(p: PathBuf) -> Found {
    match missing_credentials(&p) {
        None => Found::Ready(Source::Kubeconfig(p)),
        Some(why) => Found::Waiting(why),
    }
}

/// What keeps the kubeconfig at `path` from being used, if anything: it does not parse, or
/// its current user's client certificate or key file does not exist yet.
pub fn missing_credentials(path: &Path) -> Option<String> {
    let kc = match Kubeconfig::read_from(path) {
        Ok(kc) => kc,
        Err(e) => {
            return Some(format!(
                "kubeconfig {} does not parse yet: {e}",
                path.display()
            ));
        }
    };
    let base = path.parent().unwrap_or(Path::new("/"));
    let context = kc.current_context.as_deref();
    let user = kc
        .contexts
        .iter()
        .find(|c| Some(c.name.as_str()) == context)
        .and_then(|c| c.context.as_ref())
        .and_then(|c| c.user.clone());
    let auth = kc
        .auth_infos
        .iter()
        .find(|a| user.as_deref().is_none_or(|u| a.name == u))
        .and_then(|a| a.auth_info.as_ref())?;
    for f in [&auth.client_certificate, &auth.client_key]
        .into_iter()
        .flatten()
    {
        let file = base.join(f);
        if !file.is_file() {
            return Some(format!(
                "kubeconfig {} names {}, which does not exist yet",
                path.display(),
                file.display()
            ));
        }
    }
    None
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
    super::transport::client(config).context("cannot build the Kubernetes client")
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

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: node\n  user: {client-certificate: pki/kubelet-client-current.pem, client-key: pki/kubelet-client-current.pem}\ncontexts:\n- name: ctx\n  context: {cluster: c, user: node}\ncurrent-context: ctx\n";

    #[test]
    fn a_kubeconfig_counts_once_it_parses_and_its_client_certificate_exists() {
        let d = tempfile::tempdir().unwrap();
        let path = d.path().join("kubeconfig");
        let mut settings = Settings::default();
        settings.kubernetes.kubeconfig = path.display().to_string();
        // first boot: not written yet
        let Found::Waiting(why) = find(&settings) else {
            panic!("{:?}", find(&settings))
        };
        assert!(why.contains("does not exist"), "{why}");
        // half written
        std::fs::write(&path, "apiVersion: v1\nclusters: [").unwrap();
        assert!(matches!(find(&settings), Found::Waiting(w) if w.contains("does not parse")));
        // written, its certificate not issued yet (the kubelet's TLS bootstrap)
        std::fs::write(&path, KUBECONFIG).unwrap();
        let Found::Waiting(why) = find(&settings) else {
            panic!("{:?}", find(&settings))
        };
        assert!(why.contains("kubelet-client-current.pem"), "{why}");
        std::fs::create_dir(d.path().join("pki")).unwrap();
        std::fs::write(d.path().join("pki/kubelet-client-current.pem"), "pem").unwrap();
        assert_eq!(find(&settings), Found::Ready(Source::Kubeconfig(path)));
    }
}
