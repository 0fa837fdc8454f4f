//! Before a transaction touches the host: every artifact fetched and verified, every config
//! change planned; and the files written once it may. A Shim's own failure before the host
//! changes is a [`TxnError`] that blames that Shim alone, so the rest of its batch goes on
//! together without it.

use anyhow::Context;

use super::batch;
use super::error::TxnError;
use super::files::Undo;
use super::host::{Node, Prepared, failpoint};
use super::ports::{HealthCheck, Restarter};
use super::preflight::check_record;
use super::record::{now_secs, runtime_spec};
use crate::api::Shim;
use crate::artifact::configure::{fetch_spec, fetcher, spec_location};
use crate::artifact::signed::{self, Checks, NodeSignatures};
use crate::artifact::{self, Store};
use crate::containerd::{self, AddOptions, Current, Plan};
use crate::signature::{SignedBy, Verified};
use crate::state::{InstalledShim, NodeState, Origin, SignatureRecord};

impl<R: Restarter, H: HealthCheck> Node<'_, R, H> {
    pub(super) async fn fetch_all(
        &self,
        state: &NodeState,
        installs: &[(Box<Shim>, Origin)],
        progress: bool,
        undo: &mut Undo,
    ) -> anyhow::Result<Vec<Prepared>> {
        let store_dir = self.state_dir()?.join("store");
        for sub in ["sha256", "tmp", "refs"] {
            undo.create_dir_all(&store_dir.join(sub))?;
        }
        let artifacts = Store::open(&store_dir)?;
        let fetcher = self.fetcher(progress).await?;
        let signatures = NodeSignatures::load(&self.settings.signatures, self.root)?;
        let mut out = Vec::new();
        let mut bins = Vec::new();
        for (shim, origin) in installs {
            let spec = fetch_spec(shim, &self.settings.fetch)?;
            let blame = |e: anyhow::Error| TxnError::unprepared(shim.name(), e);
            let (fetched, signature) =
                fetch_verified(&fetcher, &artifacts, &spec, shim, &signatures, undo).await?;
            let wanted = shim.spec.runtime.as_ref().and_then(|r| r.binary.as_deref());
            let bin = artifact::find_shim_binary(&fetched.dir, wanted, &self.platform.arch)
                .map_err(|e| blame(e.into()))?;
            let tree = artifact::version_dir(shim.name(), &fetched.digest);
            let host_s = tree
                .join(artifact::relative_in(&fetched.dir, &bin))
                .display()
                .to_string();
            let runtime = shim.spec.runtime.as_ref();
            let option_paths = match runtime.and_then(|r| r.option_paths.as_ref()) {
                Some(paths) => {
                    let options = runtime.and_then(|r| r.options.as_ref());
                    artifact::resolve_option_paths(&fetched.dir, &tree, paths, options)
                        .with_context(|| format!("Shim {:?}", shim.name()))
                        .map_err(blame)?
                }
                None => Default::default(),
            };
            let rt = runtime_spec(shim, &host_s, &option_paths);
            out.push(Prepared {
                record: InstalledShim {
                    name: shim.name().to_string(),
                    handler: shim.handler().to_string(),
                    runtime_type: rt.runtime_type.clone(),
                    artifact_sha256: fetched.digest.clone(),
                    source: spec_location(&spec, fetcher.platform(), fetcher.containerd()),
                    binary: host_s,
                    spec_hash: shim.spec_hash(),
                    config_files: vec![],
                    state: self.health.committed_state(),
                    origin: *origin,
                    runtime_class: Some(shim.spec.runtime_class.name.clone()),
                    installed_at: now_secs(),
                    shim_version: None, // the preflight's, below
                    check: check_record(shim),
                    insecure_source: insecure_source(&fetched, state.shims.get(shim.name())),
                    signature,
                },
                tree_src: fetched.dir.clone(),
                previous: state.shims.get(shim.name()).cloned(),
                runtime: rt,
            });
            bins.push(bin);
        }
        let checked: Vec<(&Shim, &std::path::Path)> = installs
            .iter()
            .zip(&bins)
            .map(|((shim, _), bin)| (&**shim, bin.as_path()))
            .collect();
        let versions = self.preflight_all(&checked).await?;
        for (p, version) in out.iter_mut().zip(versions) {
            p.record.shim_version = version;
        }
        Ok(out)
    }

    /// The fetcher for this node: the agent's fetch settings, its platform and containerd,
    /// containerd's registry hosts.
    async fn fetcher(&self, progress: bool) -> anyhow::Result<artifact::Fetcher> {
        Ok(
            fetcher(&self.settings.fetch, self.platform.clone(), progress)?
                .for_containerd(self.containerd_version().await)
                .with_registry_hosts(self.registry_hosts_dirs()),
        )
    }

    /// containerd's registry hosts directories (its `config_path`) as local paths under the
    /// root; none when its config sets none or cannot be read (the fetch then goes to each
    /// registry directly, as containerd would).
    fn registry_hosts_dirs(&self) -> Vec<std::path::PathBuf> {
        let Ok(current) = self.profile.layout().load(self.root) else {
            return vec![];
        };
        let Ok(images) = containerd::images::read_current(&current) else {
            return vec![];
        };
        images
            .registry_config_path
            .map(|p| containerd::images::hosts_dirs(&p))
            .unwrap_or_default()
            .iter()
            .filter_map(|d| self.root.resolve(d).ok())
            .collect()
    }

    /// The containerd version that picks a Shim's build: what CRI `Version` reports (an image
    /// root's: the builder's or the image's); `None` when it cannot be told.
    async fn containerd_version(&self) -> Option<artifact::ContainerdVersion> {
        let reported = self.health.runtime_version().await?;
        match artifact::ContainerdVersion::parse(&reported) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(version = %reported, "cannot read containerd's version: {e}");
                None
            }
        }
    }

    pub(super) fn plan_all(
        &self,
        mut current: Current,
        prepared: &[Prepared],
        removes: &[InstalledShim],
    ) -> anyhow::Result<Plan> {
        let mut steps: Vec<Plan> = Vec::new();
        let handlers: Vec<String> = removes.iter().map(|r| r.handler.clone()).collect();
        let plans = current.plan_removes(&handlers).map_err(|(i, e)| {
            let name = removes.get(i).map(|r| r.name.as_str());
            TxnError::unprepared(name.unwrap_or_default(), e.into())
        })?;
        for p in &plans {
            current.update(p);
        }
        steps.extend(plans);
        let adds: Vec<_> = prepared
            .iter()
            .map(|p| {
                let opts = AddOptions {
                    replace: p.previous.is_some(),
                    dropin: self.dropin_policy(),
                };
                (p.runtime.clone(), opts)
            })
            .collect();
        let plans = current.plan_adds(&adds).map_err(|(i, e)| {
            let name = prepared.get(i).map(|p| p.record.name.as_str());
            TxnError::unprepared(name.unwrap_or_default(), e.into())
        })?;
        steps.extend(plans);
        Ok(batch::combine(steps))
    }

    /// Place the binaries and write the config files. A directory created for a new config
    /// file (a drop-in directory) is remembered in `undo`, so a rolled-back run takes it away.
    pub(super) fn apply_files(
        &self,
        prepared: &[Prepared],
        plan: &Plan,
        undo: &mut Undo,
    ) -> anyhow::Result<()> {
        self.place_trees(prepared)?;
        failpoint("txn::write_config");
        for c in plan.changes.iter().filter(|c| c.after.is_some()) {
            if let Some(dir) = self.root.resolve(&c.host_path)?.parent() {
                undo.create_dir_all(dir)?;
            }
        }
        containerd::apply(self.root, plan)?;
        Ok(())
    }

    /// Every prepared tree placed, up to [`PLACERS`] side by side: each is a directory of its
    /// own, and each file and directory written is an fsync, so a batch waited for the disk
    /// one Shim after another. Any error fails the step; what the others placed goes with the
    /// rollback, from the journal's backups, as a tree placed before the error always did.
    fn place_trees(&self, prepared: &[Prepared]) -> anyhow::Result<()> {
        let (per, root) = (prepared.len().div_ceil(PLACERS).max(1), self.root);
        let place = |group: &[Prepared]| -> anyhow::Result<()> {
            for p in group {
                failpoint("txn::place_binary");
                artifact::place_tree(root, &p.record.name, &p.record.artifact_sha256, &p.tree_src)?;
            }
            Ok(())
        };
        if prepared.len() <= 1 {
            return place(prepared);
        }
        std::thread::scope(|s| {
            let placers: Vec<_> = prepared
                .chunks(per)
                .map(|group| s.spawn(move || place(group)))
                .collect();
            placers
                .into_iter()
                .map(|p| match p.join() {
                    Ok(r) => r,
                    // a failpoint's panic, as it would have been on this thread
                    Err(panic) => std::panic::resume_unwind(panic),
                })
                .collect::<anyhow::Result<Vec<()>>>()
                .map(|_| ())
        })
    }
}

