//! The doctor's judgement (pure): each fact becomes a finding with a level and, when
//! something is wrong, what to do about it. `fail` is kept for what blocks installs.

use super::facts::*;
use super::finding::{Finding, Level, check};
use crate::artifact::ContainerdVersion;

/// Below this much free space an install is refused by the doctor's judgement (a shim and
/// its unpacked files; runwasi's are 20 to 80 MiB).
pub const MIN_FREE_BYTES: u64 = 128 << 20;
/// Below this much free space the doctor warns.
pub const LOW_FREE_BYTES: u64 = 1 << 30;
/// Clock skew the doctor accepts without a word: the API server's `Date` has whole seconds.
pub const SKEW_OK_SECS: f64 = 2.0;
/// The oldest containerd line the agent is tested with.
const OLDEST_TESTED: (u64, u64) = (1, 6);

/// Every finding, in the order a person reads them: containerd, CRI, cluster, disk, policy.
pub fn judge(f: &Facts) -> Vec<Finding> {
    let mut out = vec![profile(&f.profile), config(&f.config)];
    out.push(match &f.unit {
        Some(u) => unit(&f.profile.unit, u),
        None => skipped(check::UNIT),
    });
    let cri_down = matches!(f.cri, Some(Err(_)));
    out.push(if cri_down {
        Finding::new(check::VERSION, Level::Skip, CRI_DOWN)
    } else {
        version(&f.version)
    });
    out.extend(registry_hosts(&f.config, &f.hosts_dirs));
    out.push(match &f.cri {
        Some(c) => cri(&f.profile.socket, c),
        None => skipped(check::CRI),
    });
    out.push(match &f.sandbox_image {
        Some(s) => sandbox_image(s),
        None if cri_down => Finding::new(check::SANDBOX_IMAGE, Level::Skip, CRI_DOWN),
        None => skipped(check::SANDBOX_IMAGE),
    });
    out.extend(cluster(f));
    out.extend(f.space.iter().map(space));
    out.push(proxies(&f.proxies));
    out.push(signature_policy(&f.signatures));
    out
}

/// Why a check that needs containerd's answer was not made.
const CRI_DOWN: &str = "not asked: containerd's CRI does not answer (see cri.socket)";

fn skipped(id: &'static str) -> Finding {
    Finding::new(id, Level::Skip, "not checked in an image root")
}

fn profile(p: &ProfileFacts) -> Finding {
    match &p.unsupported {
        Some(why) => Finding::new(
            check::PROFILE,
            Level::Fail,
            format!(
                "profile {}: the agent must not change this system's containerd config: {why}",
                p.name
            ),
        )
        .remedy("add runtimes the way this system is configured; shim-agent cannot install here"),
        None => Finding::new(
            check::PROFILE,
            Level::Ok,
            format!(
                "profile {}: config {}, unit {}, socket {}",
                p.name, p.config, p.unit, p.socket
            ),
        ),
    }
}

fn config(c: &Probe<ConfigFacts>) -> Finding {
    match c {
        Ok(c) => Finding::new(
            check::CONFIG,
            Level::Ok,
            format!(
                "config version {}: {}",
                c.schema_version,
                c.files.join(", ")
            ),
        ),
        Err(e) => Finding::new(check::CONFIG, Level::Fail, e.clone()).remedy(
            "fix the file (`containerd config dump` shows what containerd makes of it), or point \
             containerd.config in /etc/shim-agent/config.toml at the file containerd reads",
        ),
    }
}

fn unit(name: &str, u: &Probe<UnitFacts>) -> Finding {
    let u = match u {
        Ok(u) => u,
        Err(e) => {
            return Finding::new(
                check::UNIT,
                Level::Fail,
                format!("cannot ask systemd about {name}: {e}"),
            )
            .remedy("run the doctor as root on the node, where systemd runs");
        }
    };
    if u.load_state != "loaded" {
        return Finding::new(check::UNIT, Level::Fail, format!("{name} is {}", u.load_state)).remedy(
            "set containerd.unit (or containerd.profile) in /etc/shim-agent/config.toml to the unit that runs containerd",
        );
    }
    if u.active_state != "active" {
        return Finding::new(
            check::UNIT,
            Level::Fail,
            format!("{name} is {}/{}", u.active_state, u.sub_state),
        )
        .remedy(format!(
            "start it (systemctl start {name}) and read why it stopped: journalctl -u {name}"
        ));
    }
    Finding::new(
        check::UNIT,
        Level::Ok,
        format!("{name} is active/{}", u.sub_state),
    )
}

