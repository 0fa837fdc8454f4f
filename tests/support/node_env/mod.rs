//! Harness for tests against the real systemd and containerd of the node env
//! (`.ci/node-env/`: a Debian bookworm rootfs booted with systemd-nspawn), with Debian's
//! containerd 1.6.20 (config version 2) or an upstream 2.x build (`INFRA_CONTAINERD`: version 3
//! for 2.2, 4 for 2.3, importing `/etc/containerd/conf.d/*.toml`, where the agent puts its
//! drop-ins).
//!
//! # Finding the env
//! `INFRA_ROOT`, `DBUS_SYSTEM_BUS_ADDRESS` and `CONTAINERD_ADDRESS` from the environment when
//! `INFRA_ROOT` is set, else the env file `boot.sh` writes
//! (`/var/tmp/node-env/run/infractd/env`). Without a reachable env a test is **skipped** with
//! a printed reason, unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI sets it): then it fails.
//!
//! # Guarantees
//! - Node tests run one at a time: [`NodeEnv`] holds an exclusive file lock in the env's run
//!   directory for the whole test, across test binaries too.
//! - Every test starts from the same node: the node's `config.toml` restored from
//!   `config.toml.dist`, `/etc/containerd/conf.d/` emptied (the pristine node has nothing
//!   there), test drop-ins removed, the base drop-in (no start limit) installed, `Reload`,
//!   `ResetFailedUnit`, a restart that must be `done`, and CRI serving `runc`.
//! - CRI is answered by the containerd the env file names (`INFRA_CONTAINERD_VERSION`, when
//!   set): a test never runs against another containerd than the one its run says.
//!
//! # Caveats
//! A test's own drop-ins and config stay in place after it until the next test's reset;
//! `boot.sh` starts every run from a fresh copy of the base rootfs.

#![allow(dead_code)] // each test binary uses its own part of the harness

pub mod agent;

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use shim_agent::hostroot::HostRoot;
use shim_agent::node::{CriClient, RuntimeHealth, ServiceManager, SystemdDbus};

/// The unit the node env runs containerd as.
pub const UNIT: &str = "containerd.service";
/// Restart timeout used by the tests (the agent's default is 90 s).
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(30);
/// How long CRI may take to serve a handler after a restart.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(10);
/// Where `boot.sh` writes the env file.
pub const ENV_FILE: &str = "/var/tmp/node-env/run/infractd/env";
/// containerd's drop-in directory for unit files, relative to the root.
const DROPIN_DIR: &str = "etc/systemd/system/containerd.service.d";
/// Where containerd 2.x's default config imports drop-ins from, relative to the root.
pub const CONF_D: &str = "etc/containerd/conf.d";
/// Every drop-in a test writes has this in its name; reset removes them all.
const TEST_DROPIN_MARK: &str = "shim-agent-test";
/// The drop-in every test starts with: tests restart often, and systemd's default limit
/// (5 starts in 10 s) would make a later test fail with `start-limit-hit`.
const BASE_DROPIN: (&str, &str) = (
    "50-shim-agent-test-base.conf",
    "[Unit]\nStartLimitIntervalSec=0\n",
);

/// A locked, freshly reset node env.
pub struct NodeEnv {
    /// The container's root directory on the host (`$INFRA_ROOT`).
    pub root: PathBuf,
    /// The container's system bus.
    pub systemd: SystemdDbus,
    /// containerd's CRI.
    pub cri: CriClient,
    /// The container's system bus address (for agent processes a test starts).
    pub bus: String,
    /// The containerd CRI answers with.
    pub containerd: Containerd,
    /// The machine name (`INFRA_MACHINE`) `exec.sh` runs commands in.
    machine: Option<String>,
    _lock: File,
}

