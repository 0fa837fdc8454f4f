//! The doctor's I/O shell: asks the node (or reads the image root) and records [`Facts`].
//! Every probe is bounded in time and read-only: nothing is pulled, started or written.

use std::path::Path;
use std::time::{Duration, SystemTime};

use super::facts::*;
use crate::containerd::images as config_view;
use crate::hostroot::HostRoot;
use crate::node::RuntimeHealth;
use crate::node::cri::CriClient;
use crate::node::systemd::SystemdDbus;
use crate::profile::{self, Form, Profile};
use crate::settings::Settings;

/// How long one CRI call may take.
const CRI_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the API server may take to answer all the doctor's questions.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// The agent's own unit (its proxy settings are the ones its downloads use).
const AGENT_UNIT: &str = "shim-agent.service";

/// Everything the doctor needs, from `root` (the running node when it is the system root).
pub async fn gather(root: &HostRoot, settings: &Settings) -> Facts {
    let live = root.is_system();
    let p = profile::resolve(root, &settings.containerd);
    let config = read_config(root, &p);
    let hosts_dirs = match &config {
        Ok(c) => c
            .registry_config_path
            .as_deref()
            .map(|cp| list_hosts_dirs(root, cp))
            .unwrap_or_default(),
        Err(_) => vec![],
    };
    let target = if live {
        Target::Node {
            name: crate::cluster::connect::node_name(settings)
                .unwrap_or_else(|e| format!("(unknown: {e})")),
        }
    } else {
        Target::Image {
            root: root.path().display().to_string(),
        }
    };
    let mut facts = Facts {
        target,
        profile: ProfileFacts {
            name: p.name.clone(),
            config: p.config.clone(),
            unit: p.unit.clone(),
            socket: p.socket.clone(),
            unsupported: match &p.form {
                Form::Unsupported(why) => Some(why.clone()),
                _ => None,
            },
        },
        version: Err("not asked".into()),
        config,
        hosts_dirs,
        unit: None,
        cri: None,
        sandbox_image: None,
        credentials: None,
        api: None,
        space: space(root, settings),
        proxies: vec![],
        lease_duration_secs: settings.kubernetes.lease_duration_secs,
        signatures: signatures(root, settings),
    };
    if live {
        node_facts(&mut facts, root, settings, &p).await;
    } else {
        facts.version = crate::cli::image::image_containerd_version(root)
            .ok_or_else(|| "`containerd --version` could not be run in the image".to_string());
    }
    facts
}

async fn node_facts(facts: &mut Facts, root: &HostRoot, settings: &Settings, p: &Profile) {
    let systemd = SystemdDbus::connect_system()
        .await
        .map_err(|e| e.to_string());
    facts.unit = Some(match &systemd {
        Ok(s) => s
            .unit_load_state(&p.unit)
            .await
            .map(|[load_state, active_state, sub_state]| UnitFacts {
                load_state,
                active_state,
                sub_state,
            })
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.clone()),
    });
    facts.proxies = vec![
        unit_proxies(root, systemd.as_ref().ok(), AGENT_UNIT).await,
        unit_proxies(root, systemd.as_ref().ok(), &p.unit).await,
    ];
    let socket = root
        .resolve(&p.socket)
        .unwrap_or_else(|_| p.socket.clone().into());
    let cri = CriClient::new(socket);
    let status = cri.status(CRI_TIMEOUT).await.map_err(|e| e.to_string());
    facts.version = match cri.version(CRI_TIMEOUT).await {
        Ok(v) => Ok(crate::text::clip(&v.runtime_version, 64)),
        Err(e) => Err(e.to_string()),
    };
    facts.cri = Some(
        status
            .as_ref()
            .map(|s| CriFacts {
                runtime_ready: s.runtime_ready,
                runtime_detail: s.runtime_detail.clone(),
            })
            .map_err(Clone::clone),
    );
    if status.is_ok() {
        let configured = facts
            .config
            .as_ref()
            .ok()
            .and_then(|c| c.sandbox_image.clone());
        facts.sandbox_image = Some(sandbox_image(&cri, configured, p).await);
    }
    let found = crate::cluster::connect::find(settings);
    facts.api = match &found {
        crate::cluster::connect::Found::Ready(src) => Some(
            tokio::time::timeout(API_TIMEOUT, ask_api_server(src))
                .await
                .unwrap_or_else(|_| Err(format!("no answer in {} s", API_TIMEOUT.as_secs()))),
        ),
        _ => None,
    };
    facts.credentials = Some(match found {
        crate::cluster::connect::Found::Ready(src) => Credentials::Ready(src.to_string()),
        crate::cluster::connect::Found::Waiting(why) => Credentials::Waiting(why),
        crate::cluster::connect::Found::Nothing => Credentials::Nothing,
    });
}

