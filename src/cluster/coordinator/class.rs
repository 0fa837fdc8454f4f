//! The RuntimeClass a Shim wants (docs/design.md §7), pure: built from `spec.runtimeClass`
//! in the RuntimeClass API's own shapes, and compared with the one there, so that the
//! coordinator applies it only when it differs; and which Shims name the same class.

use std::collections::BTreeMap;

use k8s_openapi::api::node::v1::{Overhead, RuntimeClass, Scheduling};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, ResourceExt};

use crate::api::Shim;
use crate::api::names::{FIELD_MANAGER, MANAGED_BY_LABEL, node_label};

/// The RuntimeClass a Shim wants: its handler; scheduled onto nodes with its label (and the
/// Shim's own nodeSelector terms), with its tolerations and overhead; its labels beside
/// `app.kubernetes.io/managed-by`, its annotations; owned by the Shim (garbage-collected with
/// it). Applied whole by server-side apply, so that a field the Shim drops goes from the
/// RuntimeClass too.
pub fn runtime_class(shim: &Shim) -> RuntimeClass {
    let owner = shim.controller_owner_ref(&());
    let spec = &shim.spec.runtime_class;
    let mut labels = spec.labels.clone().unwrap_or_default();
    labels.insert(MANAGED_BY_LABEL.to_string(), FIELD_MANAGER.to_string());
    let mut node_selector = spec.node_selector_terms();
    node_selector.insert(node_label(&shim.name_any()), "true".to_string());
    RuntimeClass {
        metadata: ObjectMeta {
            name: Some(spec.name.clone()),
            labels: Some(labels),
            annotations: spec.annotations.clone().filter(|a| !a.is_empty()),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        handler: shim.handler().to_string(),
        scheduling: Some(Scheduling {
            node_selector: Some(node_selector),
            tolerations: spec.tolerations().filter(|t| !t.is_empty()),
        }),
        overhead: spec
            .pod_fixed()
            .filter(|p| !p.is_empty())
            .map(|pod_fixed| Overhead {
                pod_fixed: Some(pod_fixed),
            }),
    }
}

/// Whether the RuntimeClass there is the one the Shim wants, in every field the coordinator
/// sets. Labels and annotations someone else added are not the Shim's to judge; one the
/// coordinator applied and the Shim has since dropped is a difference. A quantity the server
/// wrote back in another form (`1000m` as `1`) is a difference too: the apply that follows
/// changes nothing and so sends no watch event.
pub(super) fn same_class(have: &RuntimeClass, want: &RuntimeClass) -> bool {
    let scheduling = |rc: &RuntimeClass| {
        let s = rc.scheduling.clone().unwrap_or_default();
        (
            s.node_selector.unwrap_or_default(),
            s.tolerations.unwrap_or_default(),
        )
    };
    let pod_fixed = |rc: &RuntimeClass| {
        rc.overhead
            .as_ref()
            .and_then(|o| o.pod_fixed.clone())
            .unwrap_or_default()
    };
    have.handler == want.handler
        && scheduling(have) == scheduling(want)
        && pod_fixed(have) == pod_fixed(want)
        && have.owner_references() == want.owner_references()
        && same_map(
            have.labels(),
            want.labels(),
            &applied_keys(have, "f:labels"),
        )
        && same_map(
            have.annotations(),
            want.annotations(),
            &applied_keys(have, "f:annotations"),
        )
}

/// Every entry of `want` is in `have`, and every key the coordinator applied (`applied`) is
/// still wanted; other entries of `have` are someone else's.
fn same_map(
    have: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    applied: &[String],
) -> bool {
    want.iter().all(|(k, v)| have.get(k) == Some(v)) && applied.iter().all(|k| want.contains_key(k))
}

/// The keys of `metadata.<field>` (`f:labels`, `f:annotations`) the coordinator's field
/// manager owns by apply, from the object's managedFields.
fn applied_keys(rc: &RuntimeClass, field: &str) -> Vec<String> {
    rc.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.manager.as_deref() == Some(FIELD_MANAGER) && m.operation.as_deref() == Some("Apply")
        })
        .filter_map(|m| {
            m.fields_v1
                .as_ref()?
                .0
                .get("f:metadata")?
                .get(field)?
                .as_object()
        })
        .flat_map(|keys| {
            keys.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .map(str::to_string)
        })
        .collect()
}

