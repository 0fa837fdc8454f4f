//! `spec.runtimeClass` with every scheduling field, good and bad, for both sides that judge a
//! Shim: the node's own check of a Shim file (`parse_shims`, client-side CEL; tests/pure) and
//! the real API server (`kubectl apply --dry-run=server`; tests/kube). Each bad case names
//! the message both must give.

/// A Shim `name` whose `runtimeClass` block is `runtime_class` (YAML flow style).
pub fn shim_yaml(name: &str, runtime_class: &str) -> String {
    format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata:\n  name: {name}\nspec:\n  fetchStrategy:\n    type: anonymousHttp\n    anonHttp:\n      location: https://example.com/shim.tar.gz\n      sha256: {}\n  runtimeClass: {runtime_class}\n",
        "3f".repeat(32)
    )
}

/// Every field, as a sandbox's class has them: overhead, NFD-style nodeSelector terms,
/// tolerations of each form, labels and a version annotation.
pub const FULL: &str = r#"{name: rc-full, handler: runsc, overhead: {podFixed: {cpu: 250m, memory: 160Mi, ephemeral-storage: 1, hugepages-2Mi: 0}}, scheduling: {nodeSelector: {"feature.node.kubernetes.io/cpu-cpuid.VMX": "true", pool: sandbox}, tolerations: [{key: sandbox, value: "true", effect: NoSchedule}, {key: pool, operator: Exists}, {operator: Exists, effect: NoExecute, tolerationSeconds: 30}]}, labels: {team: infra, "example.com/tier": ""}, annotations: {"containerd.x-k8s.io/version": "20260101.0", "Example.COM/Note": "any text: ü🎉"}}"#;

/// (the Shim's name, its `runtimeClass`, the message that refuses it).
pub const BAD: &[(&str, &str, &str)] = &[
    (
        "rc-managed",
        r#"{name: x, labels: {app.kubernetes.io/managed-by: me}}"#,
        "runtimeClass.labels may not set app.kubernetes.io/managed-by",
    ),
    (
        "rc-label-key",
        r#"{name: x, labels: {"-bad": "v"}}"#,
        "runtimeClass.labels keys must be label keys",
    ),
    (
        "rc-label-value",
        r#"{name: x, labels: {k: "a b"}}"#,
        "runtimeClass.labels values must be label values",
    ),
    (
        "rc-annotation-key",
        r#"{name: x, annotations: {"bad key": "v"}}"#,
        "runtimeClass.annotations keys must be annotation keys",
    ),
    (
        "rc-own-label",
        r#"{name: x, scheduling: {nodeSelector: {containerd.x-k8s.io/rc-own-label: "false"}}}"#,
        "runtimeClass.scheduling.nodeSelector may not name the Shim's own node label",
    ),
    (
        "rc-selector-value",
        r#"{name: x, scheduling: {nodeSelector: {pool: "a/b"}}}"#,
        "runtimeClass.scheduling.nodeSelector values must be label values",
    ),
    (
        "rc-overhead-resource",
        r#"{name: x, overhead: {podFixed: {nvidia.com/gpu: 1}}}"#,
        "runtimeClass.overhead.podFixed may name cpu, memory, ephemeral-storage and hugepages-<size>",
    ),
    (
        "rc-overhead-quantity",
        r#"{name: x, overhead: {podFixed: {cpu: lots}}}"#,
        "runtimeClass.overhead.podFixed values must be quantities of at least 0",
    ),
    (
        "rc-overhead-negative",
        r#"{name: x, overhead: {podFixed: {memory: "-1Mi"}}}"#,
        "runtimeClass.overhead.podFixed values must be quantities of at least 0",
    ),
    (
        "rc-toleration-twice",
        r#"{name: x, scheduling: {tolerations: [{key: a, value: b, effect: NoSchedule}, {key: a, value: b, effect: NoSchedule}]}}"#,
        "runtimeClass.scheduling.tolerations may not list the same key, operator, value and effect twice",
    ),
    (
        "rc-toleration-nokey",
        r#"{name: x, scheduling: {tolerations: [{value: b}]}}"#,
        "a toleration without a key must have operator Exists",
    ),
    (
        "rc-toleration-exists",
        r#"{name: x, scheduling: {tolerations: [{key: a, operator: Exists, value: b}]}}"#,
        "a toleration with operator Exists may not have a value",
    ),
    (
        "rc-toleration-seconds",
        r#"{name: x, scheduling: {tolerations: [{key: a, effect: NoSchedule, tolerationSeconds: 5}]}}"#,
        "a toleration's tolerationSeconds needs effect NoExecute",
    ),
    (
        "rc-toleration-key",
        r#"{name: x, scheduling: {tolerations: [{key: "bad key!", operator: Exists}]}}"#,
        "a toleration's key must be a label key",
    ),
];
