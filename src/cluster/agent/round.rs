//! One round of the agent, in named steps: read what it works from ([`Rounds::read`]), plan
//! (which changes, held back by failures and crashes, one at a time after an unnamed batch
//! failure), take the labels off before an uninstall, build the gate (rollout slots with the
//! node hooks around them), transact (one transaction for every change, the Node told what
//! is under way beside it), and report (the failure memory, the Node's labels and state
//! with the slots given back beside them, then the round's Events).

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch as tokio_watch;
use tokio::time::Instant;

use super::caches::{Caches, pod_use};
use super::gate::{GateTimings, NodeHints, SlotGate};
use super::node_sync::{NodeSync, adopt_into_cluster};
use super::outcome::Outcomes;
use super::view::RoundView;
use crate::api::Shim;
use crate::cluster::nodestate;
use crate::cluster::target::{self, NodePlan, PodUse};
use crate::reconciler::judge::Context;
use crate::reconciler::memory::{Memory, Wanted};
use crate::reconciler::round::{Opened, Planning, open_round};
use crate::state::{NodeState, StateStore};
use crate::statics::read_static_shims;
use crate::txn::{Change, Gate, HealthCheck, Node, ReleaseLater, Restarter};

/// The first pause before an announcement that failed is tried again, and the longest.
const ANNOUNCE_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
const ANNOUNCE_RETRY_MOST: std::time::Duration = std::time::Duration::from_secs(8);

/// What a round works from: the cluster's Shims, the node's static ones, its pods.
pub(super) struct Read {
    pub(super) node: KubeNode,
    pub(super) cluster: Vec<Shim>,
    pub(super) statics: Vec<Shim>,
    pub(super) statics_ok: bool,
    pub(super) pods: Vec<PodUse>,
}

/// The agent's rounds: what they work with, and what they keep between them.
pub(super) struct Rounds<'n, 'a, R, H> {
    pub(super) node: &'n Node<'a, R, H>,
    pub(super) client: Client,
    pub(super) node_name: String,
    /// How this node waits for rollout slots.
    pub(super) gate_timings: GateTimings,
    /// Turns true when the agent stops: the gate's waits end, and the round is judged
    /// stopping.
    pub(super) shutdown: tokio_watch::Receiver<bool>,
    /// What it remembers between rounds (the reconciler core's memory, as in `run` without a
    /// cluster).
    pub(super) memory: Memory,
    /// The writes of its Node, and their retry.
    pub(super) sync: NodeSync,
    /// What it tells the world of each round.
    pub(super) tell: Outcomes,
}

impl<R: Restarter, H: HealthCheck> Rounds<'_, '_, R, H> {
    /// One round: read, plan, unlabel, gate, transact, report.
    pub(super) async fn round(
        &mut self,
        store: &StateStore,
        state: &mut NodeState,
        caches: &Caches,
    ) {
        // marked before the read: a change while it reads ends a wait too (one round more)
        let mut specs = caches.specs.clone();
        specs.mark_unchanged();
        let Some(read) = self.read(caches) else {
            return;
        };
        let labels = read.node.labels().clone();
        // the Shims that target this node: one that stops doing so is an uninstall, keyed
        // as the static daemon keys a removed file's
        let targeted = read.cluster.iter().filter(|s| target::targets(s, &labels));
        let wanted = Wanted::of(targeted.chain(&read.statics));
        let now = Instant::now();
        let Opened {
            held,
            aside,
            planning,
        } = open_round(&mut self.memory, store, state, wanted, now);
        crate::telemetry::set_aside(aside.names.len());
        self.tell
            .report_aside(&aside.new, &read.cluster, &read.node);
        let view = RoundView {
            cluster: &read.cluster,
            statics: &read.statics,
            statics_ok: read.statics_ok,
            pods: &read.pods,
            held: &held,
            specs,
        };
        let mut plan = self.plan(&view, &labels, state, &planning);
        let mut current = self.unlabel(read.node.clone(), &labels, &mut plan).await;
        let facts = self.node.host_facts(state);
        let mut begun = planning.begin(store, state, &plan.changes, &facts);
        let work = begun.work().to_vec();
        let before = state.clone();
        let me = self.node_name.clone();
        let gate = ReleaseLater::new(self.gate(&me, &view, &plan, state, caches, &current));
        let tx = self.transact(store, state, &view, &plan, &work, &gate, &mut current);
        let outcome = begun.transact(tx).await;
        let cx = Context {
            stopping: *self.shutdown.borrow(),
            node: &me,
            now: Instant::now(),
        };
        let concluded = begun.conclude(&mut self.memory, &outcome, cx);
        let (verdict, wanted) = (&concluded.verdict, concluded.wanted());
        match &outcome {
            Ok(report) => self
                .tell
                .succeeded(report, &before, &read.cluster, &current),
            Err(e) => self
                .tell
                .failed(e, verdict, &before, wanted, &read.cluster, &current),
        }
        adopt_into_cluster(store, state, &view, &labels);
        self.tell
            .report_blocked_and_conflicts(&plan, &read.cluster, &current);
        // the slots go back beside the label patch, not before it: one round trip less on
        // the way to the label (a committed change holds its slots a moment longer)
        let notes = self.memory.notes();
        let synced = self.sync.sync_node(current, &view, state, &plan, &notes);
        tokio::join!(synced, gate.finish());
        concluded.end(store, state);
        self.tell.publish_events();
    }

