//! A scripted containerd for live-transaction tests (see tests/pure/live_txn.rs).
#![allow(dead_code)]

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::Path;

use shim_agent::artifact::node_platform;
use shim_agent::containerd;
use shim_agent::hostroot::HostRoot;
use shim_agent::node::check::{CheckReport, HandlerCheck};
use shim_agent::node::{NodeError, UnitState};
use shim_agent::profile;
use shim_agent::settings::Settings;
use shim_agent::state::Origin;
use shim_agent::txn::{Change, HealthCheck, Node, Restarter};

use super::shim_builder::ShimBuilder;
use super::{Entry, real_elf, sha256_hex, tar_gz};

/// A containerd that serves what its config says, as of its last restart.
#[derive(Default)]
pub struct FakeContainerd {
    pub root: Option<HostRoot>,
    pub serving: RefCell<BTreeSet<String>>,
    pub restarts: RefCell<u32>,
    /// Restart numbers (1-based) that fail.
    pub fail_restarts: Vec<u32>,
    /// Verify calls (1-based) that fail as if CRI were broken.
    pub fail_verifies: Vec<u32>,
    pub verifies: RefCell<u32>,
    /// Verify calls (1-based) that never answer (the agent stops while it checks).
    pub hang_verifies: Vec<u32>,
    /// A verify call is hanging now.
    pub hanging: RefCell<bool>,
    /// How long a restart takes.
    pub restart_delay: std::time::Duration,
    /// Handlers whose runtime check fails (a sandbox the runtime cannot start).
    pub fail_checks: Vec<String>,
    /// The node has no sandbox image and cannot pull one.
    pub no_sandbox_image: bool,
    /// Each `prove` call: the handlers it was asked to prove.
    pub proved: RefCell<Vec<Vec<String>>>,
    /// Prove calls (1-based) that never answer (the agent stops while it checks).
    pub hang_proves: Vec<u32>,
    /// Sweeps of leftover check sandboxes asked for.
    pub sweeps: RefCell<u32>,
    /// What CRI `Version` reports.
    pub version: Option<String>,
}

impl FakeContainerd {
    pub fn reread_config(&self) {
        let root = self.root.as_ref().unwrap();
        let set = containerd::load(root, Path::new("/etc/containerd/config.toml"), None).unwrap();
        let text = String::from_utf8(set.main.bytes.clone()).unwrap();
        let mut serving = BTreeSet::new();
        for h in containerd::inspect(&set).unwrap().handlers {
            serving.insert(h.name);
        }
        // a handler whose runtime_path is missing cannot start its shim
        for line in text.lines() {
            if let Some(p) = named_binary(line) {
                let p = p.trim_end_matches('"');
                if !root.resolve(p).unwrap().exists() {
                    serving.retain(|h| !p.contains(&format!("/{h}/")) && !p.ends_with(h));
                }
            }
        }
        *self.serving.borrow_mut() = serving;
    }
}

/// What systemd reports for a restart job that failed: the unit went down with an exit code.
pub fn restart_failed(unit: &str) -> NodeError {
    NodeError::RestartFailed {
        unit: unit.to_string(),
        job_result: "failed".into(),
        state: Box::new(UnitState {
            active_state: "failed".into(),
            sub_state: "failed".into(),
            result: "exit-code".into(),
            ..UnitState::default()
        }),
    }
}

impl Restarter for &FakeContainerd {
    async fn restart(&self, unit: &str) -> Result<(), NodeError> {
        if !self.restart_delay.is_zero() {
            tokio::time::sleep(self.restart_delay).await;
        }
        *self.restarts.borrow_mut() += 1;
        let n = *self.restarts.borrow();
        if self.fail_restarts.contains(&n) {
            return Err(restart_failed(unit));
        }
        self.reread_config();
        Ok(())
    }
}

impl HealthCheck for &FakeContainerd {
    /// A handler runs a sandbox when containerd serves it and its binary is in place, unless
    /// the script says otherwise.
    async fn prove(
        &self,
        checks: &[HandlerCheck],
    ) -> Result<Vec<CheckReport>, Vec<(String, NodeError)>> {
        self.proved
            .borrow_mut()
            .push(checks.iter().map(|c| c.handler.clone()).collect());
        if self
            .hang_proves
            .contains(&(self.proved.borrow().len() as u32))
        {
            *self.hanging.borrow_mut() = true;
            std::future::pending::<()>().await;
        }
        let serving = self.serving.borrow();
        let failed: Vec<(String, NodeError)> = checks
            .iter()
            .filter(|c| self.fail_checks.contains(&c.handler) || !serving.contains(&c.handler))
            .map(|c| {
                let e = NodeError::SandboxCheckFailed {
                    handler: c.handler.clone(),
                    detail: "failed to create containerd task: failed to start shim: \
                             start failed: unsupported protocol (the test's scripted runtime)"
                        .into(),
                };
                (c.handler.clone(), e)
            })
            .collect();
        if !failed.is_empty() {
            return Err(failed);
        }
        Ok(checks
            .iter()
            .map(|c| CheckReport {
                handler: c.handler.clone(),
                sandbox: std::time::Duration::from_millis(1),
                container: c
                    .container
                    .as_ref()
                    .map(|_| std::time::Duration::from_millis(1)),
                total: std::time::Duration::from_millis(2),
            })
            .collect())
    }