/// Which containerd the node runs, and the config layout that goes with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Containerd {
    /// As CRI `Version` reports it: `1.6.20~ds1` (Debian), `v2.3.4` (upstream).
    pub version: String,
    /// Major and minor version.
    pub major_minor: (u32, u32),
    /// `version` of the pristine `config.toml` (2 for 1.x, 3 or 4 for 2.x).
    pub config_version: i64,
}

impl Containerd {
    /// containerd 2.x or later (handlers in `RuntimeHandlers`, a CRI runtime plugin of its own).
    pub fn is_2x(&self) -> bool {
        self.major_minor.0 >= 2
    }

    /// The plugin whose config holds the CRI runtime settings (`containerd.runtimes`,
    /// `restrict_oom_score_adj`, ...): version 2 `io.containerd.grpc.v1.cri`, version 3 and
    /// later `io.containerd.cri.v1.runtime`.
    pub fn cri_runtime_plugin(&self) -> &'static str {
        if self.config_version >= 3 {
            "io.containerd.cri.v1.runtime"
        } else {
            "io.containerd.grpc.v1.cri"
        }
    }

    /// The header of [`Containerd::cri_runtime_plugin`]'s table, quoted as this node's config
    /// quotes it: `plugins."io.containerd.grpc.v1.cri"`, `plugins.'io.containerd.cri.v1.runtime'`.
    pub fn cri_runtime_table(&self) -> String {
        let q = if self.config_version >= 3 { '\'' } else { '"' };
        format!("plugins.{q}{}{q}", self.cri_runtime_plugin())
    }
}

