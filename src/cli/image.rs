//! `install --root DIR` and `uninstall --root DIR`: a Shim in an image root, for image
//! builders (docs/design.md §8).
//!
//! An image root is a node whose containerd does not run: the transaction engine
//! ([`txn`](crate::txn)) runs with the image ports — the restart does nothing and the shim is
//! recorded `pending-verification`, for the agent to verify, label and adopt on first boot.
//!
//! On top of the engine's own guarantees this adapter promises the image builder that a
//! failure leaves the root **exactly** as it was: the state directory, its lock file and its
//! document are put back byte for byte (or removed when this run created them).

use anyhow::{Context, bail};

use crate::api::Shim;
use crate::artifact::Platform;
use crate::hostroot::HostRoot;
use crate::profile;
use crate::settings::Settings;
use crate::state::{LOCK_FILE, NodeState, Origin, STATE_FILE, StateStore};
use crate::txn::files::Undo;
use crate::txn::record::sha256_hex;
use crate::txn::{
    Change, DeferredVerification, NoRestart, Node, Work, classify, handler_in_use_message,
    handler_owner,
};

/// What an install did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallOutcome {
    /// Installed (or upgraded) now.
    Installed {
        binary: String,
        config_files: Vec<String>,
        upgraded: bool,
    },
    /// The same Shim was already installed; nothing changed.
    Unchanged,
}

/// Options of an offline install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Platform of the image (default: this machine's).
    pub platform: Platform,
    /// The containerd version the image runs, which picks a Shim's build per containerd
    /// release (`--containerd-version`; default: [`image_containerd_version`]).
    pub containerd_version: Option<String>,
    /// Show a progress bar.
    pub progress: bool,
}

/// The version of the containerd an image runs, asked of it (`containerd --version` run inside
/// the image with `chroot`, so it loads the image's own libraries): `None` when that cannot be
/// done here (not root, no containerd in the image, another architecture).
pub fn image_containerd_version(root: &HostRoot) -> Option<String> {
    let found = ["/usr/bin/containerd", "/usr/local/bin/containerd"]
        .into_iter()
        .find(|p| root.resolve(p).is_ok_and(|l| l.is_file()))?;
    let out = if root.is_system() {
        std::process::Command::new(found).arg("--version").output()
    } else {
        std::process::Command::new("chroot")
            .arg(root.path())
            .args([found, "--version"])
            .output()
    }
    .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_containerd_version(&String::from_utf8_lossy(&out.stdout))
}

/// The version in `containerd --version`'s answer (pure): its third word
/// (`containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1`,
/// `containerd github.com/containerd/containerd/v2 v2.3.4 1a2b3c`).
pub fn parse_containerd_version(text: &str) -> Option<String> {
    let line = text.lines().next()?;
    let mut words = line.split_whitespace();
    (words.next() == Some("containerd"))
        .then(|| words.nth(1))
        .flatten()
        .map(|v| crate::text::clip(v, 64))
}

/// What an uninstall did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UninstallOutcome {
    /// Config files whose bytes are back to what they were before the install.
    pub restored: Vec<String>,
    /// Config files changed by someone else since the install: only the handler was removed.
    pub changed_since: Vec<String>,
}

fn image_node<'a>(
    root: &'a HostRoot,
    settings: &'a Settings,
    platform: Platform,
    containerd_version: Option<String>,
) -> Node<'a, NoRestart, DeferredVerification> {
    Node {
        root,
        settings,
        profile: profile::resolve(root, &settings.containerd),
        platform,
        origin: Origin::Offline,
        restarter: NoRestart,
        health: DeferredVerification { containerd_version },
    }
}

/// Run `f` on the image's engine; on failure put the state directory back exactly as it was
/// (unless a journal is left open for the next run to recover).
async fn exactly<T>(
    root: &HostRoot,
    settings: &Settings,
    (platform, containerd_version): (Platform, Option<String>),
    f: impl AsyncFnOnce(
        &Node<'_, NoRestart, DeferredVerification>,
        &StateStore,
        &mut NodeState,
    ) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let state_dir = root.resolve(&settings.paths.state_dir)?;
    let mut undo = Undo::default();
    undo.create_dir_all(&state_dir)?;
    undo.save_file(&state_dir.join(LOCK_FILE))?;
    undo.save_file(&state_dir.join(STATE_FILE))?;
    let node = image_node(root, settings, platform, containerd_version);
    let (result, left_open) = match node.open().await {
        Ok((store, mut state)) => {
            let r = f(&node, &store, &mut state).await;
            (r, state.journal.is_some())
        }
        Err(e) => (Err(e), true),
    };
    if result.is_err() && !left_open {
        undo.run();
    }
    result
}

