//! Distro profiles: where containerd's config lives, how the distro wants it changed, and
//! which systemd unit runs containerd (docs/design.md §4).
//!
//! Each distro is changed the way it documents:
//! - plain containerd: `/etc/containerd/config.toml`, in place or as a drop-in;
//! - k3s and rke2 render containerd's config from a Go template at every start: the agent
//!   writes a drop-in into the `config-v3.toml.d/` the rendered config imports (k3s-io/k3s
//!   #13680), else the template (`config.toml.tmpl`, `config-v3.toml.tmpl` for their
//!   containerd 2.x releases) starting from `{{ template "base" . }}`, and restarts the
//!   distro's unit;
//! - microk8s renders `args/containerd.toml` from `args/containerd-template.toml` with sed: the
//!   agent edits the template, keeping its `${…}` placeholders;
//! - k0s: drop-ins in `/etc/k0s/containerd.d/`;
//! - Talos, Bottlerocket and Flatcar's read-only default are refused as unsupported before
//!   anything is written.
//!
//! Detection is a pure function of which marker paths exist under the root (and what
//! `/etc/os-release` says), so it is tested without a host; every field can be overridden in
//! the agent's settings. No version string is read: k3s's containerd stopped calling itself
//! `…-k3s1` in 1.34.

use crate::containerd::Layout;
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
    /// How the config is changed.
    pub form: Form,
}

/// How a distro wants containerd's config changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Form {
    /// Edit `config` (in place, or a drop-in in `dropin_dir`).
    File,
    /// `config` is rendered from a Go template beside it at every start (k3s, rke2): write the
    /// template. `base`: start a new template from `{{ template "base" . }}` (k3s/rke2 since
    /// their September 2023 releases) rather than from a copy of the rendered file.
    GoTemplate { base: bool },
    /// Not supported: why, and what to do instead.
    Unsupported(String),
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
    ("/usr/lib/systemd/system/rke2-agent.service", "rke2-agent"),
    ("/etc/systemd/system/rke2-server.service", "rke2-server"),
    (
        "/usr/local/lib/systemd/system/rke2-server.service",
        "rke2-server",
    ),
    ("/usr/lib/systemd/system/rke2-server.service", "rke2-server"),
    ("/etc/systemd/system/k3s-agent.service", "k3s-agent"),
    ("/etc/systemd/system/k3s.service", "k3s"),
];

/// `/etc/os-release` IDs of systems whose containerd config the agent must not touch.
const UNSUPPORTED_OS: &[(&str, &str)] = &[
    (
        "talos",
        "Talos: the root is read-only and containerd's CRI config is merged from the machine config; add the runtime with a machine config patch (/etc/cri/conf.d)",
    ),
    (
        "bottlerocket",
        "Bottlerocket: containerd's config is rendered from the API settings; use its settings API or a bootstrap container",
    ),
];