/// The config files the agent edits, read as it reads them.
fn read_config(root: &HostRoot, p: &Profile) -> Probe<ConfigFacts> {
    let current = p.layout().load(root).map_err(|e| e.to_string())?;
    config_view::read_current(&current)
}

fn list_hosts_dirs(root: &HostRoot, config_path: &str) -> Vec<HostsDir> {
    config_view::hosts_dirs(config_path)
        .into_iter()
        .map(|dir| {
            let local = root.resolve(&dir).ok();
            let mut registries: Vec<HostsFile> = local
                .as_deref()
                .and_then(|d| std::fs::read_dir(d).ok())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| {
                    let text = std::fs::read(e.path().join("hosts.toml")).ok()?;
                    let problem = match std::str::from_utf8(&text) {
                        Ok(t) => crate::artifact::registry_hosts::parse(t, &e.path()).err(),
                        Err(_) => Some("not UTF-8".into()),
                    };
                    let registry = crate::text::clip(&e.file_name().to_string_lossy(), 256);
                    Some(HostsFile { registry, problem })
                })
                .collect();
            registries.sort_by(|a, b| a.registry.cmp(&b.registry));
            HostsDir {
                exists: local.is_some_and(|d| d.is_dir()),
                dir,
                registries,
            }
        })
        .collect()
}

/// The sandbox image containerd uses: its CRI status names it (1.x), else the config files,
/// else `containerd config dump` (2.x's default); then whether the image store has it.
async fn sandbox_image(cri: &CriClient, configured: Option<String>, p: &Profile) -> SandboxImage {
    let from_status = cri
        .status_raw(CRI_TIMEOUT)
        .await
        .ok()
        .and_then(|s| crate::node::cri::sandbox_image_from_verbose_info(&s.info));
    let Some(image) = from_status
        .or(configured)
        .or_else(|| dumped_sandbox_image(p))
    else {
        return SandboxImage::Unknown(
            "containerd's status and config name no sandbox image".into(),
        );
    };
    match cri.image_id(&image, CRI_TIMEOUT).await {
        Ok(Some(_)) => SandboxImage::Present(image),
        Ok(None) => SandboxImage::Absent(image),
        Err(e) => SandboxImage::Unknown(format!("cannot ask containerd for {image}: {e}")),
    }
}

/// The sandbox image in `containerd config dump` (the config as containerd merges it).
fn dumped_sandbox_image(p: &Profile) -> Option<String> {
    let out = std::process::Command::new("containerd")
        .args(["--config", &p.config, "config", "dump"])
        .output()
        .ok()?;
    let mut facts = ConfigFacts::default();
    config_view::read_into(
        &mut facts,
        "containerd config dump",
        &String::from_utf8_lossy(&out.stdout),
    )
    .ok()?;
    facts.sandbox_image
}

async fn unit_proxies(root: &HostRoot, systemd: Option<&SystemdDbus>, unit: &str) -> ProxySource {
    let vars = match systemd {
        None => Err("systemd is not reachable".to_string()),
        Some(s) => match s.unit_environment(unit).await {
            Ok((mut env, files)) => {
                for f in files {
                    let text = root
                        .resolve(&f)
                        .ok()
                        .and_then(|l| std::fs::read_to_string(l).ok())
                        .unwrap_or_default();
                    env.extend(env_file_entries(&text));
                }
                Ok(proxy_vars(env.iter().map(String::as_str)))
            }
            Err(e) => Err(e.to_string()),
        },
    };
    ProxySource {
        source: unit.to_string(),
        vars,
    }
}

/// `NAME=value` lines of an `EnvironmentFile=` (comments skipped, quotes removed).
fn env_file_entries(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            format!(
                "{}={}",
                k.trim(),
                v.trim().trim_matches('"').trim_matches('\'')
            )
        })
        .collect()
}

