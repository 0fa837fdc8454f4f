//! `spec.runtimeClass` of a Shim: the RuntimeClass the coordinator applies for it, in the
//! RuntimeClass API's own shapes (node.k8s.io/v1: `overhead.podFixed`,
//! `scheduling.nodeSelector`, `scheduling.tolerations`) plus the labels and annotations it
//! carries (docs/design.md §1).
//!
//! Every rule a RuntimeClass (or its metadata) must pass to be created is a CEL rule here, so
//! a Shim whose RuntimeClass the API server would refuse is itself refused by `kubectl apply`
//! (and by [`super::load::validate`] for a Shim file on a node), not accepted and then failed
//! on every coordinator round. The one rule that needs the Shim's name (its own node label
//! may not be a user term of the nodeSelector) sits on the Shim itself ([`super::ShimSpec`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration as CoreToleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::KubeSchema;
use kube::core::{Message, Rule};
use serde::{Deserialize, Serialize};

use super::names::MANAGED_BY_LABEL;

/// CEL regex of a qualified name (a label or annotation key): an optional DNS-1123
/// subdomain prefix and `/`, then 1 to 63 letters, digits, `-`, `_` or `.`, starting and
/// ending with a letter or digit.
const QUALIFIED_NAME: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";

/// CEL regex of a label value: empty, or up to 63 letters, digits, `-`, `_` or `.`, starting
/// and ending with a letter or digit.
const LABEL_VALUE: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$";

/// CEL: `k` is a qualified name (with `lower`, its prefix may have upper-case letters, as
/// annotation keys are checked lower-cased).
fn qualified(k: &str, lower: bool) -> String {
    let key = if lower {
        format!("{k}.lowerAscii()")
    } else {
        k.to_string()
    };
    format!(
        "{k}.size() <= 317 && (!{k}.contains('/') || {k}.indexOf('/') <= 253) && {key}.matches('{QUALIFIED_NAME}')"
    )
}

/// The rule on a map's keys: qualified names.
fn keys_rule(field: &str, what: &str, lower: bool) -> Rule {
    Rule::new(format!("self.all(k, {})", qualified("k", lower))).message(Message::Message(format!(
        "{field} keys must be {what}: an optional DNS-1123 subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    )))
}

/// The rule on a map's values: label values.
fn label_values_rule(field: &str) -> Rule {
    Rule::new(format!("self.all(k, self[k].matches('{LABEL_VALUE}'))")).message(Message::Message(format!(
        "{field} values must be label values: empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
    )))
}

/// CEL: tolerations `a` and `b` have the same key, operator, value and effect (what the
/// RuntimeClass API holds unique). `has()`, not `.?`: the API server's cost estimate loses the
/// fields' bounds through optionals, and refuses the rule.
fn same_toleration(a: &str, b: &str) -> String {
    ["key", "operator", "value", "effect"]
        .map(|f| format!("(has({a}.{f}) ? {a}.{f} : '') == (has({b}.{f}) ? {b}.{f} : '')"))
        .join(" && ")
}

/// The RuntimeClass for this shim.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RuntimeClassRef {
    /// Name of the RuntimeClass (a DNS-1123 subdomain).
    #[x_kube(validation = Rule::new("self.size() <= 253 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')")
        .message("runtimeClass.name must be a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters"))]
    #[schemars(length(max = 512))]
    pub name: String,
    /// containerd runtime handler name; default: the Shim's metadata.name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.size() <= 63 && self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("runtimeClass.handler must be a DNS-1123 label: at most 63 lower-case letters, digits or '-', starting and ending with a letter or digit"))]
    #[schemars(length(max = 128))]
    pub handler: Option<String>,
    /// The resources a pod of this class costs beyond its containers (a sandbox's VM or
    /// kernel): added to every such pod's requests by the RuntimeClass admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<Overhead>,
    /// Where pods of this class may run: nodeSelector terms beside the Shim's own node label
    /// (`containerd.x-k8s.io/<shim>: "true"`, always there), and tolerations added to every
    /// such pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
    /// Labels of the RuntimeClass, beside `app.kubernetes.io/managed-by: shim-agent`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = keys_rule("runtimeClass.labels", "label keys", false),
        validation = label_values_rule("runtimeClass.labels"),
        validation = Rule::new(format!("!('{MANAGED_BY_LABEL}' in self)"))
            .message(Message::Message(format!("runtimeClass.labels may not set {MANAGED_BY_LABEL}: shim-agent sets it to shim-agent on the RuntimeClasses it manages"))),
    )]
    #[schemars(schema_with = "label_map_schema")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Annotations of the RuntimeClass (a version, say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = keys_rule("runtimeClass.annotations", "annotation keys", true))]
    #[schemars(schema_with = "annotation_map_schema")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// `overhead` of a RuntimeClass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Overhead {
    /// Resource → quantity (`cpu: 250m`, `memory: 160Mi`), added to each pod's requests and
    /// limits. Resources: `cpu`, `memory`, `ephemeral-storage`, `hugepages-<size>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = Rule::new("self.all(k, k in ['cpu', 'memory', 'ephemeral-storage'] || (k.size() <= 64 && k.matches('^hugepages-[0-9]+[KMGTPE]?i?$')))")
            .message("runtimeClass.overhead.podFixed may name cpu, memory, ephemeral-storage and hugepages-<size>"),
        validation = Rule::new("self.all(k, isQuantity(string(self[k])) && !quantity(string(self[k])).isLessThan(quantity('0')))")
            .message("runtimeClass.overhead.podFixed values must be quantities of at least 0 (250m, 1, 160Mi, 1Gi)"),
    )]
    #[schemars(schema_with = "pod_fixed_schema")]
    pub pod_fixed: Option<BTreeMap<String, IntOrString>>,
}