fn version(v: &Probe<String>) -> Finding {
    let text = match v {
        Ok(t) => t,
        Err(e) => {
            return Finding::new(check::VERSION, Level::Warn, format!("unknown: {e}")).remedy(
                "give the image's containerd version to `install --root --containerd-version`",
            );
        }
    };
    match ContainerdVersion::parse(text) {
        Ok(p) if (p.major, p.minor) < OLDEST_TESTED => Finding::new(
            check::VERSION,
            Level::Warn,
            format!(
                "containerd {text} is older than 1.6, the oldest line shim-agent is tested with"
            ),
        )
        .remedy("upgrade containerd"),
        Ok(_) => Finding::new(check::VERSION, Level::Ok, format!("containerd {text}")),
        Err(_) => Finding::new(
            check::VERSION,
            Level::Warn,
            format!("containerd reports a version that does not parse: {text:?}"),
        )
        .remedy("Shims with builds per containerd release cannot choose one here"),
    }
}

fn registry_hosts(config: &Probe<ConfigFacts>, dirs: &[HostsDir]) -> Vec<Finding> {
    let Ok(c) = config else {
        return vec![];
    };
    let mut out = vec![];
    let legacy: Vec<&str> = c
        .legacy_mirrors
        .iter()
        .chain(&c.legacy_configs)
        .map(String::as_str)
        .collect();
    if !legacy.is_empty() {
        out.push(
            Finding::new(
                check::REGISTRY_HOSTS,
                Level::Warn,
                format!(
                    "deprecated registry.mirrors/registry.configs entries for {}",
                    legacy.join(", ")
                ),
            )
            .remedy("move them to hosts.toml files under a registry config_path (certs.d)"),
        );
    }
    let Some(path) = &c.registry_config_path else {
        out.push(Finding::new(
            check::REGISTRY_HOSTS,
            Level::Info,
            "no registry config_path: containerd pulls from each registry directly (mirrors, private CAs and credentials need hosts.toml files under one)",
        ));
        return out;
    };
    for d in dirs {
        for h in &d.registries {
            if let Some(problem) = &h.problem {
                out.push(
                    Finding::new(
                        check::REGISTRY_HOSTS,
                        Level::Warn,
                        format!("{}/{}/hosts.toml: {problem}", d.dir, h.registry),
                    )
                    .remedy(
                        "containerd cannot use that registry's settings until the file is fixed",
                    ),
                );
            }
        }
    }
    let configured: Vec<String> = dirs
        .iter()
        .flat_map(|d| d.registries.iter().map(|h| h.registry.clone()))
        .collect();
    let missing: Vec<&str> = dirs
        .iter()
        .filter(|d| !d.exists)
        .map(|d| d.dir.as_str())
        .collect();
    let mut summary = format!("config_path {path}: ");
    if configured.is_empty() {
        summary.push_str("no registry has a hosts.toml");
    } else {
        summary.push_str(&format!("hosts.toml for {}", configured.join(", ")));
    }
    if !missing.is_empty() {
        summary.push_str(&format!(" ({} does not exist)", missing.join(", ")));
    }
    out.push(Finding::new(check::REGISTRY_HOSTS, Level::Ok, summary));
    out
}

fn cri(socket: &str, c: &Probe<CriFacts>) -> Finding {
    match c {
        // the error names the socket
        Err(e) => Finding::new(check::CRI, Level::Fail, e.clone())
            .remedy("is containerd running, with its CRI plugin enabled? Else set containerd.socket in /etc/shim-agent/config.toml"),
        Ok(c) if !c.runtime_ready => Finding::new(
            check::CRI,
            Level::Fail,
            format!("containerd's runtime is not ready: {}", c.runtime_detail),
        )
        .remedy("journalctl -u containerd says why"),
        Ok(_) => Finding::new(check::CRI, Level::Ok, format!("{socket}: RuntimeReady")),
    }
}

fn sandbox_image(s: &SandboxImage) -> Finding {
    match s {
        SandboxImage::Present(i) => Finding::new(check::SANDBOX_IMAGE, Level::Ok, format!("{i} is present")),
        SandboxImage::Absent(i) => Finding::new(
            check::SANDBOX_IMAGE,
            Level::Warn,
            format!("{i} is not in containerd's image store: the runtime check of every install pulls it, and fails where its registry cannot be reached"),
        )
        .remedy(format!("ctr -n k8s.io images pull {i} (or import it from an archive on an offline node)")),
        SandboxImage::Unknown(why) => Finding::new(check::SANDBOX_IMAGE, Level::Warn, why.clone()),
    }
}

fn cluster(f: &Facts) -> Vec<Finding> {
    let Some(credentials) = &f.credentials else {
        return vec![skipped(check::CREDENTIALS)];
    };
    let mut out = vec![match credentials {
        Credentials::Ready(src) => Finding::new(check::CREDENTIALS, Level::Ok, src.clone()),
        Credentials::Waiting(why) => Finding::new(check::CREDENTIALS, Level::Warn, why.clone())
            .remedy("the node has not joined yet (the kubelet writes its kubeconfig when it does); else set kubernetes.kubeconfig"),
        Credentials::Nothing => Finding::new(
            check::CREDENTIALS,
            Level::Info,
            "no kubeconfig: the agent serves static Shims (/etc/shim-agent/shims.d) only",
        ),
    }];
    let Target::Node { name } = &f.target else {
        return out;
    };
    match &f.api {
        None => {}
        Some(Err(e)) => out.push(
            Finding::new(check::API_SERVER, Level::Fail, format!("cannot reach the API server: {e}"))
                .remedy("check the kubeconfig's server address, the network path and the proxy settings below"),
        ),
        Some(Ok(api)) => {
            out.push(Finding::new(check::API_SERVER, Level::Ok, format!("Kubernetes {}", api.server_version)));
            out.push(identity(name, &api.identity));
            out.push(skew(api.skew_secs, f.lease_duration_secs));
        }
    }
    out
}