    async fn sweep_checks(&self) -> Result<usize, NodeError> {
        *self.sweeps.borrow_mut() += 1;
        Ok(0)
    }

    async fn sandbox_ready(&self) -> Result<(), NodeError> {
        if self.no_sandbox_image {
            return Err(NodeError::NoSandboxImage {
                image: "registry.k8s.io/pause:3.10".into(),
                detail: "PullImage failed: Unknown: dial tcp: lookup registry.k8s.io: no such host"
                    .into(),
            });
        }
        Ok(())
    }

    async fn runtime_version(&self) -> Option<String> {
        self.version.clone()
    }

    async fn verify(&self, present: &[String], absent: &[String]) -> Result<(), NodeError> {
        *self.verifies.borrow_mut() += 1;
        if self.hang_verifies.contains(&self.verifies.borrow()) {
            *self.hanging.borrow_mut() = true;
            std::future::pending::<()>().await;
        }
        if self.fail_verifies.contains(&self.verifies.borrow()) {
            return Err(NodeError::CriUnavailable {
                socket: "/run/containerd/containerd.sock".into(),
                detail: "CRI RuntimeService is unimplemented: the CRI plugin failed to load".into(),
                plugin_not_loaded: true,
            });
        }
        let s = self.serving.borrow();
        for h in present {
            if !s.contains(h) {
                return Err(NodeError::HandlerMissing {
                    handler: h.clone(),
                    present: s.iter().cloned().collect(),
                });
            }
        }
        let still: Vec<String> = absent.iter().filter(|h| s.contains(*h)).cloned().collect();
        if !still.is_empty() {
            return Err(NodeError::HandlerStillServed { handlers: still });
        }
        Ok(())
    }
}

pub struct World {
    pub _tmp: tempfile::TempDir,
    pub root: HostRoot,
    pub art: std::path::PathBuf,
    pub original: Vec<u8>,
    pub settings: Settings,
}

pub fn world() -> World {
    let tmp = tempfile::tempdir().unwrap();
    let r = tmp.path().join("root");
    std::fs::create_dir_all(r.join("etc/containerd")).unwrap();
    let original = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/containerd-configs/containerd-1.7.34-config-default.toml"),
    )
    .unwrap();
    std::fs::write(r.join("etc/containerd/config.toml"), &original).unwrap();
    let art = tmp.path().join("art");
    std::fs::create_dir_all(&art).unwrap();
    World {
        root: HostRoot::new(&r).unwrap(),
        art,
        original,
        settings: Settings::default(),
        _tmp: tmp,
    }
}

pub fn fake(w: &World) -> FakeContainerd {
    let f = FakeContainerd {
        root: Some(w.root.clone()),
        ..Default::default()
    };
    f.reread_config();
    f
}

pub fn node<'a>(
    w: &'a World,
    f: &'a FakeContainerd,
) -> Node<'a, &'a FakeContainerd, &'a FakeContainerd> {
    Node {
        root: &w.root,
        settings: &w.settings,
        profile: profile::builtin("containerd"),
        platform: node_platform(),
        origin: Origin::Static,
        restarter: f,
        health: f,
    }
}

/// A Shim `name` whose artifact, written fresh into the world's artifact directory, holds
/// `version`.
pub fn shim_builder(w: &World, name: &str, version: &str) -> ShimBuilder {
    let bytes = tar_gz(&[
        Entry::File("containerd-shim-x-v2", real_elf(), 0o755),
        Entry::File("VERSION", version.as_bytes().to_vec(), 0o644),
    ]);
    let p = w.art.join(format!("{name}-{version}.tgz"));
    std::fs::write(&p, &bytes).unwrap();
    ShimBuilder::new(name).artifact(&format!("file://{}", p.display()), &sha256_hex(&bytes))
}

pub fn shim(w: &World, name: &str, version: &str) -> Change {
    Change::Install(Box::new(shim_builder(w, name, version).build()))
}

pub fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

pub fn config(w: &World) -> Vec<u8> {
    std::fs::read(w.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap()
}

pub fn state(w: &World) -> shim_agent::state::NodeState {
    shim_agent::cli::status::read_state(&w.root, &w.settings).unwrap()
}

/// A Shim manifest (YAML) for `kubectl apply`, with a fresh artifact holding `version`, for
/// the nodes labelled `selector` (key, value).
pub fn shim_yaml(w: &World, name: &str, version: &str, selector: (&str, &str)) -> String {
    shim_builder(w, name, version)
        .node_selector(selector.0, selector.1)
        .yaml()
}

/// The binary a config line names for a handler: `runtime_path = "/..."` or an absolute
/// `runtime_type = "/..."` (what the agent writes; in single quotes too, as containerd 2.x's
/// configs have them), without the quotes.
pub fn named_binary(line: &str) -> Option<&str> {
    let l = line.trim();
    let value = |key: &str| {
        let v = l.strip_prefix(key)?.trim_start().strip_prefix('=')?.trim();
        let q = v.chars().next().filter(|c| matches!(c, '"' | '\''))?;
        Some(v[1..].trim_end_matches(q))
    };
    value("runtime_path").or_else(|| value("runtime_type").filter(|p| p.starts_with('/')))
}