/// `scheduling` of a RuntimeClass.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scheduling {
    /// Node label terms a pod of this class must also match (NFD's CPU-feature labels, a
    /// node pool's label). `containerd.x-k8s.io/<shim>` is not one of them: it is the
    /// Shim's own, always there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(
        validation = keys_rule("runtimeClass.scheduling.nodeSelector", "label keys", false),
        validation = label_values_rule("runtimeClass.scheduling.nodeSelector"),
    )]
    #[schemars(schema_with = "label_map_schema")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Tolerations added to every pod of this class (a dedicated, tainted node pool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(format!("self.all(t, self.filter(u, {}).size() == 1)", same_toleration("u", "t")))
        .message("runtimeClass.scheduling.tolerations may not list the same key, operator, value and effect twice"))]
    #[schemars(length(max = 32))]
    pub tolerations: Option<Vec<Toleration>>,
}

/// A toleration, as a pod's.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(
    validation = Rule::new("(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')")
        .message("a toleration without a key must have operator Exists (it then tolerates every taint)"),
    validation = Rule::new("!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''")
        .message("a toleration with operator Exists may not have a value"),
    validation = Rule::new("!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')")
        .message("a toleration's tolerationSeconds needs effect NoExecute"),
)]
pub struct Toleration {
    /// The taint key; empty (with operator Exists): every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(format!("self == '' || ({})", qualified("self", false)))
        .message("a toleration's key must be a label key: an optional DNS-1123 subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"))]
    #[schemars(length(max = 317))]
    pub key: Option<String>,
    /// `Equal` (the default) or `Exists`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "operator_schema")]
    pub operator: Option<TolerationOperator>,
    /// The taint value, with operator Equal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(format!("self.matches('{LABEL_VALUE}')"))
        .message("a toleration's value must be a label value: empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"))]
    #[schemars(length(max = 63))]
    pub value: Option<String>,
    /// The taint effect to tolerate; absent: every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "effect_schema")]
    pub effect: Option<TaintEffect>,
    /// With effect NoExecute: how long a pod stays once the taint is there; absent: forever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toleration_seconds: Option<i64>,
}

/// How a toleration matches a taint: `Equal`, the taint's key and value are the
/// toleration's; `Exists`, the taint's key is the toleration's (or any key, without one).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

/// What a taint does to pods that do not tolerate it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl RuntimeClassRef {
    /// `overhead.podFixed` as the RuntimeClass API's quantities (an integer `1` as `"1"`).
    pub fn pod_fixed(&self) -> Option<BTreeMap<String, Quantity>> {
        let fixed = self.overhead.as_ref()?.pod_fixed.as_ref()?;
        let quantity = |v: &IntOrString| match v {
            IntOrString::Int(i) => Quantity(i.to_string()),
            IntOrString::String(s) => Quantity(s.clone()),
        };
        Some(
            fixed
                .iter()
                .map(|(k, v)| (k.clone(), quantity(v)))
                .collect(),
        )
    }

    /// `scheduling.tolerations` as the RuntimeClass API's.
    pub fn tolerations(&self) -> Option<Vec<CoreToleration>> {
        let tolerations = self.scheduling.as_ref()?.tolerations.as_ref()?;
        Some(tolerations.iter().map(Toleration::to_core).collect())
    }

    /// The user's `scheduling.nodeSelector` terms (without the Shim's own label).
    pub fn node_selector_terms(&self) -> BTreeMap<String, String> {
        self.scheduling
            .as_ref()
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default()
    }
}

impl Toleration {
    fn to_core(&self) -> CoreToleration {
        CoreToleration {
            key: self.key.clone(),
            operator: self.operator.map(|o| o.as_str().to_string()),
            value: self.value.clone(),
            effect: self.effect.map(|e| e.as_str().to_string()),
            toleration_seconds: self.toleration_seconds,
        }
    }
}

impl TolerationOperator {
    pub fn as_str(self) -> &'static str {
        match self {
            TolerationOperator::Equal => "Equal",
            TolerationOperator::Exists => "Exists",
        }
    }
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            TaintEffect::NoSchedule => "NoSchedule",
            TaintEffect::PreferNoSchedule => "PreferNoSchedule",
            TaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Labels and nodeSelector terms: bounded (keys are checked by CEL, as a schema cannot bound
/// them), so that the rules stay within the API server's cost budget.
fn label_map_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 63},
    })
}

fn annotation_map_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 4096},
    })
}

/// The enums as plain bounded strings (no `null` among the values an error lists), so that
/// the uniqueness rule of the tolerations stays within the cost budget.
fn operator_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "string", "maxLength": 16, "enum": ["Equal", "Exists"]})
}

fn effect_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "maxLength": 16,
        "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"],
    })
}

/// `overhead.podFixed`: quantities, written as strings or integers (`cpu: 1`), as in the
/// RuntimeClass API.
fn pod_fixed_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "maxProperties": 8,
        "additionalProperties": {"x-kubernetes-int-or-string": true, "maxLength": 64},
    })
}