/// `1.6.20~ds1` or `v2.3.4` → (1, 6), (2, 3).
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim_start_matches('v').split(['.', '~', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The top-level `version` of a containerd config (1 when absent, as containerd reads it).
fn config_version(text: &str) -> i64 {
    let doc: toml_edit::DocumentMut = text
        .parse()
        .expect("the pristine containerd config is TOML");
    doc.get("version")
        .and_then(toml_edit::Item::as_integer)
        .unwrap_or(1)
}

struct Found {
    root: PathBuf,
    bus: String,
    socket: PathBuf,
    run_dir: PathBuf,
    /// `INFRA_CONTAINERD_VERSION` (env files of older `boot.sh` runs lack it).
    containerd_version: Option<String>,
    /// `INFRA_MACHINE`, for `exec.sh`.
    machine: Option<String>,
}

fn parse_env_file(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("export "))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn find_env(env_file: Option<&Path>) -> Result<Found, String> {
    let vars: HashMap<String, String> = match env_file {
        Some(f) => parse_env_file(
            &std::fs::read_to_string(f)
                .map_err(|e| format!("no node env: {} cannot be read ({e})", f.display()))?,
        ),
        None if std::env::var_os("INFRA_ROOT").is_some() => std::env::vars().collect(),
        None => {
            let text = std::fs::read_to_string(ENV_FILE).map_err(|e| {
                format!(
                    "no node env: INFRA_ROOT is not set and {ENV_FILE} cannot be read ({e}); \
                     start one with `.ci/node-env/make-rootfs.sh && .ci/node-env/boot.sh` (root)"
                )
            })?;
            parse_env_file(&text)
        }
    };
    let get = |k: &str| {
        vars.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or_else(|| format!("node env: {k} is not set"))
    };
    let found = Found {
        root: PathBuf::from(get("INFRA_ROOT")?),
        bus: get("DBUS_SYSTEM_BUS_ADDRESS")?,
        socket: PathBuf::from(get("CONTAINERD_ADDRESS")?),
        run_dir: vars
            .get("INFRA_RUN")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir),
        containerd_version: vars
            .get("INFRA_CONTAINERD_VERSION")
            .filter(|v| !v.is_empty())
            .cloned(),
        machine: vars.get("INFRA_MACHINE").filter(|v| !v.is_empty()).cloned(),
    };
    if !found.root.join("etc/containerd/config.toml.dist").is_file() {
        return Err(format!(
            "node env: {} has no etc/containerd/config.toml.dist",
            found.root.display()
        ));
    }
    Ok(found)
}

fn skip_or_fail(test: &str, reason: &str) -> Option<NodeEnv> {
    skip(test, reason);
    None
}

/// Report why `test` cannot run on this node env: a panic when the node env is required
/// (`SHIM_AGENT_REQUIRE_NODE_ENV=1`), else a printed `SKIPPED` line (the caller returns).
pub fn skip(test: &str, reason: &str) {
    super::skip(test, "SHIM_AGENT_REQUIRE_NODE_ENV", reason);
}

/// The node env for `test`, locked and reset; `None` (after printing why) when there is none
/// and it is not required.
pub async fn node_env(test: &str) -> Option<NodeEnv> {
    node_env_at(test, None).await
}

/// [`node_env`] of the env `boot.sh` described in `env_file` (for a run against several).
pub async fn node_env_at(test: &str, env_file: Option<&Path>) -> Option<NodeEnv> {
    let found = match find_env(env_file) {
        Ok(f) => f,
        Err(reason) => return skip_or_fail(test, &reason),
    };
    // From the process environment (CI): through `Connection::system()`, which must honour
    // DBUS_SYSTEM_BUS_ADDRESS as the agent relies on; from the env file: by address.
    let connected = if std::env::var("DBUS_SYSTEM_BUS_ADDRESS").as_deref() == Ok(&found.bus) {
        SystemdDbus::connect_system().await
    } else {
        SystemdDbus::connect_address(&found.bus).await
    };
    let systemd = match connected {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("node env: cannot reach its system bus: {}", chain(&e));
            return skip_or_fail(test, &reason);
        }
    };
    let lock_path = found.run_dir.join("shim-agent-node-tests.lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    let dist = std::fs::read_to_string(found.root.join("etc/containerd/config.toml.dist"))
        .expect("read config.toml.dist");
    let mut env = NodeEnv {
        root: found.root,
        systemd,
        cri: CriClient::new(found.socket),
        bus: found.bus,
        containerd: Containerd {
            version: String::new(),
            major_minor: (0, 0),
            config_version: config_version(&dist),
        },
        machine: found.machine,
        _lock: lock,
    };
    env.fit_the_machine();
    env.reset().await;
    let v = env
        .cri
        .version(VERIFY_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("CRI Version: {}", chain(&e)));
    if let Some(expected) = &found.containerd_version {
        assert_eq!(
            &v.runtime_version, expected,
            "CRI is answered by another containerd than INFRA_CONTAINERD_VERSION says"
        );
    }
    env.containerd.major_minor = major_minor(&v.runtime_version)
        .unwrap_or_else(|| panic!("containerd version {:?}", v.runtime_version));
    env.containerd.version = v.runtime_version;
    env.ensure_images();
    eprintln!(
        "{test}: containerd {}, config version {}",
        env.containerd.version, env.containerd.config_version
    );
    Some(env)
}

/// An error and its sources on one line.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s = format!("{s}: {c}");
        cur = c.source();
    }
    s
}

