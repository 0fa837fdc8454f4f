//! The kustomize base (`deploy/kustomize/`) is what `shim-agent manifests` prints: `kubectl
//! kustomize` builds the same objects (compared parsed, in any order), and the real API server
//! takes them with `kubectl apply -k`, client-side (Argo CD's default) and server-side (Flux's).
//! tests/pure/api.rs checks that the committed files are the manifests split by kind.

use serde_json::Value;
use shim_agent::api::manifests::manifests_yaml;

use crate::support::kube::{KubeEnv, kube_env};

const BASE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kustomize");

/// The objects of a YAML stream, each as canonical JSON text (keys sorted by serde_json's map;
/// a float with an integral value written as an integer, as kustomize writes `30.0`), sorted.
fn objects(stream: &str) -> Vec<String> {
    let mut out: Vec<String> = serde_yaml::Deserializer::from_str(stream)
        .map(|d| serde::Deserialize::deserialize(d).expect("a YAML document"))
        .filter(|v: &Value| !v.is_null())
        .map(|v| normalized(v).to_string())
        .collect();
    out.sort();
    out
}

fn normalized(v: Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
        Value::Object(m) => {
            let m = m.into_iter().map(|(k, v)| (k, normalized(v)));
            Value::Object(m.collect())
        }
        other => other,
    }
}

/// "Kind/name" of an object in canonical JSON text.
fn label(object: &str) -> String {
    let v: Value = serde_json::from_str(object).unwrap();
    format!(
        "{}/{}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn kubectl(env: &KubeEnv, args: &[&str]) -> String {
    let (ok, out) = env.kubectl(args);
    assert!(ok, "kubectl {}: {out}", args.join(" "));
    out
}

#[test]
fn kubectl_kustomize_builds_the_objects_of_shim_agent_manifests() {
    let Some(env) = kube_env() else { return };
    let built = objects(&kubectl(env, &["kustomize", BASE]));
    let printed = objects(&manifests_yaml().unwrap());
    let only_built: Vec<String> = built
        .iter()
        .filter(|o| !printed.contains(o))
        .map(|o| label(o))
        .collect();
    let only_printed: Vec<String> = printed
        .iter()
        .filter(|o| !built.contains(o))
        .map(|o| label(o))
        .collect();
    assert!(
        only_built.is_empty() && only_printed.is_empty() && built.len() == printed.len(),
        "deploy/kustomize differs from `shim-agent manifests` (UPDATE_GENERATED=1 cargo test --test pure api::): \
         only in the base: {only_built:?}; only in the manifests: {only_printed:?}"
    );
    assert!(built.len() > 10, "{} objects", built.len());
}

#[test]
fn the_api_server_takes_the_kustomize_base_with_kubectl_apply_k() {
    let Some(env) = kube_env() else { return };
    for mode in [
        &["apply", "-k", BASE, "--dry-run=server"][..],
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            BASE,
            "--dry-run=server",
        ],
    ] {
        let out = kubectl(env, mode);
        for kind in [
            "customresourcedefinition.apiextensions.k8s.io/shims.containerd.x-k8s.io",
            "namespace/shim-agent-system",
            "validatingadmissionpolicy.admissionregistration.k8s.io/",
        ] {
            assert!(
                out.contains(kind),
                "kubectl {}: no {kind} in {out}",
                mode.join(" ")
            );
        }
    }
}
