//! The Shim API: the committed CRD and manifests match the types, and the CRD's validation
//! rules reject every bad Shim the issue names, with a message that says what is wrong.

use shim_agent::api::load::parse_shims;
use shim_agent::api::manifests::{crd_yaml, manifests_yaml};

use crate::support::option_paths;
use crate::support::shim_cases::{
    Judge, build, check_with, new_field_refusals, with_check, with_platforms,
};

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn committed(rel: &str) -> String {
    std::fs::read_to_string(format!("{MANIFEST_DIR}/{rel}")).unwrap_or_default()
}

#[test]
fn committed_crd_yaml_matches_the_types() {
    let generated = crd_yaml().unwrap();
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::write(format!("{MANIFEST_DIR}/deploy/crd.yaml"), &generated).unwrap();
    }
    assert!(
        committed("deploy/crd.yaml") == generated,
        "deploy/crd.yaml is stale: run `cargo run -- crd > deploy/crd.yaml` (or UPDATE_GENERATED=1 cargo test --test pure api::)"
    );
}

#[test]
fn committed_manifests_match_the_types() {
    let generated = manifests_yaml().unwrap();
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::write(format!("{MANIFEST_DIR}/deploy/manifests.yaml"), &generated).unwrap();
    }
    assert!(
        committed("deploy/manifests.yaml") == generated,
        "deploy/manifests.yaml is stale: run `cargo run -- manifests > deploy/manifests.yaml`"
    );
}

/// The kustomize base's files, by what their objects are: `shim-agent manifests` split by kind.
const KUSTOMIZE_FILES: [(&str, &[&str]); 5] = [
    ("crds.yaml", &["CustomResourceDefinition"]),
    ("namespace.yaml", &["Namespace"]),
    (
        "rbac.yaml",
        &[
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
        ],
    ),
    (
        "policies.yaml",
        &[
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ],
    ),
    ("coordinator.yaml", &["Deployment", "PodDisruptionBudget"]),
];

const KUSTOMIZATION: &str = "\
# shim-agent's cluster side as a kustomize base: the objects of `shim-agent manifests`
# (deploy/manifests.yaml), split by kind. Generated: tests/pure/api.rs checks every file here, and
# `UPDATE_GENERATED=1 cargo test --test pure api::` rewrites them; tests/kube/kustomize.rs checks that
# `kubectl kustomize` builds the same objects and that the API server takes them.
#   kubectl apply --server-side -k deploy/kustomize
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - crds.yaml
  - namespace.yaml
  - rbac.yaml
  - policies.yaml
  - coordinator.yaml
";

/// `manifests` split into the kustomize base's files, each document's text as it is in the
/// stream (every document starts with a `---` line; no other line of the stream is `---`).
fn kustomize_base(manifests: &str) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = KUSTOMIZE_FILES
        .iter()
        .map(|(f, _)| (f.to_string(), String::new()))
        .collect();
    let mut docs: Vec<String> = Vec::new();
    for line in manifests.split_inclusive('\n') {
        if line == "---\n" {
            docs.push(String::new());
        }
        docs.last_mut()
            .expect("the stream starts with ---")
            .push_str(line);
    }
    for doc in docs {
        let v: serde_yaml::Value = serde_yaml::from_str(&doc).unwrap();
        let kind = v["kind"].as_str().unwrap();
        let i = KUSTOMIZE_FILES
            .iter()
            .position(|(_, kinds)| kinds.contains(&kind))
            .unwrap_or_else(|| {
                panic!("no kustomize file for kind {kind}: add it to KUSTOMIZE_FILES")
            });
        files[i].1.push_str(&doc);
    }
    files.push(("kustomization.yaml".into(), KUSTOMIZATION.into()));
    files
}