impl NodeEnv {
    /// The agent's transaction engine against this node: its root, its systemd, its CRI, as
    /// `--root DIR --live` runs (origin `cli`, the default containerd profile).
    pub fn node<'a>(
        &self,
        root: &'a HostRoot,
        settings: &'a shim_agent::settings::Settings,
    ) -> shim_agent::txn::Node<
        'a,
        shim_agent::txn::real::SystemdRestarter,
        shim_agent::txn::real::CriHealth,
    > {
        shim_agent::txn::Node {
            root,
            settings,
            profile: shim_agent::profile::builtin("containerd"),
            platform: shim_agent::artifact::node_platform(),
            origin: shim_agent::state::Origin::Cli,
            restarter: shim_agent::txn::real::SystemdRestarter {
                systemd: self.systemd.clone(),
                timeout: RESTART_TIMEOUT,
            },
            health: shim_agent::txn::real::CriHealth {
                cri: self.cri.clone(),
                timeout: VERIFY_TIMEOUT,
                check: shim_agent::txn::real::check_place(root, settings)
                    .expect("the check's directory under the node's root"),
            },
        }
    }

    /// The host root of the container, for the config engine.
    pub fn host_root(&self) -> HostRoot {
        HostRoot::new(&self.root).expect("INFRA_ROOT is a directory")
    }

    /// containerd's config file, seen from the host.
    pub fn config_file(&self) -> PathBuf {
        self.root.join("etc/containerd/config.toml")
    }

    fn dropin_dir(&self) -> PathBuf {
        self.root.join(DROPIN_DIR)
    }

    /// containerd's config as the node has it: `config.toml` and every file in
    /// `/etc/containerd/conf.d/` (where the agent writes its drop-ins on 2.x), by path relative
    /// to the root. Equal snapshots: the same config, byte for byte.
    pub fn config_files(&self) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut files = BTreeMap::new();
        let main = PathBuf::from("etc/containerd/config.toml");
        files.insert(
            main.clone(),
            std::fs::read(self.root.join(&main)).expect("read config.toml"),
        );
        if let Ok(entries) = std::fs::read_dir(self.root.join(CONF_D)) {
            for e in entries.flatten() {
                let rel = Path::new(CONF_D).join(e.file_name());
                files.insert(rel, std::fs::read(e.path()).expect("read a conf.d file"));
            }
        }
        files
    }

    /// All of [`NodeEnv::config_files`] as one text (for searching it).
    pub fn config_text(&self) -> String {
        self.config_files()
            .values()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Put the pristine config back: `config.toml` from `config.toml.dist`, `conf.d/` empty.
    pub fn restore_config(&self) {
        std::fs::copy(
            self.root.join("etc/containerd/config.toml.dist"),
            self.config_file(),
        )
        .expect("restore config.toml from config.toml.dist");
        if let Ok(entries) = std::fs::read_dir(self.root.join(CONF_D)) {
            for e in entries.flatten() {
                std::fs::remove_file(e.path()).expect("remove a conf.d file");
            }
        }
    }

    /// What a real node has and this machine withholds, set once per boot in the pristine
    /// config (`config.toml.dist`, which every test starts from), each the way containerd
    /// documents it; without them no pod sandbox starts here, and every install's sandbox
    /// check would fail for the machine's sake:
    /// - CAP_SYS_RESOURCE is withheld, so runc cannot give a sandbox the negative
    ///   `oom_score_adj` containerd asks for: `restrict_oom_score_adj` clamps it;
    /// - a node on cgroup v2 under a host that keeps its controllers on v1 has no `cpu`
    ///   controller, and runc fails on the sandbox's cpu weight: containerd 1.x's
    ///   `disable_cgroup` leaves the sandbox's resources unset (containerd 2.x has no such
    ///   setting: its node must boot with INFRA_CGROUP=hybrid on such a host).
    pub fn fit_the_machine(&self) {
        let dist = self.root.join("etc/containerd/config.toml.dist");
        let text = std::fs::read_to_string(&dist).expect("read config.toml.dist");
        let mut settings = vec!["restrict_oom_score_adj"];
        let cpu = self.exec(&[
            "sh",
            "-c",
            "test -d /sys/fs/cgroup/cpu || grep -qw cpu /sys/fs/cgroup/cgroup.controllers",
        ]);
        if !cpu.status.success() && !self.containerd_is_2x_by_config(&text) {
            settings.push("disable_cgroup");
        }
        let mut doc: toml_edit::DocumentMut = text.parse().expect("config.toml.dist is TOML");
        let plugin = if self.containerd_is_2x_by_config(&text) {
            "io.containerd.cri.v1.runtime"
        } else {
            "io.containerd.grpc.v1.cri"
        };
        let table = doc["plugins"][plugin]
            .as_table_like_mut()
            .unwrap_or_else(|| panic!("no [plugins.{plugin:?}] table in:\n{text}"));
        for key in &settings {
            table.insert(key, toml_edit::value(true));
        }
        let fitted = doc.to_string();
        if fitted != text {
            std::fs::write(&dist, fitted).expect("write config.toml.dist");
        }
    }

    /// Whether a pristine config is a containerd 2.x one (version 3 or later).
    fn containerd_is_2x_by_config(&self, text: &str) -> bool {
        config_version(text) >= 3
    }

    /// The images every pod sandbox and check needs, imported once per boot (the node has no
    /// registry): the sandbox image containerd names (1.x `sandbox_image`, 2.x
    /// `pinned_images.sandbox`), from the kube env's minimal `pause` (or, without the kube env,
    /// a sandbox of the node's static busybox that only sleeps), and [`CHECK_IMAGE`], the
    /// node's busybox, for check containers.
    pub fn ensure_images(&self) {
        let refs = self.image_refs();
        let name = self.sandbox_image();
        if !refs.contains(&name) {
            let tar = match pause_binary() {
                Some(pause) => {
                    let bytes = std::fs::read(&pause).expect("read the pause binary");
                    oci_image(&name, &[("/pause", &bytes, 0o755)], &["/pause"])
                }
                None => {
                    let bb = std::fs::read(self.root.join("bin/busybox")).expect("busybox");
                    oci_image(
                        &name,
                        &[("/busybox", &bb, 0o755)],
                        &["/busybox", "sleep", "infinity"],
                    )
                }
            };
            self.import_image(&tar);
        }
        if !refs.contains(&CHECK_IMAGE.to_string()) {
            let bb = std::fs::read(self.root.join("bin/busybox")).expect("busybox");
            self.import_image(&oci_image(
                CHECK_IMAGE,
                &[("/bin/busybox", &bb, 0o755)],
                &["/bin/busybox"],
            ));
        }
    }

    /// The sandbox image containerd's config names.
    pub fn sandbox_image(&self) -> String {
        let dump = self.exec_ok(&["containerd", "config", "dump"]);
        let key = if self.containerd.is_2x() {
            "sandbox"
        } else {
            "sandbox_image"
        };
        dump.lines()
            .find_map(|l| {
                let v = l.trim().strip_prefix(key)?.trim_start();
                Some(
                    v.strip_prefix('=')?
                        .trim()
                        .trim_matches(['"', '\''])
                        .to_string(),
                )
            })
            .unwrap_or_else(|| panic!("{key} in `containerd config dump`"))
    }

    /// The check sandboxes containerd's CRI lists now.
    pub async fn check_sandboxes(&self) -> Vec<String> {
        self.labelled_sandboxes(shim_agent::node::check::CHECK_LABEL, "true")
            .await
    }

    /// The check sandboxes of `handler` containerd's CRI lists now.
    pub async fn check_sandboxes_of(&self, handler: &str) -> Vec<String> {
        self.labelled_sandboxes(shim_agent::node::check::CHECK_HANDLER_LABEL, handler)
            .await
    }

    async fn labelled_sandboxes(&self, key: &str, value: &str) -> Vec<String> {
        let labels = HashMap::from([(key.to_string(), value.to_string())]);
        // asked again while containerd restarts (its socket comes and goes)
        let deadline = std::time::Instant::now() + RESTART_TIMEOUT;
        loop {
            match self
                .cri
                .list_labelled_sandboxes(labels.clone(), VERIFY_TIMEOUT)
                .await
            {
                Ok(found) => return found.into_iter().map(|s| s.id).collect(),
                Err(e) if std::time::Instant::now() >= deadline => {
                    panic!("ListPodSandbox: {e}")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Back to the node every test starts from (see the module's Guarantees).
    pub async fn reset(&self) {
        self.restore_config();
        self.remove_dropins();
        self.write_dropin_file(BASE_DROPIN.0, BASE_DROPIN.1);
        self.systemd.reload().await.expect("Manager.Reload");
        self.systemd
            .reset_failed(UNIT)
            .await
            .expect("ResetFailedUnit");
        let out = self
            .systemd
            .restart_unit(UNIT, RESTART_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("reset: {}", chain(&e)));
        assert_eq!(out.state.active_state, "active", "reset: {out:?}");
        self.cri
            .wait_for_handler("runc", VERIFY_TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("reset: CRI does not serve runc: {}", chain(&e)));
        // a check sandbox an earlier test left (it failed there) is not this test's
        shim_agent::node::check::sweep(&self.cri)
            .await
            .unwrap_or_else(|e| panic!("reset: sweeping check sandboxes: {}", chain(&e)));
    }

    fn remove_dropins(&self) {
        let Ok(entries) = std::fs::read_dir(self.dropin_dir()) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().contains(TEST_DROPIN_MARK) {
                std::fs::remove_file(e.path()).expect("remove a test drop-in");
            }
        }
    }

    fn write_dropin_file(&self, file: &str, text: &str) {
        std::fs::create_dir_all(self.dropin_dir()).expect("create the drop-in dir");
        std::fs::write(self.dropin_dir().join(file), text).expect("write a drop-in");
    }

    /// Install a test drop-in for containerd.service (`60-shim-agent-test-<name>.conf`,
    /// after the base one) and `Reload`.
    pub async fn add_unit_dropin(&self, name: &str, text: &str) {
        self.write_dropin_file(&format!("60-{TEST_DROPIN_MARK}-{name}.conf"), text);
        self.systemd.reload().await.expect("Manager.Reload");
    }

    /// Remove a drop-in added with [`NodeEnv::add_unit_dropin`] and `Reload`.
    pub async fn remove_unit_dropin(&self, name: &str) {
        let p = self
            .dropin_dir()
            .join(format!("60-{TEST_DROPIN_MARK}-{name}.conf"));
        std::fs::remove_file(&p).expect("remove a test drop-in");
        self.systemd.reload().await.expect("Manager.Reload");
    }

    /// containerd's current `InvocationID`: it changes with every start, so comparing two
    /// readings tells whether containerd was restarted in between (`NRestarts` counts only
    /// automatic restarts).
    pub async fn invocation_id(&self) -> String {
        self.systemd
            .unit_state(UNIT)
            .await
            .expect("unit state")
            .invocation_id
    }

    /// Run a command inside the container (`.ci/node-env/exec.sh`).
    pub fn exec(&self, args: &[&str]) -> Output {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/node-env/exec.sh");
        let mut cmd = std::process::Command::new(script);
        if let Some(m) = &self.machine {
            cmd.env("INFRA_MACHINE", m);
        }
        cmd.args(args).output().expect("run .ci/node-env/exec.sh")
    }

    /// [`NodeEnv::exec`] that must succeed: its stdout.
    pub fn exec_ok(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "in the node: {args:?}: {:?}\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether the container shares the host's network namespace (`boot.sh` with
    /// `INFRA_NETWORK=host`), so that a process inside reaches servers on the host's loopback.
    pub fn shares_host_network(&self) -> bool {
        let Ok(host) = std::fs::read_link("/proc/self/ns/net") else {
            return false;
        };
        let out = self.exec(&["readlink", "/proc/self/ns/net"]);
        out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == host.as_os_str()
    }

    /// Import an image (an OCI image layout tar, see [`oci_image`]) into containerd's `k8s.io`
    /// namespace, where CRI finds it: the node has no registry to pull from.
    pub fn import_image(&self, tar: &[u8]) {
        let inside = "/var/tmp/shim-agent-test-image.tar";
        let on_host = self.root.join(inside.trim_start_matches('/'));
        std::fs::write(&on_host, tar).expect("write the image tar into the node");
        let out = self.exec(&["ctr", "-n", "k8s.io", "images", "import", inside]);
        let _ = std::fs::remove_file(&on_host);
        assert!(
            out.status.success(),
            "ctr images import: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The image references in containerd's `k8s.io` namespace (CRI adds its own, by digest,
    /// beside an imported name).
    pub fn image_refs(&self) -> Vec<String> {
        let out = self.exec(&["ctr", "-n", "k8s.io", "images", "ls", "-q"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Remove image references from containerd's `k8s.io` namespace (absent ones are fine).
    pub fn remove_images(&self, refs: &[String]) {
        if refs.is_empty() {
            return;
        }
        let mut args = vec!["ctr", "-n", "k8s.io", "images", "rm"];
        args.extend(refs.iter().map(String::as_str));
        let _ = self.exec(&args);
    }
}

/// A busybox image (the node's static busybox) for check containers: `/bin/busybox`, run as
/// `["/bin/busybox", "sh", "-c", "..."]`.
pub const CHECK_IMAGE: &str = "localhost/shim-agent-check:v1";

/// The kube env's minimal `pause` (its `assets.sh` unpacks it), when the kube env is here.
pub fn pause_binary() -> Option<PathBuf> {
    let dir = std::env::var_os("KUBE_ENV_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/kube-env");
            shared.is_dir().then_some(shared)
        })?;
    let out = std::process::Command::new(dir.join("assets.sh"))
        .output()
        .ok()?;
    let assets = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let pause = assets.join("pause");
    (out.status.success() && pause.is_file()).then_some(pause)
}

/// A single-layer OCI image layout tar (what `ctr images import` reads) named `name`
/// (annotation `io.containerd.image.name`), holding `files` (path in the image, bytes, mode),
/// with this entrypoint, for the node's platform. The approach of the kube env's `images.py`.
pub fn oci_image(name: &str, files: &[(&str, &[u8], u32)], entrypoint: &[&str]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    fn entry(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32) {
        let mut h = tar::Header::new_ustar();
        h.set_path(path).expect("tar path");
        h.set_entry_type(if path.ends_with('/') {
            tar::EntryType::Directory
        } else {
            tar::EntryType::Regular
        });
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_cksum();
        b.append(&h, data).expect("tar entry");
    }
    let digest = |data: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(data)));

    let mut layer = tar::Builder::new(Vec::new());
    for (path, data, mode) in files {
        let path = path.trim_start_matches('/');
        if let Some((dir, _)) = path.rsplit_once('/') {
            entry(&mut layer, &format!("{dir}/"), &[], 0o755);
        }
        entry(&mut layer, path, data, *mode);
    }
    let layer = layer.into_inner().expect("layer tar");
    let platform = shim_agent::artifact::node_platform();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": platform.arch, "os": platform.os,
        "config": {"Entrypoint": entrypoint, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [digest(&layer)]},
    }))
    .expect("config json");
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": digest(&layer), "size": layer.len()}],
    }))
    .expect("manifest json");
    let last = name.rsplit('/').next().unwrap_or(name);
    let tag = last.split_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": digest(&manifest), "size": manifest.len(),
                       "platform": {"architecture": platform.arch, "os": platform.os},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": tag}}],
    }))
    .expect("index json");

    let mut out = tar::Builder::new(Vec::new());
    entry(&mut out, "blobs/", &[], 0o755);
    entry(&mut out, "blobs/sha256/", &[], 0o755);
    for blob in [&layer, &config, &manifest] {
        let hex = digest(blob).trim_start_matches("sha256:").to_string();
        entry(&mut out, &format!("blobs/sha256/{hex}"), blob, 0o644);
    }
    entry(
        &mut out,
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        0o644,
    );
    entry(&mut out, "index.json", &index, 0o644);
    out.into_inner().expect("image tar")
}
