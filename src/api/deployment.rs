//! The coordinator as a Deployment (docs/design.md §6): two replicas of `shim-agent
//! coordinate` (its election picks one), on the coordinator's ServiceAccount, non-root with a
//! read-only root and no capabilities, probed on `/healthz` and `/readyz`, and a
//! PodDisruptionBudget that keeps one up through a node drain. The image is the one
//! `scripts/image` builds from the release binary; a cluster that pulls it from its own
//! registry renames it (`kustomize edit set image`).

use serde_json::{Value, json};

use super::names::NAMESPACE;
use super::rbac::COORDINATOR_SERVICE_ACCOUNT;

/// The Deployment's (and its PodDisruptionBudget's) name.
pub const COORDINATOR_DEPLOYMENT: &str = "shim-agent-coordinator";
/// The image `scripts/image` builds, as the manifests name it.
pub const COORDINATOR_IMAGE: &str = concat!("localhost/shim-agent:", env!("CARGO_PKG_VERSION"));
/// Where the coordinator serves `/metrics`, `/healthz` and `/readyz` in its pod.
pub const COORDINATOR_PORT: u16 = 8080;
/// The user the image runs as (no shell, no home: `nonroot` by convention).
pub const COORDINATOR_UID: u32 = 65532;

fn labels() -> Value {
    json!({
        "app.kubernetes.io/name": "shim-agent",
        "app.kubernetes.io/component": "coordinator",
    })
}

fn metadata() -> Value {
    json!({"name": COORDINATOR_DEPLOYMENT, "namespace": NAMESPACE, "labels": labels()})
}

/// The coordinator's Deployment.
pub fn coordinator_deployment() -> Value {
    let probe = |path: &str, period: u32| json!({"httpGet": {"path": path, "port": "http"}, "periodSeconds": period, "failureThreshold": 3});
    json!({
        "metadata": metadata(),
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels()},
            "template": {
                "metadata": {"labels": labels()},
                "spec": {
                    "serviceAccountName": COORDINATOR_SERVICE_ACCOUNT,
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": COORDINATOR_UID,
                        "runAsGroup": COORDINATOR_UID,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    // the replicas on different nodes where there are several
                    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": labels()},
                        },
                    }]}},
                    "containers": [{
                        "name": "coordinator",
                        "image": COORDINATOR_IMAGE,
                        "args": [
                            "coordinate",
                            "--listen", format!("0.0.0.0:{COORDINATOR_PORT}"),
                            "--identity", "$(POD_NAME)",
                        ],
                        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "ports": [{"name": "http", "containerPort": COORDINATOR_PORT}],
                        "livenessProbe": probe("/healthz", 10),
                        "readinessProbe": probe("/readyz", 5),
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "32Mi"},
                            "limits": {"memory": "256Mi"},
                        },
                        "securityContext": {
                            "allowPrivilegeEscalation": false,
                            "readOnlyRootFilesystem": true,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }],
                },
            },
        },
    })
}

/// At most one replica away at a time through voluntary disruptions (a drain).
pub fn coordinator_disruption_budget() -> Value {
    json!({
        "metadata": metadata(),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels()}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_coordinator_runs_unprivileged_on_its_own_account_and_is_probed() {
        let d = coordinator_deployment();
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], COORDINATOR_SERVICE_ACCOUNT);
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
        let c = &pod["containers"][0];
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(d["spec"]["replicas"], 2);
        assert_eq!(
            d["spec"]["selector"]["matchLabels"],
            d["spec"]["template"]["metadata"]["labels"]
        );
        let pdb = coordinator_disruption_budget();
        assert_eq!(pdb["spec"]["selector"], d["spec"]["selector"]);
    }
}
