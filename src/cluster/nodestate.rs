//! The agent's per-node report, pure: the `containerd.x-k8s.io/shim-state` annotation (one
//! JSON map for all Shims) and the Shim labels, and the merge patch that moves the Node there.
//!
//! The annotation is the only per-node record of progress the coordinator reads; the label is
//! the scheduling signal, set only once containerd serves the handler (verified).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::target::{Inputs, NodePlan, wanted_from_cluster};
use crate::api::names::{GROUP, STATE_ANNOTATION, node_label, reason};
use crate::reconciler::memory::FailureNote;
use crate::state::ShimState;

/// Where one Shim stands on one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodePhase {
    /// Wanted, not installed yet (fetching, waiting or in the transaction).
    Installing,
    /// Installed at an older spec; the new one is on its way.
    Upgrading,
    /// Installed offline; waiting for containerd to prove it serves the handler.
    PendingVerification,
    /// containerd serves the handler at the Shim's current spec.
    Installed,
    /// No longer wanted; the uninstall is under way.
    Uninstalling,
    /// No longer wanted, but pods on the node still use its RuntimeClass.
    Blocked,
    /// The last attempt failed (and was rolled back); retried with backoff.
    Failed,
    /// A static Shim of the same name runs here instead.
    Conflict,
    /// Uninstalled, but a removed version stays on disk while containerd tasks run through
    /// it (`retained`).
    Retained,
}

/// One entry of the annotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShimNodeState {
    pub phase: NodePhase,
    /// SHA-256 of the installed artifact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Machine-readable reason (CamelCase) for Failed, Blocked and Conflict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What a person reads: the error, or the pods that block an uninstall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Shim generation this entry is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// What the installed shim says of its own version (`-v`), when it said one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The registry host that served the installed artifact without its certificate being
    /// verified (containerd's `skip_verify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_source: Option<String>,
    /// Whose signature was verified before the install, and when it was signed (or that no
    /// signed time was checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signed: Option<String>,
    /// RFC 3339 time the phase began.
    pub since: String,
    /// Replaced or removed versions kept on disk while containerd tasks run through them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained: Vec<RetainedNote>,
}

/// A retained version in the node's report: which, and why it is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetainedNote {
    pub digest: String,
    /// Tasks that run through it (`namespace/id`; at most 16 named).
    pub tasks: Vec<String>,
    pub task_count: usize,
}

/// The annotation's value: Shim name → state.
pub type NodeStates = BTreeMap<String, ShimNodeState>;

/// Read the annotation (absent or unreadable: empty; a foreign edit is simply replaced).
/// Entries are read one by one: an entry this build cannot read (a newer agent's phase) is
/// skipped, not the whole node.
pub fn parse_states(annotations: Option<&BTreeMap<String, String>>) -> NodeStates {
    annotations
        .and_then(|a| a.get(STATE_ANNOTATION))
        .and_then(|v| serde_json::from_str::<BTreeMap<String, serde_json::Value>>(v).ok())
        .map(|m| {
            m.into_iter()
                .filter_map(|(k, v)| Some((k, serde_json::from_value(v).ok()?)))
                .collect()
        })
        .unwrap_or_default()
}

/// The states this node reports, from what it wants, what it has and what failed. `since`
/// is kept from `previous` while a phase does not change.
pub fn states_wanted(
    inputs: &Inputs<'_>,
    plan: &NodePlan,
    failures: &BTreeMap<String, FailureNote>,
    previous: &NodeStates,
    now: &str,
) -> NodeStates {
    let mut states = States {
        out: NodeStates::new(),
        previous,
        now,
    };
    for shim in wanted_from_cluster(inputs) {
        let name = shim.name();
        let rec = inputs.state.shims.get(name);
        let digest = rec.map(|r| r.artifact_sha256.clone());
        if let Some(f) = failures.get(name) {
            states.failed(name, digest, f, f.generation);
            continue;
        }
        let phase = match rec {
            None => NodePhase::Installing,
            Some(r) if r.state == ShimState::PendingVerification => NodePhase::PendingVerification,
            Some(r) if r.state != ShimState::Installed => NodePhase::Installing,
            Some(r) if r.spec_hash != shim.spec_hash() => NodePhase::Upgrading,
            Some(_) => NodePhase::Installed,
        };
        states.put(name, phase, digest, None, shim.metadata.generation);
    }
    for name in &plan.conflicts {
        let note = (
            reason::STATIC_SHIM_WINS,
            format!("a static Shim {name:?} in shims.d runs on this node instead of the cluster's"),
        );
        states.put(name, NodePhase::Conflict, None, Some(note), None);
    }
    for name in &plan.unlabel {
        let digest = inputs
            .state
            .shims
            .get(name)
            .map(|r| r.artifact_sha256.clone());
        match (plan.blocked.get(name), failures.get(name)) {
            (Some(pods), _) => {
                let note = (
                    reason::PODS_USE_RUNTIME_CLASS,
                    format!("pods still use it: {}", pods.join(", ")),
                );
                states.put(name, NodePhase::Blocked, digest, Some(note), None);
            }
            (None, Some(f)) => states.failed(name, digest, f, None),
            (None, None) => states.put(name, NodePhase::Uninstalling, digest, None, None),
        }
    }
    let mut out = states.out;
    add_retained(&mut out, inputs, previous, now);
    for (name, entry) in out.iter_mut() {
        let record = inputs.state.shims.get(name);
        entry.version = record.and_then(|r| r.shim_version.clone());
        entry.insecure_source = record.and_then(|r| r.insecure_source.clone());
        entry.signed = record
            .and_then(|r| r.signature.as_ref())
            .map(|s| crate::text::clip(&s.describe(), 512));
    }
    out
}