async fn ask_api_server(src: &crate::cluster::connect::Source) -> Probe<ApiFacts> {
    use http_body_util::BodyExt;
    let client = crate::cluster::connect::client(src)
        .await
        .map_err(|e| format!("{e:#}"))?;
    let req = http::Request::get("/version")
        .body(kube::client::Body::empty())
        .map_err(|e| e.to_string())?;
    let sent = SystemTime::now();
    let resp = client.send(req).await.map_err(|e| e.to_string())?;
    let received = SystemTime::now();
    let date = resp
        .headers()
        .get(http::header::DATE)
        .and_then(|v| v.to_str().ok())
        .and_then(|d| httpdate::parse_http_date(d).ok());
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    if !status.is_success() {
        return Err(format!("GET /version: HTTP {status}"));
    }
    let server_version = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| {
            v.get("gitVersion")
                .and_then(|g| g.as_str())
                .map(|g| crate::text::clip(g, 64))
        })
        .unwrap_or_else(|| "(no gitVersion)".into());
    let midpoint = sent + received.duration_since(sent).unwrap_or_default() / 2;
    Ok(ApiFacts {
        server_version,
        identity: who_am_i(client).await,
        skew_secs: date.map(|d| skew_secs(d, midpoint)),
    })
}

/// The server's clock minus ours: its `Date` has whole seconds, so it stands for the middle
/// of its second.
fn skew_secs(server: SystemTime, local: SystemTime) -> f64 {
    let server = server + Duration::from_millis(500);
    match server.duration_since(local) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

async fn who_am_i(client: kube::Client) -> Probe<Identity> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client);
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
    let info = review
        .status
        .and_then(|s| s.user_info)
        .ok_or("an empty SelfSubjectReview")?;
    Ok(Identity {
        username: crate::text::clip(info.username.as_deref().unwrap_or(""), 256),
        groups: info
            .groups
            .unwrap_or_default()
            .iter()
            .map(|g| crate::text::clip(g, 256))
            .collect(),
    })
}

fn space(root: &HostRoot, settings: &Settings) -> Vec<SpaceFacts> {
    [
        ("state", settings.paths.state_dir.as_str()),
        ("install", crate::artifact::SHIMS_DIR),
    ]
    .into_iter()
    .map(|(what, path)| SpaceFacts {
        what,
        path: path.to_string(),
        free: root
            .resolve(path)
            .map_err(|e| e.to_string())
            .and_then(|local| free_bytes(&local)),
    })
    .collect()
}

/// Bytes available under `path`, or under its nearest existing parent (the directory may not
/// exist before the first install).
fn free_bytes(path: &Path) -> Probe<u64> {
    let existing = path
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let s = nix::sys::statvfs::statvfs(existing)
        .map_err(|e| format!("statvfs {}: {e}", existing.display()))?;
    Ok(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// The node's signature policy, loaded as an install loads it (its key files and root read).
fn signatures(root: &HostRoot, settings: &Settings) -> Probe<SignatureFacts> {
    let s = &settings.signatures;
    crate::artifact::signed::NodeSignatures::load(s, root)
        .map(|n| SignatureFacts {
            require: n.require,
            identities: n.trust.identities.len(),
            keys: n.trust.keys.len(),
            trusted_root: (!s.trusted_root.is_empty()).then(|| s.trusted_root.clone()),
            without_signed_time: n.allow_without_signed_time,
        })
        .map_err(|e| crate::text::clip(&e.to_string(), 512))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_files_give_their_assignments() {
        let text = "# proxy\nHTTPS_PROXY=\"http://u:p@proxy:3128\"\n\n; old\nNO_PROXY='.svc'\nnot an assignment\n";
        assert_eq!(
            env_file_entries(text),
            vec!["HTTPS_PROXY=http://u:p@proxy:3128", "NO_PROXY=.svc"]
        );
    }

    #[test]
    fn skew_is_the_servers_clock_minus_ours() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert!((skew_secs(t, t) - 0.5).abs() < 1e-9);
        assert!((skew_secs(t, t + Duration::from_secs(10)) + 9.5).abs() < 1e-9);
    }
}
