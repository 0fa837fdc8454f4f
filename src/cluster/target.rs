//! Which Shims this node should run, and what to change now: a pure function of the
//! cluster's Shims, the node's labels, the static Shims, the node state and the node's pods.
//!
//! # Rules
//! - A Shim targets the node when its `nodeSelector` matches the node's labels; without a
//!   selector it targets every node without [`CONTROL_PLANE_LABEL`]. A Shim being deleted
//!   targets nothing.
//! - A static Shim (`shims.d`) wins over a cluster Shim of the same name on this node: the
//!   node owner's file is the more specific intent, and replacing a node's own configuration
//!   from the cluster would surprise its owner. The clash is reported in `conflicts`.
//! - A shim installed from the cluster or from `shims.d` that is no longer wanted is
//!   uninstalled, but only once no pod on the node uses its RuntimeClass: until then it is
//!   `blocked` with the pods' names. Its label goes first in both cases, so no new pod
//!   arrives. Offline and CLI installs are the node owner's and are never removed here.
//! - Static Shims are never removed while a `shims.d` file fails to parse.
//! - Names in `held` (backing off after a failure) are left as they are.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::Shim;
use crate::api::names::CONTROL_PLANE_LABEL;
use crate::state::{NodeState, Origin, ShimState};
use crate::txn::Change;

/// A pod on this node, as far as uninstalls care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUse {
    /// `namespace/name`.
    pub name: String,
    /// `spec.runtimeClassName`.
    pub runtime_class: Option<String>,
    /// Succeeded or Failed: its containers are gone.
    pub finished: bool,
}

/// Everything the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub node_labels: &'a BTreeMap<String, String>,
    pub cluster: &'a [Shim],
    pub statics: &'a [Shim],
    /// Every `shims.d` file parsed.
    pub statics_ok: bool,
    pub state: &'a NodeState,
    pub pods: &'a [PodUse],
    pub held: &'a BTreeSet<String>,
}

/// What to do now.
#[derive(Debug, Clone, Default)]
pub struct NodePlan {
    /// Installs (and upgrades) and uninstalls, for one transaction.
    pub changes: Vec<Change>,
    /// Shim labels to take off the Node before the transaction.
    pub unlabel: BTreeSet<String>,
    /// Uninstalls waiting for pods: Shim name → `namespace/name` of each pod.
    pub blocked: BTreeMap<String, Vec<String>>,
    /// Names in `shims.d` and in the cluster (the static one is used here).
    pub conflicts: Vec<String>,
}

/// Does `shim` target a node with these labels?
pub fn targets(shim: &Shim, labels: &BTreeMap<String, String>) -> bool {
    if shim.metadata.deletion_timestamp.is_some() {
        return false;
    }
    match &shim.spec.node_selector {
        Some(sel) => sel.iter().all(|(k, v)| labels.get(k) == Some(v)),
        None => !labels.contains_key(CONTROL_PLANE_LABEL),
    }
}

/// The cluster Shims this node should run (targeted and not shadowed by a static Shim).
pub fn wanted_from_cluster<'a>(inputs: &Inputs<'a>) -> Vec<&'a Shim> {
    let statics: BTreeSet<&str> = inputs.statics.iter().map(|s| s.name()).collect();
    inputs
        .cluster
        .iter()
        .filter(|s| targets(s, inputs.node_labels) && !statics.contains(s.name()))
        .collect()
}

/// Decide what to change now.
pub fn plan_node(inputs: &Inputs<'_>) -> NodePlan {
    let mut plan = NodePlan::default();
    let statics: BTreeSet<&str> = inputs.statics.iter().map(|s| s.name()).collect();
    for s in inputs.statics {
        if !inputs.held.contains(s.name()) {
            plan.changes
                .push(Change::InstallAs(Box::new(s.clone()), Origin::Static));
        }
    }
    let cluster = wanted_from_cluster(inputs);
    for s in inputs.cluster {
        if statics.contains(s.name()) && targets(s, inputs.node_labels) {
            plan.conflicts.push(s.name().to_string());
        }
    }
    for s in &cluster {
        if !inputs.held.contains(s.name()) {
            plan.changes
                .push(Change::InstallAs(Box::new((*s).clone()), Origin::Cluster));
        }
    }
    let wanted: BTreeSet<&str> = statics
        .iter()
        .copied()
        .chain(cluster.iter().map(|s| s.name()))
        .collect();
    for rec in inputs.state.shims.values() {
        let managed = match rec.origin {
            Origin::Cluster => true,
            Origin::Static => inputs.statics_ok,
            Origin::Offline | Origin::Cli => false,
        };
        if wanted.contains(rec.name.as_str()) || !managed {
            continue;
        }
        plan.unlabel.insert(rec.name.clone());
        if inputs.held.contains(&rec.name) {
            continue;
        }
        let class = runtime_class_of(inputs.cluster, &rec.name, rec.runtime_class.as_deref());
        let users: Vec<String> = inputs
            .pods
            .iter()
            .filter(|p| !p.finished && p.runtime_class.as_deref() == Some(class))
            .map(|p| p.name.clone())
            .collect();
        if users.is_empty() {
            plan.changes.push(Change::Uninstall(rec.name.clone()));
        } else {
            plan.blocked.insert(rec.name.clone(), users);
        }
    }
    plan
}

/// The RuntimeClass that sends pods to a shim: the Shim's if it still exists, else the one
/// recorded at install, else the Shim's name.
fn runtime_class_of<'a>(cluster: &'a [Shim], name: &'a str, recorded: Option<&'a str>) -> &'a str {
    cluster
        .iter()
        .find(|s| s.name() == name)
        .map(|s| s.spec.runtime_class.name.as_str())
        .or(recorded)
        .unwrap_or(name)
}

/// The Shim labels the node should carry: every cluster Shim it should run whose handler
/// containerd serves (an installed, verified record with the same handler; during an
/// upgrade the old version still serves it).
pub fn labels_wanted(inputs: &Inputs<'_>) -> BTreeSet<String> {
    wanted_from_cluster(inputs)
        .into_iter()
        .filter(|s| {
            inputs
                .state
                .shims
                .get(s.name())
                .is_some_and(|r| r.state == ShimState::Installed && r.handler == s.handler())
        })
        .map(|s| s.name().to_string())
        .collect()
}
