//! `spec.runtime.binary` and `spec.runtime.optionPaths`, good and bad, for both sides that
//! judge a Shim: the node's own check of a Shim file (`parse_shims`, client-side CEL;
//! tests/pure/api.rs) and the real API server (`kubectl apply --dry-run=server`;
//! tests/kube/api.rs). Each bad case names the message both must give.

/// A Shim `name` whose `runtime` block is `runtime` (YAML flow style).
pub fn shim_yaml(name: &str, runtime: &str) -> String {
    format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata:\n  name: {name}\nspec:\n  fetchStrategy:\n    type: anonymousHttp\n    anonHttp:\n      location: https://example.com/shim.tar.gz\n      sha256: {}\n  runtimeClass: {{name: {name}}}\n  runtime: {runtime}\n",
        "3f".repeat(32)
    )
}

/// A binary by relative path and option paths at the edges of what is allowed: a key that
/// starts with `_`, one with a digit first, a `..` inside a name (not a path component), a
/// leading `./`.
pub const GOOD: &str = r#"{binary: bin/containerd-shim-runc-v2, optionPaths: {BinaryName: runsc, ConfigPath: ./etc/runsc.toml, _Extra-1: "a..b/c..", 9p: share/x}}"#;

const KEYS: &str = "runtime.optionPaths keys must be option names";
const VALUES: &str = "runtime.optionPaths values must be relative paths inside the artifact";
const BINARY: &str = "runtime.binary must be a file name or a relative path inside the artifact";

/// (the Shim's name, its `runtime`, the message that refuses it).
pub fn bad() -> Vec<(&'static str, String, &'static str)> {
    let long_key = "K".repeat(129);
    vec![
        (
            "op-key-space",
            r#"{optionPaths: {"bad key": runsc}}"#.into(),
            KEYS,
        ),
        (
            "op-key-dash",
            r#"{optionPaths: {"-Config": runsc}}"#.into(),
            KEYS,
        ),
        (
            "op-key-dot",
            r#"{optionPaths: {Config.Path: runsc}}"#.into(),
            KEYS,
        ),
        ("op-key-empty", r#"{optionPaths: {"": runsc}}"#.into(), KEYS),
        (
            "op-key-long",
            format!("{{optionPaths: {{{long_key}: runsc}}}}"),
            KEYS,
        ),
        (
            "op-value-empty",
            r#"{optionPaths: {ConfigPath: ""}}"#.into(),
            VALUES,
        ),
        (
            "op-value-absolute",
            "{optionPaths: {ConfigPath: /etc/runsc.toml}}".into(),
            VALUES,
        ),
        (
            "op-value-up",
            "{optionPaths: {ConfigPath: ../runsc.toml}}".into(),
            VALUES,
        ),
        (
            "op-value-up-inside",
            "{optionPaths: {ConfigPath: a/../../b}}".into(),
            VALUES,
        ),
        (
            "op-value-up-last",
            "{optionPaths: {ConfigPath: a/..}}".into(),
            VALUES,
        ),
        (
            "op-value-dotdot",
            r#"{optionPaths: {ConfigPath: ".."}}"#.into(),
            VALUES,
        ),
        (
            "rb-absolute",
            "{binary: /usr/bin/containerd-shim-runc-v2}".into(),
            BINARY,
        ),
        (
            "rb-up",
            "{binary: ../containerd-shim-runc-v2}".into(),
            BINARY,
        ),
        (
            "rb-up-inside",
            "{binary: bin/../../containerd-shim-runc-v2}".into(),
            BINARY,
        ),
        ("rb-empty", r#"{binary: ""}"#.into(), BINARY),
    ]
}