#[test]
fn committed_kustomize_base_is_the_manifests_split_by_kind() {
    let manifests = manifests_yaml().unwrap();
    let files = kustomize_base(&manifests);
    let joined: String = files[..files.len() - 1]
        .iter()
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(
        joined.len(),
        manifests.len(),
        "every document lands in one file"
    );
    let dir = format!("{MANIFEST_DIR}/deploy/kustomize");
    if std::env::var_os("UPDATE_GENERATED").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in &files {
            std::fs::write(format!("{dir}/{name}"), text).unwrap();
        }
    }
    for (name, text) in &files {
        assert!(
            committed(&format!("deploy/kustomize/{name}")) == *text,
            "deploy/kustomize/{name} is stale: run `UPDATE_GENERATED=1 cargo test --test pure api::`"
        );
    }
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut expected: Vec<String> = files.into_iter().map(|(n, _)| n).collect();
    expected.sort();
    assert_eq!(present, expected, "deploy/kustomize holds other files");
}

#[test]
fn manifests_hold_crd_namespace_and_least_privilege_rbac() {
    let docs: Vec<serde_yaml::Value> =
        serde_yaml::Deserializer::from_str(&manifests_yaml().unwrap())
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
    let names: Vec<(String, String)> = docs
        .iter()
        .map(|d| {
            let field = |v: &serde_yaml::Value| v.as_str().unwrap_or_default().to_string();
            (field(&d["kind"]), field(&d["metadata"]["name"]))
        })
        .collect();
    let find = |kind: &str, name: &str| {
        let at = names
            .iter()
            .position(|(k, n)| k == kind && n == name)
            .unwrap_or_else(|| panic!("no {kind}/{name} in the manifests: {names:?}"));
        &docs[at]
    };
    // the CRDs come first, so that one `kubectl apply` creates them before anything uses them
    assert!(
        names[..3]
            .iter()
            .all(|(k, _)| k == "CustomResourceDefinition")
    );
    assert_eq!(names[3], ("Namespace".into(), "shim-agent-system".into()));
    for who in ["shim-agent", "shim-agent-coordinator"] {
        find("ServiceAccount", who);
        find("ClusterRoleBinding", who);
        find("RoleBinding", who);
        assert_eq!(
            find("Role", who)["metadata"]["namespace"],
            "shim-agent-system"
        );
    }
    for policy in [
        "shim-writes",
        "slot-writes",
        "node-writes",
        "runtimeclass-writes",
        "runtimeclass-shims",
    ] {
        let name = format!("shim-agent-{policy}");
        find("ValidatingAdmissionPolicy", &name);
        find("ValidatingAdmissionPolicyBinding", &name);
    }
    // no wildcard, nothing on secrets, and no verb that grants more rights
    let rbac: Vec<&serde_yaml::Value> = docs
        .iter()
        .filter(|d| {
            d["apiVersion"]
                .as_str()
                .unwrap_or_default()
                .starts_with("rbac.")
        })
        .collect();
    let text = serde_yaml::to_string(&rbac).unwrap();
    assert!(!text.contains("'*'") && !text.contains("\"*\""), "{text}");
    for forbidden in ["secrets", "configmaps", "escalate", "bind", "impersonate"] {
        assert!(!text.contains(forbidden), "RBAC mentions {forbidden}");
    }
    let verbs = |role: &serde_yaml::Value, res: &str| {
        role["rules"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|r| r["resources"][0] == res)
            .map(|r| r["verbs"].clone())
    };
    let list = |v: &[&str]| Some(serde_yaml::to_value(v).unwrap());
    // what every kubelet holds: reads, its own writes, and nothing that reaches another node's
    // containerd or a RuntimeClass
    let node = find("ClusterRole", "shim-agent");
    assert_eq!(verbs(node, "shims"), list(&["list", "watch"]));
    assert_eq!(verbs(node, "shims/status"), None);
    assert_eq!(verbs(node, "runtimeclasses"), None);
    // a kubelet's own Node and pods are the Node authorizer's to grant (it holds a kubelet to
    // its own); granted to system:nodes here, every kubelet would list every Node and pod
    assert_eq!(verbs(node, "nodes"), None);
    assert_eq!(verbs(node, "nodes/status"), None);
    assert_eq!(verbs(node, "pods"), None);
    let dedicated = find("ClusterRole", "shim-agent-dedicated-node");
    assert_eq!(verbs(dedicated, "nodes"), list(&["list", "watch", "patch"]));
    assert_eq!(verbs(dedicated, "nodes/status"), list(&["patch"]));
    assert_eq!(verbs(dedicated, "pods"), list(&["list", "watch"]));
    let binding = find("ClusterRoleBinding", "shim-agent-dedicated-node");
    let subjects = serde_yaml::to_string(&binding["subjects"]).unwrap();
    assert!(
        !subjects.contains("system:nodes") && subjects.contains("shim-agents"),
        "{subjects}"
    );
    assert_eq!(
        verbs(node, "shimextensions"),
        list(&["get", "list", "watch"])
    );
    assert_eq!(
        verbs(node, "shimextensions/status"),
        list(&["patch", "update"])
    );
    // a `service` reference is resolved with a get of the Service and a list of its
    // EndpointSlices, nothing else there
    assert_eq!(verbs(node, "services"), list(&["get"]));
    assert_eq!(verbs(node, "endpointslices"), list(&["list"]));
    // slots only through the namespaced Roles; nodes take and give back, the coordinator makes
    // and deletes them
    for who in [
        "shim-agent",
        "shim-agent-dedicated-node",
        "shim-agent-coordinator",
    ] {
        assert!(
            !serde_yaml::to_string(find("ClusterRole", who))
                .unwrap()
                .contains("leases")
        );
    }
    // update to take a slot, patch to renew, release or mark its own (tests/kube/slots.rs:
    // the admission policy holds both to the node's own slot)
    assert_eq!(
        verbs(find("Role", "shim-agent"), "shimleases"),
        list(&["get", "list", "watch", "update", "patch"])
    );
    let coordinator = find("ClusterRole", "shim-agent-coordinator");
    // startup taints off ready Nodes, held to that by the node-taints policy
    assert_eq!(
        verbs(coordinator, "nodes"),
        list(&["list", "watch", "patch"])
    );
    assert_eq!(verbs(coordinator, "nodes/status"), None);
    assert_eq!(
        verbs(coordinator, "runtimeclasses"),
        list(&["list", "watch", "create", "patch", "delete"])
    );
}