/// The states being built, each keeping its `since` from `previous` while its phase stays.
struct States<'p> {
    out: NodeStates,
    previous: &'p NodeStates,
    now: &'p str,
}

impl States<'_> {
    /// `name` in `phase`, with a reason and message when there is something to say.
    fn put(
        &mut self,
        name: &str,
        phase: NodePhase,
        digest: Option<String>,
        note: Option<(&str, String)>,
        generation: Option<i64>,
    ) {
        let since = match self.previous.get(name) {
            Some(p) if p.phase == phase => p.since.clone(),
            _ => self.now.to_string(),
        };
        let (reason, message) = match note {
            Some((r, m)) => (Some(r.to_string()), Some(m)),
            None => (None, None),
        };
        self.out.insert(
            name.to_string(),
            ShimNodeState {
                phase,
                digest,
                reason,
                message,
                generation,
                version: None,
                insecure_source: None,
                signed: None,
                since,
                retained: Vec::new(),
            },
        );
    }

    fn failed(
        &mut self,
        name: &str,
        digest: Option<String>,
        f: &FailureNote,
        generation: Option<i64>,
    ) {
        let note = Some((f.reason.as_str(), f.message.clone()));
        self.put(name, NodePhase::Failed, digest, note, generation);
    }
}

/// The node's retained versions on their Shims' entries (an entry of phase `Retained` for a
/// Shim no longer installed).
fn add_retained(out: &mut NodeStates, inputs: &Inputs<'_>, previous: &NodeStates, now: &str) {
    for r in &inputs.state.retained {
        let entry = out.entry(r.name.clone()).or_insert_with(|| ShimNodeState {
            phase: NodePhase::Retained,
            digest: None,
            reason: Some(reason::TASKS_RUN_THROUGH_IT.into()),
            message: Some("a removed version is kept while containerd tasks run through it".into()),
            generation: None,
            version: None,
            insecure_source: None,
            signed: None,
            since: match previous.get(&r.name) {
                Some(p) if p.phase == NodePhase::Retained => p.since.clone(),
                _ => now.to_string(),
            },
            retained: Vec::new(),
        });
        entry.retained.push(RetainedNote {
            digest: r.digest.clone(),
            tasks: r.tasks.clone(),
            task_count: r.task_count,
        });
    }
}

/// The merge patch that moves the Node's Shim labels to `labels` and its annotation to
/// `states`; `None` when the Node already is there. Labels under [`GROUP`]`/` that are not
/// wanted are removed.
pub fn node_patch(
    current_labels: &BTreeMap<String, String>,
    current_states: &NodeStates,
    current_annotation_present: bool,
    labels: &BTreeSet<String>,
    states: &NodeStates,
) -> Option<serde_json::Value> {
    let mut label_patch = serde_json::Map::new();
    let prefix = format!("{GROUP}/");
    for (key, name) in current_labels
        .keys()
        .filter_map(|k| Some((k, k.strip_prefix(&prefix)?)))
    {
        if !labels.contains(name) {
            label_patch.insert(key.clone(), serde_json::Value::Null);
        }
    }
    for name in labels {
        let key = node_label(name);
        if current_labels.get(&key).map(String::as_str) != Some("true") {
            label_patch.insert(key, "true".into());
        }
    }
    let mut meta = serde_json::Map::new();
    if !label_patch.is_empty() {
        meta.insert("labels".into(), label_patch.into());
    }
    let annotation = if states.is_empty() {
        current_annotation_present.then_some(serde_json::Value::Null)
    } else if states != current_states || !current_annotation_present {
        serde_json::to_string(states)
            .ok()
            .map(serde_json::Value::from)
    } else {
        None
    };
    if let Some(a) = annotation {
        meta.insert(
            "annotations".into(),
            serde_json::json!({ STATE_ANNOTATION: a }),
        );
    }
    (!meta.is_empty()).then(|| serde_json::json!({ "metadata": meta }))
}

/// The merge patch that only removes these Shim labels (before an uninstall).
pub fn unlabel_patch(
    current_labels: &BTreeMap<String, String>,
    names: &BTreeSet<String>,
) -> Option<serde_json::Value> {
    let drop: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .map(|n| node_label(n))
        .filter(|k| current_labels.contains_key(k))
        .map(|k| (k, serde_json::Value::Null))
        .collect();
    (!drop.is_empty()).then(|| serde_json::json!({ "metadata": { "labels": drop } }))
}