/// How many trees a transaction places at once.
const PLACERS: usize = 8;

/// The host that served the artifact without its certificate being verified: this fetch's,
/// or, when the store already had it (no host asked), the installed record's for the same
/// digest.
fn insecure_source(
    fetched: &artifact::StoredArtifact,
    installed: Option<&InstalledShim>,
) -> Option<String> {
    fetched.insecure_host.clone().or_else(|| {
        installed
            .filter(|r| !fetched.fetched && r.artifact_sha256 == fetched.digest)
            .and_then(|r| r.insecure_source.clone())
    })
}

/// What the state records of a verified signature.
fn signature_record(checks: &Checks<'_>, v: Verified) -> SignatureRecord {
    let (signed_by, issuer) = match v.signed_by {
        SignedBy::Identity { identity, issuer } => (identity, Some(issuer)),
        SignedBy::Key { fingerprint } => (format!("key {fingerprint}"), None),
    };
    tracing::info!(
        file = checks.spec.signed_file.as_deref().unwrap_or("the artifact"),
        %signed_by,
        signed_time = ?v.signed_time,
        time_source = ?v.time_source,
        node_policy = checks.node.is_some(),
        "signature verified"
    );
    SignatureRecord {
        file: checks
            .spec
            .signed_file
            .clone()
            .unwrap_or_else(|| "artifact".into()),
        signed_by,
        issuer,
        signed_time: v.signed_time,
        node_policy: checks.node.is_some(),
    }
}