    /// The caches and `shims.d` as the round reads them; `None` before this Node is known.
    fn read(&self, caches: &Caches) -> Option<Read> {
        let node = caches.node.state().first().map(|n| (**n).clone())?;
        let dir = self
            .node
            .root
            .resolve(&self.node.settings.paths.static_shims_dir)
            .ok();
        let (statics, errors) = dir.map(|d| read_static_shims(&d)).unwrap_or_default();
        for e in &errors {
            tracing::error!("ignoring a static Shim file until it is fixed: {e}");
        }
        Some(Read {
            node,
            cluster: caches.shims.state().iter().map(|s| (**s).clone()).collect(),
            statics,
            statics_ok: errors.is_empty(),
            pods: caches.pods.state().iter().map(|p| pod_use(p)).collect(),
        })
    }

    /// What to change now (pure): the node's plan, one Shim at a time after an unnamed batch
    /// failure.
    fn plan(
        &mut self,
        view: &RoundView<'_>,
        labels: &std::collections::BTreeMap<String, String>,
        state: &NodeState,
        planning: &Planning<'_>,
    ) -> NodePlan {
        let mut plan = target::plan_node(&view.inputs(labels, state));
        let facts = self.node.host_facts(state);
        planning.cut_to_solo(&mut self.memory, &mut plan.changes, state, &facts);
        plan
    }

    /// Labels off before any uninstall; no uninstall if that failed. The Node as it is now.
    async fn unlabel(
        &mut self,
        node: KubeNode,
        labels: &std::collections::BTreeMap<String, String>,
        plan: &mut NodePlan,
    ) -> KubeNode {
        let Some(patch) = nodestate::unlabel_patch(labels, &plan.unlabel) else {
            return node;
        };
        match self.sync.patch_node(patch).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!("cannot remove Shim labels from the Node; uninstalls wait: {e}");
                plan.changes.retain(|c| !matches!(c, Change::Uninstall(_)));
                self.sync.write_failed();
                node
            }
        }
    }

    /// The round's transaction behind its gate (rollout slots, node hooks around them),
    /// telling the Node what is under way beside it (best effort).
    #[allow(clippy::too_many_arguments)]
    async fn transact(
        &self,
        store: &StateStore,
        state: &mut NodeState,
        view: &RoundView<'_>,
        plan: &NodePlan,
        work: &[String],
        gate: &impl Gate,
        current: &mut KubeNode,
    ) -> Result<crate::txn::Report, crate::txn::TxnError> {
        let announce = if work.is_empty() {
            None
        } else {
            let notes = self.memory.notes();
            self.sync
                .node_sync_patch(current, view, state, plan, &notes)
        };
        let tx = self
            .node
            .apply_gated(store, state, plan.changes.clone(), false, gate);
        let mut tx = std::pin::pin!(tx);
        let Some(p) = announce else {
            return tx.await;
        };
        let announcing = std::pin::pin!(self.announce(p));
        tokio::select! {
            // the transaction ended before the announcement landed: the round's end says it
            r = &mut tx => r,
            n = announcing => {
                *current = n;
                tx.await
            }
        }
    }

    /// Tell the Node what is under way, trying again until it lands: the coordinator reserves
    /// a slot only for a node whose Node says it waits, so a node whose announcement was lost
    /// (a timeout on a loaded API server) waited for a reservation that never came. 5000
    /// agents left 9 nodes so, without a state on their Node, for good.
    async fn announce(&self, patch: serde_json::Value) -> KubeNode {
        let mut pause = ANNOUNCE_RETRY_FIRST;
        loop {
            match self.sync.patch_node(patch.clone()).await {
                Ok(n) => return n,
                Err(e) => {
                    tracing::warn!(
                        retry_in_ms = pause.as_millis() as u64,
                        "cannot tell the Node what is under way: {e}"
                    );
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(ANNOUNCE_RETRY_MOST);
                }
            }
        }
    }

    /// The gate of the round's transaction: this node's rollout slots of the cluster's
    /// Shims (never of its static ones), with the node hooks around them; both end their
    /// waits when the agent stops, and the wait for a first slot ends when the Shims change.
    fn gate<'g>(
        &self,
        me: &'g str,
        view: &RoundView<'g>,
        plan: &NodePlan,
        state: &NodeState,
        caches: &Caches,
        current: &KubeNode,
    ) -> crate::hooks::NodeHooks<'g, SlotGate<'g>> {
        let slots = SlotGate::new(
            self.client.clone(),
            me,
            &current.uid().unwrap_or_default(),
            view.cluster,
            self.gate_timings,
        );
        let slots = slots
            .until(self.shutdown.clone())
            .until_superseded(view.specs.clone())
            .hinted_by(NodeHints {
                node: caches.node.clone(),
                changes: caches.node_changes.clone(),
            })
            .except(view.statics.iter().map(|s| s.name().to_string()));
        let report = crate::hooks::Report {
            recorder: self.tell.recorder().clone(),
            refs: vec![current.object_ref(&())],
        };
        let changes = crate::hooks::node_hooks::changes_of(&plan.changes, state);
        let gate = crate::hooks::NodeHooks::new(
            slots,
            caches.hooks.clone(),
            me,
            view.cluster,
            changes,
            self.gate_timings.max_deferral,
            report,
        );
        gate.until(self.shutdown.clone())
    }
}
