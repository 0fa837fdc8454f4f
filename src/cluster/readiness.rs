//! The node's readiness for its Shims, pure (docs/design.md §7): the Node condition
//! `containerd.x-k8s.io/ShimsReady` the agent keeps on its own Node, and the startup taint it
//! names for removal once the condition is True (the coordinator removes it: NodeRestriction
//! forbids a kubelet identity to change its own Node's taints).

use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};

use super::nodestate::{NodePhase, NodeStates};
use crate::api::names::GROUP;
use crate::text::{MESSAGE_MAX_BYTES, clip};

pub use crate::api::names::{SHIMS_READY, STARTUP_TAINT_ANNOTATION};

/// `kubernetes.startup-taint`: a taint key under `containerd.x-k8s.io/` and an effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupTaint {
    pub key: String,
    pub effect: String,
}

const EFFECTS: [&str; 3] = ["NoSchedule", "PreferNoSchedule", "NoExecute"];

impl StartupTaint {
    /// Parse `key:Effect` (`containerd.x-k8s.io/shims-pending:NoSchedule`). The key must be
    /// under `containerd.x-k8s.io/`: the coordinator may remove no other taint.
    pub fn parse(s: &str) -> Result<StartupTaint, String> {
        let shown = clip(s, 300);
        let (key, effect) = s.rsplit_once(':').ok_or_else(|| {
            format!("{shown:?} is not KEY:EFFECT (for example {GROUP}/shims-pending:NoSchedule)")
        })?;
        if !EFFECTS.contains(&effect) {
            return Err(format!(
                "{shown:?}: the effect must be one of {}",
                EFFECTS.join(", ")
            ));
        }
        let name = key.strip_prefix(&format!("{GROUP}/")).ok_or_else(|| {
            format!("{shown:?}: the key must start with {GROUP}/ (the coordinator removes no other taint)")
        })?;
        let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        if name.is_empty()
            || name.len() > 63
            || !name.chars().all(ok_char)
            || !ends(name.chars().next())
            || !ends(name.chars().last())
        {
            return Err(format!(
                "{shown:?}: the key's name after {GROUP}/ must be 1 to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
            ));
        }
        Ok(StartupTaint {
            key: key.to_string(),
            effect: effect.to_string(),
        })
    }

    /// `key:Effect`, as the annotation holds it.
    pub fn text(&self) -> String {
        format!("{}:{}", self.key, self.effect)
    }

    /// Whether `node` carries this taint.
    pub fn is_on(&self, node: &Node) -> bool {
        node.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|ts| ts.iter().any(|t| self.matches(t)))
    }

    fn matches(&self, t: &Taint) -> bool {
        t.key == self.key && t.effect == self.effect
    }
}

/// The condition's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub ready: bool,
    pub reason: &'static str,
    pub message: String,
}

/// Whether every Shim that targets the node (`wanted`) is installed and verified, from the
/// node's report (`states`): `Installed` counts, and so does `Upgrading` (the version before
/// serves the handler until the new one does, as the node label says), so that a rollout does
/// not take every node it passes out of scheduling; a failed upgrade does not count.
pub fn readiness(wanted: &[String], states: &NodeStates) -> Readiness {
    let mut failed = false;
    let pending: Vec<String> = wanted
        .iter()
        .filter_map(|name| {
            let Some(s) = states.get(name) else {
                return Some(format!("{name} (Installing)"));
            };
            if matches!(s.phase, NodePhase::Installed | NodePhase::Upgrading) {
                return None;
            }
            failed |= s.phase == NodePhase::Failed;
            Some(match &s.reason {
                Some(r) => format!("{name} ({:?}: {r})", s.phase),
                None => format!("{name} ({:?})", s.phase),
            })
        })
        .collect();
    if pending.is_empty() {
        let message = if wanted.is_empty() {
            "no Shim targets this node".to_string()
        } else {
            format!("installed and verified: {}", wanted.join(", "))
        };
        return Readiness {
            ready: true,
            reason: crate::api::names::reason::SHIMS_INSTALLED,
            message: clip(&message, MESSAGE_MAX_BYTES),
        };
    }
    Readiness {
        ready: false,
        reason: if failed {
            crate::api::names::reason::SHIMS_FAILED
        } else {
            crate::api::names::reason::SHIMS_PENDING
        },
        message: clip(
            &format!("not ready: {}", pending.join(", ")),
            MESSAGE_MAX_BYTES,
        ),
    }
}