/// The built-in defaults of a named profile.
pub fn builtin(name: &str) -> Profile {
    let p = |config: &str, dropin: Option<&str>, unit: &str, socket: &str| Profile {
        name: name.to_string(),
        config: config.to_string(),
        dropin_dir: dropin.map(str::to_string),
        unit: unit.to_string(),
        socket: socket.to_string(),
        form: if config.starts_with("/var/lib/rancher/") {
            Form::GoTemplate { base: true }
        } else {
            Form::File
        },
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

/// Why this system is not supported, from `/etc/os-release` and the config file's place:
/// Talos, Bottlerocket, or a containerd that reads a config under read-only `/usr` only.
pub fn unsupported(os_release: &str, exists: impl Fn(&str) -> bool) -> Option<String> {
    let id = os_release
        .lines()
        .filter_map(|l| l.strip_prefix("ID="))
        .map(|v| v.trim().trim_matches('"').to_ascii_lowercase())
        .next()
        .unwrap_or_default();
    if let Some((_, why)) = UNSUPPORTED_OS.iter().find(|(os, _)| *os == id) {
        return Some((*why).to_string());
    }
    if !exists("/etc/containerd/config.toml") && exists("/usr/share/containerd/config.toml") {
        return Some(
            "containerd reads /usr/share/containerd/config.toml, under read-only /usr (Flatcar): \
             copy it to /etc/containerd/config.toml and point containerd.service at that file \
             (`containerd --config`), then run the agent again"
                .to_string(),
        );
    }
    None
}

/// The effective profile: detected (or named in settings), then settings override fields.
pub fn resolve(root: &HostRoot, settings: &ContainerdSettings) -> Profile {
    let exists = |p: &str| root.resolve(p).map(|l| l.exists()).unwrap_or(false);
    let name = if settings.profile == "auto" {
        detect_name(exists).to_string()
    } else {
        settings.profile.clone()
    };
    let mut profile = builtin(&name);
    if settings.profile == "auto" && name == "containerd" {
        let os_release = root
            .resolve("/etc/os-release")
            .ok()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        if let Some(why) = unsupported(&os_release, exists) {
            profile.form = Form::Unsupported(why);
        }
    }
    // k0s as controller and worker in one (`k0s install controller --enable-worker`) runs
    // containerd under k0scontroller.service.
    if name == "k0s"
        && !exists("/etc/systemd/system/k0sworker.service")
        && exists("/etc/systemd/system/k0scontroller.service")
    {
        profile.unit = "k0scontroller.service".into();
    }
    if let Form::GoTemplate { base } = &mut profile.form {
        *base = settings.template_base;
    }
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

impl Profile {
    /// What the config engine reads and writes for this profile.
    pub fn layout(&self) -> Layout {
        match &self.form {
            Form::File => Layout::Files {
                config: self.config.clone().into(),
                dropin_dir: self.dropin_dir.as_ref().map(Into::into),
            },
            Form::GoTemplate { base } => Layout::GoTemplate {
                rendered: self.config.clone().into(),
                base: *base,
            },
            Form::Unsupported(why) => Layout::Unsupported {
                profile: self.name.clone(),
                why: why.clone(),
            },
        }
    }
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

    #[test]
    fn every_distro_is_detected_with_its_form_unit_and_socket() {
        let cases = [
            ("/etc/systemd/system/k3s.service", "k3s", "k3s.service"),
            (
                "/etc/systemd/system/k3s-agent.service",
                "k3s-agent",
                "k3s-agent.service",
            ),
            (
                "/usr/lib/systemd/system/rke2-server.service",
                "rke2-server",
                "rke2-server.service",
            ),
            (
                "/usr/local/lib/systemd/system/rke2-agent.service",
                "rke2-agent",
                "rke2-agent.service",
            ),
        ];
        for (marker, name, unit) in cases {
            assert_eq!(detect_name(|p| p == marker), name);
            let p = builtin(name);
            assert_eq!(p.unit, unit);
            assert_eq!(p.socket, "/run/k3s/containerd/containerd.sock");
            assert_eq!(p.form, Form::GoTemplate { base: true }, "{name}");
        }
        let m = builtin("microk8s");
        assert_eq!(
            m.form,
            Form::File,
            "microk8s's template is edited as a file"
        );
        assert!(m.config.ends_with("args/containerd-template.toml"));
        assert_eq!(m.unit, "snap.microk8s.daemon-containerd.service");
        assert_eq!(builtin("k0s").form, Form::File);
    }

    fn root_with(files: &[(&str, &str)]) -> (tempfile::TempDir, HostRoot) {
        let d = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = d.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        let root = HostRoot::new(d.path()).unwrap();
        (d, root)
    }

    #[test]
    fn k0s_as_controller_and_worker_restarts_the_controller_unit() {
        let (_d, root) = root_with(&[
            ("/etc/k0s/containerd.toml", ""),
            ("/etc/systemd/system/k0scontroller.service", ""),
        ]);
        let p = resolve(&root, &ContainerdSettings::default());
        assert_eq!(
            (p.name.as_str(), p.unit.as_str()),
            ("k0s", "k0scontroller.service")
        );
        let (_d, root) = root_with(&[
            ("/etc/k0s/containerd.toml", ""),
            ("/etc/systemd/system/k0sworker.service", ""),
        ]);
        assert_eq!(
            resolve(&root, &ContainerdSettings::default()).unit,
            "k0sworker.service"
        );
    }

    #[test]
    fn talos_bottlerocket_and_flatcars_read_only_default_are_unsupported() {
        for (os, word) in [
            ("ID=talos\n", "Talos"),
            ("NAME=x\nID=\"bottlerocket\"\n", "Bottlerocket"),
        ] {
            let (_d, root) = root_with(&[("/etc/os-release", os)]);
            let p = resolve(&root, &ContainerdSettings::default());
            match p.form {
                Form::Unsupported(why) => assert!(why.contains(word), "{why}"),
                other => panic!("{os}: {other:?}"),
            }
        }
        let (_d, root) = root_with(&[
            ("/etc/os-release", "ID=flatcar\n"),
            ("/usr/share/containerd/config.toml", "version = 2\n"),
        ]);
        let Form::Unsupported(why) = resolve(&root, &ContainerdSettings::default()).form else {
            panic!("flatcar without /etc/containerd/config.toml")
        };
        assert!(why.contains("/usr/share/containerd/config.toml"), "{why}");
        // Flatcar with its config moved to /etc, as its docs describe, is plain containerd
        let (_d, root) = root_with(&[
            ("/etc/os-release", "ID=flatcar\n"),
            ("/usr/share/containerd/config.toml", "version = 2\n"),
            ("/etc/containerd/config.toml", "version = 2\n"),
        ]);
        assert_eq!(
            resolve(&root, &ContainerdSettings::default()).form,
            Form::File
        );
    }

    #[test]
    fn k3s_and_rke2_are_found_by_their_units_whatever_their_containerd_calls_itself() {
        // Since v1.34 k3s's containerd reports a plain `v2.1.5`, no `-k3s1` suffix: nothing
        // here reads a version string, the unit file decides, even beside a stock containerd.
        let rendered = "# File generated by k3s. DO NOT EDIT. Use config-v3.toml.tmpl instead.\n\
                        version = 3\n";
        for (unit, config, name) in [
            (
                "/etc/systemd/system/k3s.service",
                "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                "k3s",
            ),
            (
                "/usr/local/lib/systemd/system/rke2-agent.service",
                "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
                "rke2-agent",
            ),
        ] {
            let (_d, root) = root_with(&[
                (unit, "[Service]\nExecStart=/usr/local/bin/k3s server\n"),
                (config, rendered),
                ("/etc/containerd/config.toml", "version = 3\n"),
                (
                    "/usr/bin/containerd",
                    "containerd github.com/containerd/containerd/v2 v2.1.5",
                ),
            ]);
            let p = resolve(&root, &ContainerdSettings::default());
            assert_eq!(p.name, name);
            assert_eq!(p.config, config);
            assert_eq!(p.form, Form::GoTemplate { base: true });
        }
    }

    #[test]
    fn the_template_base_setting_reaches_the_k3s_form() {
        let (_d, root) = root_with(&[("/etc/systemd/system/k3s.service", "")]);
        let mut s = ContainerdSettings::default();
        assert_eq!(resolve(&root, &s).form, Form::GoTemplate { base: true });
        s.template_base = false;
        assert_eq!(resolve(&root, &s).form, Form::GoTemplate { base: false });
        s.profile = "containerd".into();
        assert_eq!(resolve(&root, &s).form, Form::File);
    }
}
