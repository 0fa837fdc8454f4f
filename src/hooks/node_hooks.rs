//! `BeforeNodeRestart` and `AfterNodeChange` around a node's rollout slot: a [`Gate`] that
//! wraps the slot gate.
//!
//! # Where BeforeNodeRestart is called
//! Right after the slot is held ([`Gate::acquire`]), before the engine stages or changes
//! anything on the host. The issue asks for "after it holds its slot and before it restarts
//! containerd"; this is the earliest such point, and the safest: a deferral can last
//! minutes, and a host waiting there is unchanged (old binary, old config), so a crash or a
//! shutdown during a deferral needs no rollback. The engine still renews the slot right before
//! the restart (`Gate::renew`), so its guarantee "a renewal must succeed right before the
//! restart" holds unchanged. A `Failure` (or an error under `failurePolicy: Fail`) is an
//! `Err` from `acquire`: the engine then aborts with nothing changed and marks the slot failed,
//! so it counts against `maxFailures` like any failure.
//!
//! Without extensions for the batch's Shims nothing is called and nothing is requested: the
//! extensions come from a watch cache.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::Recorder;

use super::call::{Hooks, Target};
use super::decide::{Deferrals, Step, Verdict, apply_policy};
use super::wire::{ChangeKind, ChangeResult, Request, ShimChange};
use crate::api::Shim;
use crate::api::extension::HookName;
use crate::state::NodeState;
use crate::txn::error::GateError;
use crate::txn::{Change, Gate};

/// The requests' view of a batch: each Shim, what happens to it, its old and new digests
/// (new: as the Shim pins it; a per-platform artifact has none until fetched).
pub fn changes_of(changes: &[Change], state: &NodeState) -> Vec<ShimChange> {
    changes
        .iter()
        .map(|c| {
            let (name, new) = match c {
                Change::Install(s) | Change::InstallAs(s, _) => (s.name().to_string(), pinned(s)),
                Change::Uninstall(n) => (n.clone(), None),
            };
            let old = state.shims.get(&name).map(|r| r.artifact_sha256.clone());
            let change = match (c, &old) {
                (Change::Uninstall(_), _) => ChangeKind::Uninstall,
                (_, Some(_)) => ChangeKind::Upgrade,
                (_, None) => ChangeKind::Install,
            };
            ShimChange {
                name,
                change,
                old_digest: old,
                new_digest: new,
            }
        })
        .collect()
}

fn pinned(s: &Shim) -> Option<String> {
    let f = &s.spec.fetch_strategy;
    f.anon_http
        .as_ref()
        .and_then(|a| a.sha256.clone())
        .or_else(|| {
            f.oci.as_ref().and_then(|o| {
                o.reference
                    .split_once("@sha256:")
                    .map(|(_, d)| d.to_string())
            })
        })
}

/// Where a node's hook calls are reported (Events on its Node and the Shims).
#[derive(Clone)]
pub struct Report {
    pub recorder: Recorder,
    pub refs: Vec<ObjectReference>,
}

impl Report {
    fn publish(&self, hook: HookName, ext: &str, v: &Verdict, took: Duration) {
        let result = v.result();
        crate::telemetry::hook_called(hook.as_str(), result, took);
        let note = format!(
            "{} of extension {ext}: {result} in {} ms{}",
            hook.as_str(),
            took.as_millis(),
            v.detail()
        );
        let ev = crate::events::event(
            v.event_type(),
            &format!("{}{result}", hook.as_str()),
            hook.as_str(),
            &note,
        );
        tracing::info!(
            hook = hook.as_str(),
            extension = ext,
            result,
            "{}",
            ev.note.as_deref().unwrap_or_default()
        );
        // the Events go out beside the transaction: an API round trip per object is not
        // worth holding a restart for
        crate::events::publish_beside(self.recorder.clone(), ev, self.refs.clone());
    }
}

/// A slot gate with the hooks of one node's transaction around it.
pub struct NodeHooks<'a, G> {
    inner: G,
    hooks: Arc<Hooks>,
    node: String,
    cluster: &'a [Shim],
    /// The batch, for the requests (the engine only names the Shims).
    changes: Vec<ShimChange>,
    max_deferral: Duration,
    report: Report,
    shutdown: Option<tokio::sync::watch::Receiver<bool>>,
    /// BeforeNodeRestart let the change go ahead: its end is notified (AfterNodeChange).
    proceeded: AtomicBool,
}

impl<'a, G: Gate> NodeHooks<'a, G> {
    pub fn new(
        inner: G,
        hooks: Arc<Hooks>,
        node: &str,
        cluster: &'a [Shim],
        changes: Vec<ShimChange>,
        max_deferral: Duration,
        report: Report,
    ) -> Self {
        NodeHooks {
            inner,
            hooks,
            node: node.into(),
            cluster,
            changes,
            max_deferral,
            report,
            shutdown: None,
            proceeded: AtomicBool::new(false),
        }
    }