/// The strategic-merge patch of the Node's status that sets the condition; `None` when it
/// says that already (the condition is written only on change). `lastTransitionTime` moves
/// only when the status does.
pub fn condition_patch(node: &Node, r: &Readiness, now: &str) -> Option<serde_json::Value> {
    let current = shims_ready(node);
    let status = if r.ready { "True" } else { "False" };
    if let Some(c) = current
        && c.status == status
        && c.reason.as_deref() == Some(r.reason)
        && c.message.as_deref() == Some(r.message.as_str())
    {
        return None;
    }
    let since = match current {
        Some(c) if c.status == status => c
            .last_transition_time
            .as_ref()
            .map(|t| t.0.to_string())
            .unwrap_or_else(|| now.to_string()),
        _ => now.to_string(),
    };
    Some(serde_json::json!({"status": {"conditions": [{
        "type": SHIMS_READY, "status": status, "reason": r.reason, "message": r.message,
        "lastHeartbeatTime": now, "lastTransitionTime": since,
    }]}}))
}

fn shims_ready(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == SHIMS_READY)
}

/// The coordinator's decision for one Node: the merge patch that removes the startup taint
/// its annotation names, once [`SHIMS_READY`] is True and the taint is there. It carries the
/// Node's resourceVersion, so that it fails, rather than undo another change, when the Node
/// changed meanwhile.
pub fn taint_removal(node: &Node) -> Option<serde_json::Value> {
    let wanted = node
        .metadata
        .annotations
        .as_ref()?
        .get(STARTUP_TAINT_ANNOTATION)?;
    let taint = StartupTaint::parse(wanted).ok()?;
    if shims_ready(node)?.status != "True" {
        return None;
    }
    let taints = node.spec.as_ref()?.taints.as_ref()?;
    if !taints.iter().any(|t| taint.matches(t)) {
        return None;
    }
    let rest: Vec<&Taint> = taints.iter().filter(|t| !taint.matches(t)).collect();
    Some(serde_json::json!({
        "metadata": {"resourceVersion": node.metadata.resource_version},
        "spec": {"taints": rest},
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::nodestate::ShimNodeState;

    fn state(phase: NodePhase, reason: Option<&str>) -> ShimNodeState {
        ShimNodeState {
            version: None,
            insecure_source: None,
            signed: None,
            phase,
            digest: None,
            reason: reason.map(str::to_string),
            message: None,
            generation: None,
            since: "t".into(),
            retained: Vec::new(),
        }
    }

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ready_only_when_every_targeting_shim_is_installed() {
        let mut states = NodeStates::new();
        states.insert("a".into(), state(NodePhase::Installed, None));
        states.insert("b".into(), state(NodePhase::Upgrading, None));
        states.insert("d".into(), state(NodePhase::PendingVerification, None));
        let r = readiness(&names(&["a", "b"]), &states);
        assert!(r.ready, "an upgrade under way serves the version before");
        assert_eq!(r.reason, "ShimsInstalled");
        assert_eq!(r.message, "installed and verified: a, b");
        let r = readiness(&names(&["a", "b", "c", "d"]), &states);
        assert!(!r.ready);
        assert_eq!(r.reason, "ShimsPending");
        assert_eq!(
            r.message,
            "not ready: c (Installing), d (PendingVerification)"
        );
        states.insert("c".into(), state(NodePhase::Failed, Some("DigestMismatch")));
        let r = readiness(&names(&["a", "b", "c"]), &states);
        assert_eq!(r.reason, "ShimsFailed");
        assert_eq!(r.message, "not ready: c (Failed: DigestMismatch)");
        let none = readiness(&[], &states);
        assert!(none.ready);
        assert_eq!(none.message, "no Shim targets this node");
    }

    #[test]
    fn a_long_list_is_clipped_on_a_character_boundary() {
        let wanted: Vec<String> = (0..200).map(|i| format!("shim-{i}-ü")).collect();
        let r = readiness(&wanted, &NodeStates::new());
        assert!(r.message.len() <= MESSAGE_MAX_BYTES);
        assert!(r.message.starts_with("not ready: shim-0-ü (Installing)"));
    }

    fn node(
        condition: Option<(&str, &str, &str)>,
        taints: &[(&str, &str)],
        ann: Option<&str>,
    ) -> Node {
        let conditions: Vec<serde_json::Value> = condition
            .into_iter()
            .map(|(st, reason, msg)| serde_json::json!({"type": SHIMS_READY, "status": st, "reason": reason, "message": msg, "lastTransitionTime": "2026-01-01T00:00:00Z"}))
            .collect();
        let taints: Vec<serde_json::Value> = taints
            .iter()
            .map(|(k, e)| serde_json::json!({"key": k, "effect": e}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "annotations": ann.map(|a| serde_json::json!({STARTUP_TAINT_ANNOTATION: a}))},
            "spec": {"taints": taints},
            "status": {"conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn the_condition_is_written_only_when_it_changes_and_keeps_its_transition_time() {
        let r = readiness(&names(&["a"]), &NodeStates::new());
        let fresh = condition_patch(&node(None, &[], None), &r, "2026-02-02T00:00:00Z").unwrap();
        let c = &fresh["status"]["conditions"][0];
        assert_eq!(c["status"], "False");
        assert_eq!(c["lastTransitionTime"], "2026-02-02T00:00:00Z");
        let same = node(Some(("False", r.reason, &r.message)), &[], None);
        assert_eq!(condition_patch(&same, &r, "2026-02-02T00:00:00Z"), None);
        let other = Readiness {
            message: "not ready: b (Installing)".into(),
            ..r.clone()
        };
        let p = condition_patch(&same, &other, "2026-02-02T00:00:00Z").unwrap();
        assert_eq!(
            p["status"]["conditions"][0]["lastTransitionTime"], "2026-01-01T00:00:00Z",
            "the status did not change"
        );
    }

    #[test]
    fn startup_taints_parse_with_clear_errors() {
        let t = StartupTaint::parse("containerd.x-k8s.io/shims-pending:NoSchedule").unwrap();
        assert_eq!(t.text(), "containerd.x-k8s.io/shims-pending:NoSchedule");
        for (bad, says) in [
            ("containerd.x-k8s.io/shims-pending", "is not KEY:EFFECT"),
            (
                "containerd.x-k8s.io/shims-pending:Sometimes",
                "the effect must be one of",
            ),
            (
                "example.com/pending:NoSchedule",
                "must start with containerd.x-k8s.io/",
            ),
            ("containerd.x-k8s.io/-x:NoSchedule", "1 to 63 letters"),
            ("containerd.x-k8s.io/ünïcödé:NoSchedule", "1 to 63 letters"),
        ] {
            let e = StartupTaint::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_taint_comes_off_only_when_ready_and_named() {
        let key = "containerd.x-k8s.io/shims-pending";
        let ann = "containerd.x-k8s.io/shims-pending:NoSchedule";
        let taints = [
            ("other", "NoSchedule"),
            (key, "NoExecute"),
            (key, "NoSchedule"),
        ];
        let ready = Some(("True", "ShimsInstalled", ""));
        let mut n = node(ready, &taints, Some(ann));
        n.metadata.resource_version = Some("42".into());
        let p = taint_removal(&n).unwrap();
        assert_eq!(
            p,
            serde_json::json!({
                "metadata": {"resourceVersion": "42"},
                "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}, {"key": key, "effect": "NoExecute"}]},
            })
        );
        let pending = Some(("False", "ShimsPending", ""));
        assert_eq!(
            taint_removal(&node(pending, &taints, Some(ann))),
            None,
            "not ready"
        );
        assert_eq!(
            taint_removal(&node(None, &taints, Some(ann))),
            None,
            "no condition"
        );
        assert_eq!(
            taint_removal(&node(ready, &taints, None)),
            None,
            "not named"
        );
        assert_eq!(
            taint_removal(&node(ready, &taints[..2], Some(ann))),
            None,
            "gone already"
        );
        assert_eq!(
            taint_removal(&node(ready, &taints, Some("other:NoSchedule"))),
            None,
            "a taint outside containerd.x-k8s.io/"
        );
    }
}