/// For each live Shim, the other live Shims that name the same RuntimeClass. While no class
/// of that name exists none of them applies it: the admission policy lets a class belong to
/// no Shim but the one that names it (docs/design.md §7), so each apply would be refused, and
/// reconciled side by side they would race. Each reports the conflict instead. Once a class
/// exists, its owner decides.
pub fn rivals_for_class(shims: &[&Shim]) -> BTreeMap<String, Vec<String>> {
    let mut by_class: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for s in shims
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
    {
        by_class
            .entry(s.spec.runtime_class.name.as_str())
            .or_default()
            .push(s.name_any());
    }
    let mut out = BTreeMap::new();
    for names in by_class.into_values().filter(|n| n.len() > 1) {
        for n in &names {
            let others = names.iter().filter(|o| *o != n).cloned().collect();
            out.insert(n.clone(), others);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Toleration;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};

    use super::*;

    fn shim(runtime_class: &str) -> Shim {
        let y = format!(
            "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: gv, uid: u1}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///x\", sha256: {}}}}}\n  runtimeClass: {runtime_class}\n",
            "a".repeat(64)
        );
        crate::api::load::parse_shims(&y, "t.yaml")
            .unwrap()
            .remove(0)
    }

    const FULL: &str = r#"{name: gvisor, handler: runsc, overhead: {podFixed: {cpu: 250m, memory: 160Mi, ephemeral-storage: 1}}, scheduling: {nodeSelector: {"feature.node.kubernetes.io/cpu-cpuid.VMX": "true", pool: sandbox}, tolerations: [{key: sandbox, value: "true", effect: NoSchedule}, {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 30}]}, labels: {team: infra}, annotations: {containerd.x-k8s.io/version: "20260101.0"}}"#;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_class_carries_every_scheduling_field_in_the_api_shapes_with_the_shims_own_label() {
        let rc = runtime_class(&shim(FULL));
        assert_eq!(rc.handler, "runsc");
        let sched = rc.scheduling.clone().unwrap();
        assert_eq!(
            sched.node_selector.unwrap(),
            map(&[
                ("containerd.x-k8s.io/gv", "true"),
                ("feature.node.kubernetes.io/cpu-cpuid.VMX", "true"),
                ("pool", "sandbox"),
            ])
        );
        assert_eq!(
            sched.tolerations.unwrap(),
            vec![
                Toleration {
                    key: Some("sandbox".into()),
                    value: Some("true".into()),
                    effect: Some("NoSchedule".into()),
                    ..Default::default()
                },
                Toleration {
                    key: Some("node.kubernetes.io/unreachable".into()),
                    operator: Some("Exists".into()),
                    effect: Some("NoExecute".into()),
                    toleration_seconds: Some(30),
                    ..Default::default()
                },
            ]
        );
        let fixed = rc.overhead.clone().unwrap().pod_fixed.unwrap();
        assert_eq!(fixed["cpu"], Quantity("250m".into()));
        assert_eq!(fixed["memory"], Quantity("160Mi".into()));
        assert_eq!(
            fixed["ephemeral-storage"],
            Quantity("1".into()),
            "an integer"
        );
        assert_eq!(
            rc.labels(),
            &map(&[
                ("app.kubernetes.io/managed-by", "shim-agent"),
                ("team", "infra")
            ])
        );
        assert_eq!(
            rc.annotations(),
            &map(&[("containerd.x-k8s.io/version", "20260101.0")])
        );
        assert!(same_class(&rc, &rc));
    }

    #[test]
    fn a_bare_class_has_only_the_shims_label_and_no_overhead_or_tolerations() {
        let rc = runtime_class(&shim("{name: gv}"));
        assert_eq!(rc.handler, "gv");
        let sched = rc.scheduling.clone().unwrap();
        assert_eq!(
            sched.node_selector.unwrap(),
            map(&[("containerd.x-k8s.io/gv", "true")])
        );
        assert_eq!(sched.tolerations, None);
        assert_eq!(rc.overhead, None);
        assert_eq!(rc.metadata.annotations, None);
    }

    #[test]
    fn a_change_in_any_field_the_shim_sets_is_a_difference() {
        let want = runtime_class(&shim(FULL));
        let changed: [fn(&mut RuntimeClass); 6] = [
            |rc| rc.handler = "other".into(),
            |rc| {
                let s = rc.scheduling.as_mut().unwrap();
                s.node_selector.as_mut().unwrap().remove("pool");
            },
            |rc| {
                let s = rc.scheduling.as_mut().unwrap();
                s.tolerations.as_mut().unwrap().pop();
            },
            |rc| rc.overhead = None,
            |rc| {
                rc.labels_mut().insert("team".into(), "other".into());
            },
            |rc| {
                rc.annotations_mut().clear();
            },
        ];
        for (i, change) in changed.iter().enumerate() {
            let mut have = want.clone();
            change(&mut have);
            assert!(!same_class(&have, &want), "change {i} not seen");
        }
    }

    fn applied(rc: &mut RuntimeClass, labels: &[&str]) {
        let keys: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|k| (format!("f:{k}"), serde_json::json!({})))
            .collect();
        let fields = serde_json::json!({"f:metadata": {"f:labels": keys}});
        rc.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(FIELD_MANAGER.into()),
            operation: Some("Apply".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..Default::default()
        }]);
    }

    #[test]
    fn someone_elses_label_is_kept_but_one_the_shim_dropped_is_a_difference() {
        let want = runtime_class(&shim("{name: gv}"));
        let mut have = want.clone();
        have.labels_mut().insert("theirs".into(), "x".into());
        applied(&mut have, &["app.kubernetes.io/managed-by"]);
        assert!(same_class(&have, &want), "another manager's label");
        applied(&mut have, &["app.kubernetes.io/managed-by", "theirs"]);
        assert!(
            !same_class(&have, &want),
            "a label the coordinator applied and the Shim no longer has"
        );
    }
}
