//! The autoscaling examples in `docs/examples/` say what the agent does: the NodePool's
//! startup taint is one `kubernetes.startup-taint` accepts, its nodes carry the label the
//! Shim's nodeSelector selects and the Shim's own node label, and the NodeReadinessRule waits
//! on the condition the agent writes.

use shim_agent::cluster::node_label;
use shim_agent::cluster::readiness::{SHIMS_READY, StartupTaint};

fn docs(file: &str) -> Vec<serde_yaml::Value> {
    let path = format!("{}/docs/examples/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect()
}

fn kind<'a>(docs: &'a [serde_yaml::Value], kind: &str) -> &'a serde_yaml::Value {
    docs.iter().find(|d| d["kind"] == kind).unwrap()
}

#[test]
fn the_karpenter_nodepool_carries_a_startup_taint_the_agent_accepts_and_the_shims_labels() {
    let d = docs("karpenter-nodepool.yaml");
    let pool = kind(&d, "NodePool");
    let shim = kind(&d, "Shim");
    let template = &pool["spec"]["template"];
    let taint = &template["spec"]["startupTaints"][0];
    let text = format!(
        "{}:{}",
        taint["key"].as_str().unwrap(),
        taint["effect"].as_str().unwrap()
    );
    StartupTaint::parse(&text).unwrap();
    let labels = template["metadata"]["labels"].as_mapping().unwrap();
    let name = shim["metadata"]["name"].as_str().unwrap();
    let own = serde_yaml::Value::from(node_label(name));
    assert_eq!(labels[&own], "true", "the Shim's node label");
    for (k, v) in shim["spec"]["nodeSelector"].as_mapping().unwrap() {
        assert_eq!(labels.get(k), Some(v), "the Shim's nodeSelector {k:?}");
    }
}

#[test]
fn the_node_readiness_rule_waits_on_the_agents_condition() {
    let d = docs("node-readiness-rule.yaml");
    let rule = kind(&d, "NodeReadinessRule");
    let c = &rule["spec"]["conditions"][0];
    assert_eq!(c["type"], SHIMS_READY);
    assert_eq!(c["requiredStatus"], "True");
}