/// Install `shim` into the image at `root`.
pub async fn install_offline(
    root: &HostRoot,
    settings: &Settings,
    shim: &Shim,
    opts: &InstallOptions,
) -> anyhow::Result<InstallOutcome> {
    let name = shim.name().to_string();
    let change = vec![Change::Install(Box::new(shim.clone()))];
    exactly(
        root,
        settings,
        (opts.platform.clone(), opts.containerd_version.clone()),
        async |node, store, state| {
            let upgraded = state.shims.contains_key(&name);
            let report = node
                .apply_showing(store, state, change, opts.progress)
                .await?;
            if report.installed.is_empty() {
                return Ok(InstallOutcome::Unchanged);
            }
            let rec = state
                .shims
                .get(&name)
                .with_context(|| format!("Shim {name:?} is not recorded after its install"))?;
            Ok(InstallOutcome::Installed {
                binary: rec.binary.clone(),
                config_files: rec.config_files.iter().map(|c| c.path.clone()).collect(),
                upgraded,
            })
        },
    )
    .await
}

/// What `install --root DIR --dry-run` finds: what an install of these Shims would do to the
/// image, decided as the install decides it ([`classify`]: the state's record, its binary and
/// its handler), without fetching, locking or writing anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallPlan {
    /// Each Shim's name and what its install would do.
    pub shims: Vec<(String, Work)>,
    /// An unfinished transaction the install would roll back first (its id).
    pub recovers: Option<String>,
}

/// Plan an offline install of `shims` into the image at `root` (nothing is written). A Shim
/// whose handler another installed Shim holds fails here as the install would.
pub fn plan_offline(
    root: &HostRoot,
    settings: &Settings,
    shims: &[Shim],
) -> anyhow::Result<InstallPlan> {
    let state = super::status::read_state(root, settings)?;
    let node = image_node(root, settings, crate::artifact::node_platform(), None);
    let facts = node.host_facts(&state);
    let mut plan = InstallPlan {
        shims: Vec::with_capacity(shims.len()),
        recovers: state.journal.as_ref().map(|j| j.id.clone()),
    };
    for shim in shims {
        let work = classify(&Change::Install(Box::new(shim.clone())), &state, &facts);
        if work != Work::Unchanged
            && let Some(owner) = handler_owner(&state, shim)
        {
            bail!("{}", handler_in_use_message(shim, owner));
        }
        plan.shims.push((shim.name().to_string(), work));
    }
    Ok(plan)
}

/// Undo an offline install of Shim `name`.
pub async fn uninstall_offline(
    root: &HostRoot,
    settings: &Settings,
    name: &str,
) -> anyhow::Result<UninstallOutcome> {
    let state_dir = root.resolve(&settings.paths.state_dir)?;
    if !state_dir.join(STATE_FILE).exists() {
        bail!(
            "no Shim named {name:?} is installed under {} (no state in {})",
            root.path().display(),
            settings.paths.state_dir
        );
    }
    let platform = crate::artifact::node_platform();
    exactly(
        root,
        settings,
        (platform, None),
        async |node, store, state| {
            let Some(shim) = state.shims.get(name).cloned() else {
                let known: Vec<&str> = state.shims.keys().map(String::as_str).collect();
                bail!(
                    "no Shim named {name:?} is installed (installed: {})",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                );
            };
            node.apply_with(store, state, vec![Change::Uninstall(name.to_string())])
                .await?;
            let mut out = UninstallOutcome {
                restored: vec![],
                changed_since: vec![],
            };
            for rec in &shim.config_files {
                let now = std::fs::read(root.resolve(&rec.path)?)
                    .ok()
                    .map(|b| sha256_hex(&b));
                if now == rec.sha256_before {
                    out.restored.push(rec.path.clone());
                } else {
                    out.changed_since.push(rec.path.clone());
                }
            }
            Ok(out)
        },
    )
    .await
}