fn identity(node: &str, id: &Probe<Identity>) -> Finding {
    let id = match id {
        Ok(id) => id,
        Err(e) => {
            return Finding::new(
                check::IDENTITY,
                Level::Warn,
                format!("the API server did not say who this is: {e}"),
            );
        }
    };
    let user = &id.username;
    let bound = ["system:node:", crate::api::rbac::AGENT_USER_PREFIX]
        .iter()
        .find_map(|p| user.strip_prefix(p));
    match bound {
        Some(n) if n == node => Finding::new(check::IDENTITY, Level::Ok, format!("{user}: Node {node}'s identity")),
        Some(n) => Finding::new(
            check::IDENTITY,
            Level::Fail,
            format!("{user} is Node {n}'s identity, but this node is {node}"),
        )
        .remedy("use this node's own kubeconfig, or set node.name to the name the kubelet registers"),
        None => Finding::new(
            check::IDENTITY,
            Level::Warn,
            format!("{user} (groups {}) is not bound to Node {node}: the agent would act with that user's rights", id.groups.join(", ")),
        )
        .remedy("give the agent the kubelet's kubeconfig or a node identity (docs/security.md)"),
    }
}

fn skew(s: Option<f64>, lease_secs: u64) -> Finding {
    let Some(s) = s else {
        return Finding::new(
            check::CLOCK_SKEW,
            Level::Warn,
            "the API server sent no usable Date header",
        );
    };
    let limit = lease_secs as f64 / 2.0;
    let text = format!(
        "this node's clock is {:.1} s {} the API server's",
        s.abs(),
        if s > 0.0 { "behind" } else { "ahead of" }
    );
    let level = match s.abs() {
        a if a <= SKEW_OK_SECS => return Finding::new(check::CLOCK_SKEW, Level::Ok, text),
        a if a <= limit => Level::Warn,
        _ => Level::Fail,
    };
    Finding::new(
        check::CLOCK_SKEW,
        level,
        format!("{text}; rollout slots and the election expire after {lease_secs} s"),
    )
    .remedy("synchronise the clock (systemd-timesyncd, chrony)")
}

fn space(s: &SpaceFacts) -> Finding {
    let id = if s.what == "state" {
        check::DISK_STATE
    } else {
        check::DISK_INSTALL
    };
    let free = match &s.free {
        Ok(b) => *b,
        Err(e) => return Finding::new(id, Level::Warn, format!("{}: {e}", s.path)),
    };
    let text = format!("{}: {} MiB free", s.path, free >> 20);
    let level = match free {
        b if b < MIN_FREE_BYTES => Level::Fail,
        b if b < LOW_FREE_BYTES => Level::Warn,
        _ => return Finding::new(id, Level::Ok, text),
    };
    Finding::new(id, level, text).remedy(format!(
        "free space on that filesystem (installs need at least {} MiB)",
        MIN_FREE_BYTES >> 20
    ))
}

fn proxies(sources: &[ProxySource]) -> Finding {
    if sources.is_empty() {
        return skipped(check::PROXY);
    }
    let parts: Vec<String> = sources
        .iter()
        .map(|p| match &p.vars {
            Ok(v) if v.is_empty() => format!("{}: none", p.source),
            Ok(v) => {
                let vars: Vec<String> = v.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("{}: {}", p.source, vars.join(" "))
            }
            Err(e) => format!("{}: not read ({e})", p.source),
        })
        .collect();
    Finding::new(check::PROXY, Level::Info, parts.join("; "))
}

fn signature_policy(s: &Probe<SignatureFacts>) -> Finding {
    let id = check::SIGNATURE_POLICY;
    match s {
        Err(e) => Finding::new(id, Level::Fail, format!("[signatures] cannot be loaded: {e}"))
            .remedy("fix [signatures] in the agent's config: each of keys a PEM public key file, trusted-root a Sigstore trusted_root.json; until then every install fails"),
        Ok(p) if !p.require => Finding::new(
            id,
            Level::Info,
            "no node signature policy: each Shim's spec.signature decides; a Shim without one is verified by its sha256 digest only",
        ),
        Ok(p) => Finding::new(
            id,
            Level::Ok,
            format!(
                "signatures required: {} identities and {} keys trusted, against {}; keyless signatures without a signed time {}",
                p.identities,
                p.keys,
                p.trusted_root
                    .as_deref()
                    .unwrap_or("Sigstore's public-good root (built in)"),
                if p.without_signed_time {
                    "accepted"
                } else {
                    "refused"
                }
            ),
        ),
    }
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