    /// End a deferral when `shutdown` turns true.
    pub fn until(mut self, shutdown: tokio::sync::watch::Receiver<bool>) -> Self {
        self.shutdown = Some(shutdown);
        self
    }

    fn batch(&self, shims: &[String]) -> Vec<ShimChange> {
        self.changes
            .iter()
            .filter(|c| shims.contains(&c.name))
            .cloned()
            .collect()
    }

    async fn call_all(&self, targets: &[Target], req: &Request, hook: HookName) -> Vec<Verdict> {
        let calls = targets.iter().map(|t| async move {
            let (outcome, took) = self.hooks.call(t, req).await;
            let v = apply_policy(&t.name(), t.spec.policy(), outcome);
            self.report.publish(hook, &t.name(), &v, took);
            self.hooks.record(t, req, &v);
            v
        });
        futures_util::future::join_all(calls).await
    }

    /// Sleep `d`, or `Err` when the agent shuts down first.
    async fn pause(&self, d: Duration) -> Result<(), GateError> {
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            _ = tokio::time::sleep(d) => Ok(()),
            _ = async {
                match shutdown.as_mut() {
                    Some(s) => loop {
                        if *s.borrow() || s.changed().await.is_err() { break; }
                    },
                    None => std::future::pending().await,
                }
            } => Err(GateError::ShuttingDown),
        }
    }

    fn notify(&self, result: ChangeResult, message: Option<String>) {
        if !self.proceeded.swap(false, Ordering::SeqCst) {
            return;
        }
        let names: Vec<String> = self.changes.iter().map(|c| c.name.clone()).collect();
        let targets = self
            .hooks
            .targets(HookName::AfterNodeChange, &names, self.cluster);
        if targets.is_empty() {
            return;
        }
        let mut req = Request::new(
            HookName::AfterNodeChange,
            Some(&self.node),
            self.changes.clone(),
        );
        req.result = Some(result);
        req.message = message.map(|m| super::wire::clip(&m, super::wire::MAX_MESSAGE));
        let hooks = self.hooks.clone();
        let report = self.report.clone();
        // a notification: it never holds the transaction up
        tokio::spawn(async move {
            for t in targets {
                let (outcome, took) = hooks.call(&t, &req).await;
                // its failure policy is moot: nothing waits on it
                let v = apply_policy(&t.name(), t.spec.policy(), outcome);
                report.publish(HookName::AfterNodeChange, &t.name(), &v, took);
                hooks.record(&t, &req, &v);
            }
        });
    }
}

impl<G: Gate> Gate for NodeHooks<'_, G> {
    async fn acquire(&self, shims: &[String]) -> Result<(), GateError> {
        let hook = HookName::BeforeNodeRestart;
        loop {
            self.inner.acquire(shims).await?;
            self.hooks
                .ready()
                .await
                .map_err(GateError::ExtensionsUnknown)?;
            let targets = self.hooks.targets(hook, shims, self.cluster);
            let any_after = !self
                .hooks
                .targets(HookName::AfterNodeChange, shims, self.cluster)
                .is_empty();
            if targets.is_empty() {
                self.proceeded.store(any_after, Ordering::SeqCst);
                return Ok(());
            }
            let req = Request::new(hook, Some(&self.node), self.batch(shims));
            let mut deferrals = Deferrals::new(self.max_deferral);
            loop {
                let verdicts = self.call_all(&targets, &req, hook).await;
                match deferrals.step(&verdicts) {
                    Step::Proceed => {
                        self.proceeded.store(any_after, Ordering::SeqCst);
                        return Ok(());
                    }
                    Step::Fail(m) => return Err(GateError::Refused(m)),
                    Step::Defer(d) => {
                        crate::telemetry::doing(Some(format!(
                            "restart deferred by an extension for {} s",
                            d.as_secs()
                        )));
                        self.pause(d).await?;
                    }
                    Step::GiveUpSlot(d) => {
                        tracing::info!(
                            "deferred past {} s: giving the rollout slot up",
                            self.max_deferral.as_secs()
                        );
                        self.inner.release().await;
                        self.pause(d).await?;
                        break;
                    }
                }
            }
        }
    }

    async fn renew(&self) -> Result<(), GateError> {
        self.inner.renew().await
    }

    async fn release(&self) {
        self.inner.release().await;
        self.notify(ChangeResult::Committed, None);
    }

    async fn failed(&self, reason: &str) {
        self.inner.failed(reason).await;
        self.notify(ChangeResult::RolledBack, Some(reason.to_string()));
    }
}