const GOOD: &str = r#"
apiVersion: containerd.x-k8s.io/v1alpha1
kind: Shim
metadata:
  name: spin-v0-15-1
spec:
  fetchStrategy:
    type: anonymousHttp
    anonHttp:
      location: https://example.com/shim.tar.gz
      sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0
  runtimeClass:
    name: spin
  rolloutStrategy:
    type: rolling
    rolling:
      maxUpdate: 5
"#;

fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "test bug: {from:?} not in GOOD");
    GOOD.replacen(from, to, 1)
}

fn rejected(yaml: &str) -> String {
    match parse_shims(yaml, "shim.yaml") {
        Ok(s) => panic!("accepted a bad Shim: {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_good_shim_parses_and_defaults_its_handler_to_the_name() {
    let shims = parse_shims(GOOD, "shim.yaml").unwrap();
    assert_eq!(shims.len(), 1);
    assert_eq!(shims[0].handler(), "spin-v0-15-1");
    let example = std::fs::read_to_string(format!("{MANIFEST_DIR}/examples/shim.yaml")).unwrap();
    let ex = parse_shims(&example, "examples/shim.yaml").unwrap();
    assert_eq!(ex[0].handler(), "spin-v0-15-1");
}

#[test]
fn bad_names_are_rejected() {
    let e = rejected(&with("name: spin-v0-15-1", "name: Spin_Shim"));
    assert!(e.contains("metadata.name must be a DNS-1123 label"), "{e}");
    let long = "a".repeat(64);
    let e = rejected(&with("name: spin-v0-15-1", &format!("name: {long}")));
    assert!(e.contains("metadata.name must be a DNS-1123 label"), "{e}");
    let e = rejected(&with(
        "name: spin\n",
        "name: spin\n    handler: Bad.Handler\n",
    ));
    assert!(
        e.contains("runtimeClass.handler must be a DNS-1123 label"),
        "{e}"
    );
    let e = rejected(&with(
        "name: spin\n",
        &format!("name: spin\n    handler: {long}\n"),
    ));
    assert!(e.contains("runtimeClass.handler"), "{e}");
    // 63 characters is fine
    let ok = with(
        "name: spin\n",
        &format!("name: spin\n    handler: {}\n", &long[..63]),
    );
    parse_shims(&ok, "shim.yaml").unwrap();
}

#[test]
fn exactly_one_of_location_and_platforms() {
    let both = with(
        "  runtimeClass:",
        "    platforms:\n      - {os: linux, arch: arm64, location: https://x/a.tgz}\n  runtimeClass:",
    );
    let e = rejected(&both);
    assert!(
        e.contains("exactly one of anonHttp.location or platforms"),
        "{e}"
    );
    let neither = with("      location: https://example.com/shim.tar.gz\n", "");
    let e = rejected(&neither);
    assert!(
        e.contains("exactly one of anonHttp.location or platforms"),
        "{e}"
    );
    let platforms_only = with(
        "    anonHttp:\n      location: https://example.com/shim.tar.gz\n      sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0\n",
        "    platforms:\n      - {os: linux, arch: arm64, location: https://x/a.tgz}\n",
    );
    parse_shims(&platforms_only, "shim.yaml").unwrap();
}

#[test]
fn malformed_sha256_and_locations_are_rejected() {
    for bad in [
        "3f5a",
        "zz5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0",
        "sha256:3f5a",
    ] {
        let e = rejected(&with(
            "sha256: 3f5a2f1b2e9e0f4ad7d3c8a57b3b1f65f9d2b0b6a1f0c2e4d6b8a0c2e4f6a8b0",
            &format!("sha256: {bad}"),
        ));
        assert!(
            e.contains("sha256 must be 64 hexadecimal characters"),
            "{bad}: {e}"
        );
    }
    let e = rejected(&with(
        "https://example.com/shim.tar.gz",
        "ftp://example.com/shim.tar.gz",
    ));
    assert!(
        e.contains("location must be an http://, https:// or file:/// URL"),
        "{e}"
    );
}

#[test]
fn max_update_must_be_at_least_one_or_one_to_a_hundred_percent() {
    for bad in [
        "0", "-1", "\"0%\"", "\"101%\"", "\"150%\"", "\"ten\"", "\"5\"",
    ] {
        let e = rejected(&with("maxUpdate: 5", &format!("maxUpdate: {bad}")));
        assert!(
            e.contains("maxUpdate must be an integer of at least 1 or a percentage"),
            "{bad}: {e}"
        );
    }
    for good in ["1", "1000", "\"1%\"", "\"10%\"", "\"100%\""] {
        parse_shims(
            &with("maxUpdate: 5", &format!("maxUpdate: {good}")),
            "shim.yaml",
        )
        .unwrap_or_else(|e| panic!("{good}: {e}"));
    }
}

#[test]
fn unknown_fetch_strategy_and_unknown_fields_are_rejected() {
    let e = rejected(&with("type: anonymousHttp", "type: ftp"));
    assert!(
        e.contains("unknown variant `ftp`") && e.contains("anonymousHttp"),
        "{e}"
    );
    let e = rejected(&with("type: anonymousHttp", "type: oci"));
    assert!(
        e.contains("fetchStrategy of type oci needs fetchStrategy.oci.reference"),
        "{e}"
    );
    let e = rejected(&with(
        "  runtimeClass:",
        "  nodeSelectr: {}\n  runtimeClass:",
    ));
    assert!(e.contains("nodeSelectr"), "{e}");
}

#[test]
fn a_document_that_is_not_a_shim_is_rejected() {
    let e = rejected("apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n");
    assert!(e.contains("is not a Shim") && e.contains("Pod"), "{e}");
    let e = rejected("just: [unclosed");
    assert!(e.contains("not valid YAML"), "{e}");
    let e = rejected("");
    assert!(e.contains("no Shim"), "{e}");
}

#[test]
fn a_binary_and_option_paths_that_name_relative_files_inside_the_artifact_parse() {
    let runtime = |body: &str| {
        with(
            "  rolloutStrategy:",
            &format!("  runtime:\n{body}  rolloutStrategy:"),
        )
    };
    let good = runtime(
        "    binary: containerd-shim-runc-v2\n    optionPaths: {BinaryName: runsc, ConfigPath: ./etc/runsc.toml}\n",
    );
    let shims = parse_shims(&good, "shim.yaml").unwrap();
    let paths = shims[0].spec.runtime.as_ref().unwrap().option_paths.clone();
    assert_eq!(paths.unwrap()["BinaryName"], "runsc");
    let edges = parse_shims(
        &option_paths::shim_yaml("op-good", option_paths::GOOD),
        "x.yaml",
    )
    .unwrap_or_else(|e| panic!("the good runtime settings are refused: {e}"));
    let paths = edges[0].spec.runtime.as_ref().unwrap().option_paths.clone();
    assert_eq!(paths.unwrap()["_Extra-1"], "a..b/c..");
}

/// The same cases as tests/kube/api.rs gives the real API server.
#[test]
fn each_bad_runtime_binary_or_option_path_is_refused_with_its_rule_message() {
    for (name, runtime, message) in option_paths::bad() {
        let e = match parse_shims(&option_paths::shim_yaml(name, &runtime), "shim.yaml") {
            Ok(_) => panic!("accepted {name}: {runtime}"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(message), "{name}: expected {message:?} in:\n{e}");
    }
}

#[test]
fn each_bad_containerd_range_or_check_container_is_refused_with_its_rule_message() {
    for (what, yaml, message) in new_field_refusals(&with, Judge::Node) {
        let e = rejected(&yaml);
        assert!(e.contains(message), "{what}: expected {message:?} in:\n{e}");
    }
}

#[test]
fn the_documented_containerd_ranges_and_check_container_are_accepted() {
    for range in [
        "\"<2.3\"",
        "\">=1.6, <2.3\"",
        "\">=2.3\"",
        "\"=2.2\"",
        "\"<=2.2.7\"",
        "\" > 1.6 ,<2 \"",
    ] {
        let yaml = with_platforms(&with, &[&build("amd64", Some(range))]);
        let shims = parse_shims(&yaml, "shim.yaml").unwrap_or_else(|e| panic!("{range}: {e}"));
        let platforms = shims[0].spec.fetch_strategy.platforms.clone().unwrap();
        assert_eq!(
            format!("\"{}\"", platforms[0].containerd.as_deref().unwrap()),
            range
        );
    }
    // one build per containerd range for the same os/arch, and a range-less one beside them
    let builds = with_platforms(
        &with,
        &[
            &build("amd64", Some("\"<2.3\"")),
            &build("amd64", Some("\">=2.3\"")),
            &build("amd64", None),
            &build("x86_64", None),
        ],
    );
    parse_shims(&builds, "shim.yaml").unwrap_or_else(|e| panic!("{e}"));
    let documented = with_check(
        &with,
        "{image: docker.io/library/shim-agent-wasm-hello:v1, command: [\"/hello.wasm\"], args: [], success: {exitCode: 0, outputContains: \"hello from wasm\"}, timeoutSeconds: 60}",
    );
    let shims = parse_shims(&documented, "shim.yaml").unwrap_or_else(|e| panic!("{e}"));
    let check = shims[0]
        .spec
        .check
        .as_ref()
        .unwrap()
        .container
        .clone()
        .unwrap();
    assert_eq!(check.output_contains(), Some("hello from wasm"));
    assert_eq!(check.timeout(), std::time::Duration::from_secs(60));
    // the defaults: exit code 0, no output required, 60 s
    let bare = with_check(&with, "{image: hello:v1, command: [/hello.wasm]}");
    let shims = parse_shims(&bare, "shim.yaml").unwrap_or_else(|e| panic!("{e}"));
    let check = shims[0]
        .spec
        .check
        .as_ref()
        .unwrap()
        .container
        .clone()
        .unwrap();
    assert_eq!(check.exit_code(), 0);
    assert_eq!(check.output_contains(), None);
    assert_eq!(check.timeout(), std::time::Duration::from_secs(60));
    let other = with_check(&with, &check_with("success", "{exitCode: 3}"));
    let shims = parse_shims(&other, "shim.yaml").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        shims[0]
            .spec
            .check
            .as_ref()
            .unwrap()
            .container
            .as_ref()
            .unwrap()
            .exit_code(),
        3
    );
    // the edges of each bound
    for (field, value) in [
        ("command", format!("[{}]", vec!["x"; 64].join(", "))),
        ("args", format!("[\"\", {}]", vec!["x"; 63].join(", "))),
        ("image", format!("\"{}\"", "a".repeat(4096))),
        ("success", "{exitCode: 255}".to_string()),
        ("success", "{}".to_string()),
        ("timeoutSeconds", "1".to_string()),
        ("timeoutSeconds", "600".to_string()),
    ] {
        let yaml = with_check(&with, &check_with(field, &value));
        parse_shims(&yaml, "shim.yaml").unwrap_or_else(|e| panic!("{field}: {e}"));
    }
    // no check at all, and a check without a container
    parse_shims(GOOD, "shim.yaml").unwrap();
    let empty = with("  rolloutStrategy:", "  check: {}\n  rolloutStrategy:");
    parse_shims(&empty, "shim.yaml").unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_example_is_a_shim_the_node_accepts() {
    let dir = format!("{MANIFEST_DIR}/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            let text = std::fs::read_to_string(&path).unwrap();
            parse_shims(&text, &path.display().to_string())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            seen += 1;
        }
    }
    assert!(seen >= 2, "examples/ holds {seen} Shim files");
    let text = std::fs::read_to_string(format!("{dir}/shim-containerd-builds.yaml")).unwrap();
    let shim = &parse_shims(&text, "shim-containerd-builds.yaml").unwrap()[0];
    let ranges: Vec<_> = shim
        .spec
        .fetch_strategy
        .platforms
        .iter()
        .flatten()
        .map(|p| (p.arch.as_str(), p.containerd.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        ranges,
        [
            ("x86_64", "<2.3"),
            ("x86_64", ">=2.3"),
            ("aarch64", "<2.3"),
            ("aarch64", ">=2.3")
        ]
    );
    let check = shim
        .spec
        .check
        .as_ref()
        .and_then(|c| c.container.as_ref())
        .unwrap();
    assert_eq!(check.command, ["/hello.wasm"]);
}

#[test]
fn the_signed_example_names_runwasis_layout_and_identity() {
    let dir = format!("{MANIFEST_DIR}/examples");
    let text = std::fs::read_to_string(format!("{dir}/shim-signed.yaml")).unwrap();
    let shim = &parse_shims(&text, "shim-signed.yaml").unwrap()[0];
    let sig = shim.spec.signature.as_ref().unwrap();
    assert_eq!(
        (
            sig.signed_file.as_deref(),
            sig.signature.as_deref(),
            sig.certificate.as_deref()
        ),
        (
            Some("containerd-shim-wasmtime-v1"),
            Some("containerd-shim-wasmtime-v1.sig"),
            Some("containerd-shim-wasmtime-v1.pem")
        )
    );
    let id = &sig.identities.as_ref().unwrap()[0];
    assert_eq!(
        id.identity.as_deref(),
        Some(
            "https://github.com/containerd/runwasi/.github/workflows/action-build.yml@refs/heads/main"
        )
    );
    assert_eq!(id.issuer, "https://token.actions.githubusercontent.com");
}

#[test]
fn the_oci_signed_example_finds_its_signature_in_the_registry_of_a_pinned_artifact() {
    let dir = format!("{MANIFEST_DIR}/examples");
    let text = std::fs::read_to_string(format!("{dir}/shim-signed-oci.yaml")).unwrap();
    let shim = &parse_shims(&text, "shim-signed-oci.yaml").unwrap()[0];
    let sig = shim.spec.signature.as_ref().unwrap();
    assert_eq!(sig.from, shim_agent::api::signature::MaterialFrom::Oci);
    assert_eq!(
        (&sig.signed_file, &sig.signature, &sig.bundle),
        (&None, &None, &None)
    );
    let reference = &shim.spec.fetch_strategy.oci.as_ref().unwrap().reference;
    assert!(reference.contains("@sha256:"), "{reference}");
}
