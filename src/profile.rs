//! Distro profiles: where containerd's config lives, which drop-in directory the distro
//! wants, and which systemd unit runs containerd (docs/design.md §4).
//!
//! Detection is a pure function of which marker paths exist under the root, so it is tested
//! without a host; every field can be overridden in the agent's settings.

use crate::hostroot::HostRoot;
use crate::settings::ContainerdSettings;

/// What the agent needs to know about the node's containerd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Profile {
    /// Profile name (`containerd`, `k0s`, `k3s`, ...).
    pub name: String,
    /// containerd's main config file (host path).
    pub config: String,
    /// Drop-in directory the distro reads, if it has one (host path).
    pub dropin_dir: Option<String>,
    /// systemd unit that runs containerd.
    pub unit: String,
    /// containerd's gRPC socket (host path).
    pub socket: String,
}

/// Marker paths that identify a distro, checked in order.
const MARKERS: &[(&str, &str)] = &[
    ("/etc/k0s/containerd.toml", "k0s"),
    (
        "/var/snap/microk8s/current/args/containerd-template.toml",
        "microk8s",
    ),
    ("/etc/systemd/system/rke2-agent.service", "rke2-agent"),
    (
        "/usr/local/lib/systemd/system/rke2-agent.service",
        "rke2-agent",
    ),
    ("/etc/systemd/system/k3s-agent.service", "k3s-agent"),
    ("/etc/systemd/system/k3s.service", "k3s"),
];

/// The built-in defaults of a named profile.
pub fn builtin(name: &str) -> Profile {
    let p = |config: &str, dropin: Option<&str>, unit: &str, socket: &str| Profile {
        name: name.to_string(),
        config: config.to_string(),
        dropin_dir: dropin.map(str::to_string),
        unit: unit.to_string(),
        socket: socket.to_string(),
    };
    const K3S_CONFIG: &str = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml";
    const K3S_SOCK: &str = "/run/k3s/containerd/containerd.sock";
    const RKE2_CONFIG: &str = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml";
    match name {
        "k0s" => p(
            "/etc/k0s/containerd.toml",
            Some("/etc/k0s/containerd.d"),
            "k0sworker.service",
            "/run/k0s/containerd.sock",
        ),
        "k3s" => p(K3S_CONFIG, None, "k3s.service", K3S_SOCK),
        "k3s-agent" => p(K3S_CONFIG, None, "k3s-agent.service", K3S_SOCK),
        "rke2-agent" => p(
            RKE2_CONFIG,
            None,
            "rke2-agent.service",
            "/run/k3s/containerd/containerd.sock",
        ),
        "rke2-server" => p(
            RKE2_CONFIG,
            None,
            "rke2-server.service",
            "/run/k3s/containerd/containerd.sock",
        ),
        "microk8s" => p(
            "/var/snap/microk8s/current/args/containerd-template.toml",
            None,
            "snap.microk8s.daemon-containerd.service",
            "/var/snap/microk8s/common/run/containerd.sock",
        ),
        _ => p(
            "/etc/containerd/config.toml",
            None,
            "containerd.service",
            "/run/containerd/containerd.sock",
        ),
    }
}

/// Pick the profile name from which marker paths exist.
pub fn detect_name(exists: impl Fn(&str) -> bool) -> &'static str {
    MARKERS
        .iter()
        .find(|(path, _)| exists(path))
        .map(|(_, name)| *name)
        .unwrap_or("containerd")
}

/// The effective profile: detected (or named in settings), then settings override fields.
pub fn resolve(root: &HostRoot, settings: &ContainerdSettings) -> Profile {
    let name = if settings.profile == "auto" {
        detect_name(|p| root.resolve(p).map(|l| l.exists()).unwrap_or(false)).to_string()
    } else {
        settings.profile.clone()
    };
    let mut profile = builtin(&name);
    if !settings.config.is_empty() {
        profile.config = settings.config.clone();
    }
    if !settings.dropin_dir.is_empty() {
        profile.dropin_dir = Some(settings.dropin_dir.clone());
    }
    if !settings.unit.is_empty() {
        profile.unit = settings.unit.clone();
    }
    if settings.socket != ContainerdSettings::default().socket || name == "containerd" {
        profile.socket = settings.socket.clone();
    }
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_containerd_is_the_default() {
        assert_eq!(detect_name(|_| false), "containerd");
        let p = builtin("containerd");
        assert_eq!(p.config, "/etc/containerd/config.toml");
        assert_eq!(p.unit, "containerd.service");
    }

    #[test]
    fn distros_are_detected_by_their_marker_files() {
        assert_eq!(detect_name(|p| p == "/etc/k0s/containerd.toml"), "k0s");
        assert_eq!(
            detect_name(|p| p == "/etc/systemd/system/k3s-agent.service"),
            "k3s-agent"
        );
        assert_eq!(
            detect_name(|p| p.ends_with("rke2-agent.service")),
            "rke2-agent"
        );
        assert_eq!(
            builtin("k0s").dropin_dir.as_deref(),
            Some("/etc/k0s/containerd.d")
        );
        assert_eq!(builtin("k3s-agent").unit, "k3s-agent.service");
    }

    #[test]
    fn settings_override_the_profile() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc/k0s")).unwrap();
        std::fs::write(d.path().join("etc/k0s/containerd.toml"), "").unwrap();
        let root = HostRoot::new(d.path()).unwrap();
        let mut s = ContainerdSettings::default();
        assert_eq!(resolve(&root, &s).name, "k0s");
        s.unit = "my-containerd.service".into();
        s.config = "/srv/containerd.toml".into();
        let p = resolve(&root, &s);
        assert_eq!(
            (p.unit.as_str(), p.config.as_str()),
            ("my-containerd.service", "/srv/containerd.toml")
        );
        s.profile = "containerd".into();
        assert_eq!(resolve(&root, &s).name, "containerd");
    }
}