/// `shim`'s artifact fetched into the store, and its signature verified when the Shim or the
/// node asks for one: the node's policy is decided first, so a Shim it refuses is not even
/// downloaded.
async fn fetch_verified(
    fetcher: &artifact::Fetcher,
    artifacts: &Store,
    spec: &artifact::FetchSpec,
    shim: &Shim,
    signatures: &NodeSignatures,
    undo: &mut Undo,
) -> Result<(artifact::StoredArtifact, Option<SignatureRecord>), TxnError> {
    let in_shim = |e: anyhow::Error| {
        TxnError::unprepared(shim.name(), e.context(format!("Shim {:?}", shim.name())))
    };
    let counted = |e: artifact::ArtifactError| {
        crate::telemetry::signature_checked(e.reason());
        in_shim(e.into())
    };
    let checks =
        signed::plan(shim.name(), shim.spec.signature.as_ref(), signatures).map_err(counted)?;
    let fetched = fetcher
        .fetch(spec, artifacts)
        .await
        .map_err(|e| in_shim(e.into()))?;
    if fetched.fetched {
        undo.created_dir(fetched.dir.clone());
    }
    let signature = match &checks {
        Some(c) => {
            let v = fetcher
                .verify_signature(c, spec, &fetched, signatures)
                .await
                .map_err(counted)?;
            crate::telemetry::signature_checked("");
            Some(signature_record(c, v))
        }
        None => None,
    };
    Ok((fetched, signature))
}
