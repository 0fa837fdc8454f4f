//! The agent's and the coordinator's decisions as pure functions: targeting, the node plan,
//! labels, the per-node state, the status and the backoff. No cluster, no host.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use shim_agent::api::Shim;
use shim_agent::cluster::coordinator::status::{NodeView, compute_status};
use shim_agent::cluster::nodestate::{
    NodePhase, NodeStates, RetainedNote, ShimNodeState, node_patch, parse_states, states_wanted,
};
use shim_agent::cluster::target::{Inputs, PodUse, labels_wanted, plan_node, targets};
use shim_agent::reconciler::memory::FailureNote;
use shim_agent::retry::backoff;
use shim_agent::state::{
    InstalledShim, NodeState, Origin, RETAINED_TASKS_LISTED, RetainedVersion, ShimState,
};
use shim_agent::txn::Change;

use crate::support::shim_builder::ShimBuilder;

fn shim(name: &str, selector: &[(&str, &str)]) -> Shim {
    selector
        .iter()
        .fold(ShimBuilder::new(name), |b, (k, v)| b.node_selector(k, v))
        .generation(1)
        .artifact("https://e.com/a", &"a".repeat(64))
        .runtime_class(&format!("rc-{name}"))
        .build()
}

fn record(name: &str, origin: Origin, state: ShimState) -> InstalledShim {
    InstalledShim {
        name: name.into(),
        handler: name.into(),
        runtime_type: "io.containerd.x.v2".into(),
        artifact_sha256: "d".repeat(64),
        source: "https://e.com/a".into(),
        binary: format!("/opt/shim-agent/shims/{name}/d/b"),
        spec_hash: "old".into(),
        config_files: vec![],
        state,
        origin,
        runtime_class: Some(format!("rc-{name}")),
        installed_at: 1,
        shim_version: None,
        insecure_source: None,
        signature: None,
        check: None,
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn names(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Install(s) => format!("install {}", s.name()),
            Change::InstallAs(s, o) => format!("install {} {o:?}", s.name()),
            Change::Uninstall(n) => format!("uninstall {n}"),
        })
        .collect()
}

#[test]
fn a_selector_must_match_every_label_and_no_selector_skips_control_planes() {
    let worker = labels(&[("wasm", "true")]);
    let cp = labels(&[("node-role.kubernetes.io/control-plane", "")]);
    assert!(targets(&shim("a", &[("wasm", "true")]), &worker));
    assert!(!targets(
        &shim("a", &[("wasm", "true"), ("gpu", "yes")]),
        &worker
    ));
    assert!(targets(&shim("a", &[]), &worker));
    assert!(!targets(&shim("a", &[]), &cp));
    let mut deleting = shim("a", &[]);
    deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
    assert!(
        !targets(&deleting, &worker),
        "a Shim being deleted targets nothing"
    );
}

#[test]
fn the_plan_installs_what_is_wanted_keeps_the_owners_and_waits_for_pods() {
    let node = labels(&[("wasm", "true")]);
    let cluster = vec![
        shim("wanted", &[("wasm", "true")]),
        shim("elsewhere", &[("wasm", "false")]),
        shim("both", &[]),
        shim("held", &[]),
    ];
    let statics = vec![shim("both", &[])];
    let mut state = NodeState::default();
    for (n, o) in [
        ("elsewhere", Origin::Cluster),
        ("gone", Origin::Cluster),
        ("offline", Origin::Offline),
        ("old-static", Origin::Static),
    ] {
        state
            .shims
            .insert(n.into(), record(n, o, ShimState::Installed));
    }
    let pods = vec![
        PodUse {
            name: "default/user".into(),
            runtime_class: Some("rc-elsewhere".into()),
            finished: false,
        },
        PodUse {
            name: "default/done".into(),
            runtime_class: Some("rc-gone".into()),
            finished: true,
        },
    ];
    let held: BTreeSet<String> = ["held".to_string()].into();
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &statics,
        statics_ok: true,
        state: &state,
        pods: &pods,
        held: &held,
    };
    let plan = plan_node(&inputs);
    assert_eq!(
        names(&plan.changes),
        [
            "install both Static",
            "install wanted Cluster",
            "uninstall gone",
            "uninstall old-static"
        ]
    );
    assert_eq!(plan.conflicts, ["both"]);
    assert_eq!(
        plan.blocked,
        BTreeMap::from([("elsewhere".to_string(), vec!["default/user".to_string()])])
    );
    let unlabel: Vec<&str> = plan.unlabel.iter().map(String::as_str).collect();
    assert_eq!(
        unlabel,
        ["elsewhere", "gone", "old-static"],
        "labels go first, blocked too"
    );

    // a shims.d file that does not parse: static installs are never removed
    let broken = Inputs {
        statics_ok: false,
        ..inputs
    };
    assert!(!names(&plan_node(&broken).changes).contains(&"uninstall old-static".to_string()));
}

#[test]
fn a_label_needs_a_verified_install_with_the_same_handler() {
    let node = labels(&[]);
    let cluster = vec![shim("ok", &[]), shim("pending", &[]), shim("failed", &[])];
    let mut state = NodeState::default();
    state.shims.insert(
        "ok".into(),
        record("ok", Origin::Cluster, ShimState::Installed),
    );
    state.shims.insert(
        "pending".into(),
        record("pending", Origin::Offline, ShimState::PendingVerification),
    );
    state.shims.insert(
        "failed".into(),
        record("failed", Origin::Cluster, ShimState::Failed),
    );
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &[],
        statics_ok: true,
        state: &state,
        pods: &[],
        held: &BTreeSet::new(),
    };
    assert_eq!(labels_wanted(&inputs), BTreeSet::from(["ok".to_string()]));
}

#[test]
fn the_node_patch_adds_wanted_labels_drops_stale_ones_and_is_none_when_in_place() {
    let current = labels(&[
        ("containerd.x-k8s.io/stale", "true"),
        ("containerd.x-k8s.io/kept", "true"),
        ("other", "x"),
    ]);
    let want: BTreeSet<String> = ["kept".to_string(), "new".to_string()].into();
    let states = NodeStates::new();
    let patch = node_patch(&current, &states, false, &want, &states).unwrap();
    assert_eq!(
        patch,
        serde_json::json!({"metadata": {"labels": {
            "containerd.x-k8s.io/stale": null,
            "containerd.x-k8s.io/new": "true",
        }}})
    );
    let now = labels(&[
        ("containerd.x-k8s.io/kept", "true"),
        ("containerd.x-k8s.io/new", "true"),
    ]);
    assert_eq!(node_patch(&now, &states, false, &want, &states), None);
}

#[test]
fn a_failure_is_reported_with_its_reason_and_since_is_kept_while_the_phase_holds() {
    let node = labels(&[]);
    let cluster = vec![shim("bad", &[]), shim("good", &[])];
    let mut state = NodeState::default();
    let mut good = record("good", Origin::Cluster, ShimState::Installed);
    good.spec_hash = cluster[1].spec_hash();
    state.shims.insert("good".into(), good);
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &[],
        statics_ok: true,
        state: &state,
        pods: &[],
        held: &BTreeSet::new(),
    };
    let plan = plan_node(&inputs);
    let failures = BTreeMap::from([(
        "bad".to_string(),
        FailureNote {
            reason: "DigestMismatch".into(),
            message: "sha256 mismatch".into(),
            generation: Some(1),
        },
    )]);
    let previous: NodeStates = BTreeMap::from([(
        "good".to_string(),
        ShimNodeState {
            version: None,
            insecure_source: None,
            signed: None,
            phase: NodePhase::Installed,
            digest: None,
            reason: None,
            message: None,
            generation: Some(1),
            since: "earlier".into(),
            retained: vec![],
        },
    )]);
    let st = states_wanted(&inputs, &plan, &failures, &previous, "now");
    assert_eq!(st["bad"].phase, NodePhase::Failed);
    assert_eq!(st["bad"].reason.as_deref(), Some("DigestMismatch"));
    assert_eq!(st["bad"].since, "now");
    assert_eq!(st["good"].phase, NodePhase::Installed);
    assert_eq!(st["good"].since, "earlier");
}

/// A node that failed to remove a Shim says so: the Shim no longer targets it, its uninstall
/// was rolled back and waits its retry, and the report keeps it, failed with its reason and
/// the digest still installed, until it is gone.
#[test]
fn a_failed_uninstall_stays_in_the_report_failed_and_installed_until_it_is_gone() {
    let node = labels(&[("pool", "a")]);
    let cluster = vec![shim("gone", &[("pool", "b")])];
    let mut state = NodeState::default();
    state.shims.insert(
        "gone".into(),
        record("gone", Origin::Cluster, ShimState::Installed),
    );
    let held = BTreeSet::from(["gone".to_string()]);
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &[],
        statics_ok: true,
        state: &state,
        pods: &[],
        held: &held,
    };
    let plan = plan_node(&inputs);
    assert!(plan.changes.is_empty(), "held: no retry before its time");
    let failures = BTreeMap::from([(
        "gone".to_string(),
        FailureNote {
            reason: "RolledBack".into(),
            message: "restart of containerd.service failed".into(),
            generation: None,
        },
    )]);
    let st = states_wanted(&inputs, &plan, &failures, &NodeStates::new(), "now");
    assert_eq!(st["gone"].phase, NodePhase::Failed);
    assert_eq!(st["gone"].reason.as_deref(), Some("RolledBack"));
    assert_eq!(st["gone"].digest, Some("d".repeat(64)), "still installed");

    let removed = NodeState::default();
    let inputs = Inputs {
        state: &removed,
        ..inputs
    };
    let plan = plan_node(&inputs);
    let st = states_wanted(&inputs, &plan, &failures, &NodeStates::new(), "later");
    assert!(!st.contains_key("gone"), "uninstalled: no longer reported");
}

/// What the node verified of an installed shim reaches its report, as the coordinator reads
/// it: the host that served it without a verified certificate, and who signed it and when.
#[test]
fn the_report_carries_an_insecure_source_and_the_verified_signature() {
    let node = labels(&[]);
    let cluster = vec![shim("good", &[])];
    let mut state = NodeState::default();
    let mut good = record("good", Origin::Cluster, ShimState::Installed);
    good.spec_hash = cluster[0].spec_hash();
    good.insecure_source = Some("https://mirror.internal:5000".into());
    good.signature = Some(shim_agent::state::SignatureRecord {
        file: "containerd-shim-x-v2".into(),
        signed_by: "https://ci.example/build.yml@refs/heads/main".into(),
        issuer: Some("https://token.actions.githubusercontent.com".into()),
        signed_time: None,
        node_policy: true,
    });
    state.shims.insert("good".into(), good);
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &[],
        statics_ok: true,
        state: &state,
        pods: &[],
        held: &BTreeSet::new(),
    };
    let plan = plan_node(&inputs);
    let st = states_wanted(&inputs, &plan, &BTreeMap::new(), &NodeStates::new(), "now");
    assert_eq!(
        st["good"].insecure_source.as_deref(),
        Some("https://mirror.internal:5000")
    );
    assert_eq!(
        st["good"].signed.as_deref(),
        Some(
            "containerd-shim-x-v2: verified, signed by https://ci.example/build.yml@refs/heads/main (issuer https://token.actions.githubusercontent.com), with no signed time checked, trusted by the node's policy too"
        )
    );
}

fn retained(name: &str, digest: &str, tasks: Vec<String>, task_count: usize) -> RetainedVersion {
    RetainedVersion {
        name: name.into(),
        digest: digest.into(),
        dir: format!("/opt/shim-agent/shims/{name}/{digest}"),
        since: 1,
        tasks,
        task_count,
    }
}

#[test]
fn the_annotation_names_each_retained_version_with_its_tasks_and_an_uninstalled_shim_kept_for_them_is_retained()
 {
    let node = labels(&[]);
    let cluster = vec![shim("upgraded", &[])];
    let mut state = NodeState::default();
    let mut now_on_v2 = record("upgraded", Origin::Cluster, ShimState::Installed);
    now_on_v2.spec_hash = cluster[0].spec_hash();
    state.shims.insert("upgraded".into(), now_on_v2);
    // the replaced version of an installed Shim: more tasks than are named
    let many: Vec<String> = (0..RETAINED_TASKS_LISTED)
        .map(|i| format!("k8s.io/pod-{i}"))
        .collect();
    let v1 = "1".repeat(64);
    state
        .retained
        .push(retained("upgraded", &v1, many.clone(), 40));
    // the version of a Shim uninstalled while a task runs through it
    let gone = "9".repeat(64);
    state
        .retained
        .push(retained("removed", &gone, vec!["default/batch".into()], 1));
    let inputs = Inputs {
        node_labels: &node,
        cluster: &cluster,
        statics: &[],
        statics_ok: true,
        state: &state,
        pods: &[],
        held: &BTreeSet::new(),
    };
    let plan = plan_node(&inputs);
    let st = states_wanted(&inputs, &plan, &BTreeMap::new(), &NodeStates::new(), "now");

    assert_eq!(st["upgraded"].phase, NodePhase::Installed);
    assert_eq!(
        st["upgraded"].retained,
        vec![RetainedNote {
            digest: v1.clone(),
            tasks: many.clone(),
            task_count: 40,
        }]
    );
    assert_eq!(st["removed"].phase, NodePhase::Retained);
    assert_eq!(st["removed"].reason.as_deref(), Some("TasksRunThroughIt"));
    assert_eq!(st["removed"].since, "now");
    assert_eq!(
        st["removed"].retained,
        vec![RetainedNote {
            digest: gone.clone(),
            tasks: vec!["default/batch".into()],
            task_count: 1,
        }]
    );

    // on the wire: the annotation of the Node patch, camelCase, read back whole
    let patch = node_patch(&node, &NodeStates::new(), false, &BTreeSet::new(), &st).unwrap();
    let text = patch["metadata"]["annotations"]["containerd.x-k8s.io/shim-state"]
        .as_str()
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(text).unwrap();
    assert_eq!(json["removed"]["phase"], "Retained");
    assert_eq!(
        json["removed"]["retained"],
        serde_json::json!([{"digest": gone, "tasks": ["default/batch"], "taskCount": 1}])
    );
    assert_eq!(json["upgraded"]["retained"][0]["taskCount"], 40);
    assert_eq!(
        json["upgraded"]["retained"][0]["tasks"]
            .as_array()
            .unwrap()
            .len(),
        RETAINED_TASKS_LISTED
    );
    let annotations = BTreeMap::from([(
        "containerd.x-k8s.io/shim-state".to_string(),
        text.to_string(),
    )]);
    assert_eq!(parse_states(Some(&annotations)), st);

    // a later report keeps the Retained entry's since while it stays Retained
    let later = states_wanted(&inputs, &plan, &BTreeMap::new(), &st, "later");
    assert_eq!(later["removed"].since, "now");
}

fn view(name: &str, lbl: &[(&str, &str)], states: &[(&str, NodePhase, Option<i64>)]) -> NodeView {
    NodeView {
        name: name.into(),
        labels: labels(lbl),
        states: states
            .iter()
            .map(|(s, p, g)| {
                (
                    s.to_string(),
                    ShimNodeState {
                        version: None,
                        insecure_source: None,
                        signed: None,
                        phase: *p,
                        digest: None,
                        reason: Some("DigestMismatch".into()),
                        message: Some("bad bytes".into()),
                        generation: *g,
                        since: "t".into(),
                        retained: vec![],
                    },
                )
            })
            .collect(),
    }
}

#[test]
fn status_counts_nodes_and_sets_conditions_with_reasons() {
    let s = shim("spin", &[("wasm", "true")]);
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let nodes = vec![
        view(
            "a",
            &[("wasm", "true"), ("containerd.x-k8s.io/spin", "true")],
            &[],
        ),
        view(
            "b",
            &[("wasm", "true")],
            &[("spin", NodePhase::Failed, Some(1))],
        ),
        view(
            "c",
            &[("wasm", "true")],
            &[("spin", NodePhase::Installing, Some(1))],
        ),
        view("d", &[], &[]),
        // a failure at an older generation does not count
        view(
            "e",
            &[("wasm", "true")],
            &[("spin", NodePhase::Failed, Some(0))],
        ),
        // labelled in advance by a node provisioner, still installing: no install yet
        view(
            "f",
            &[("wasm", "true"), ("containerd.x-k8s.io/spin", "true")],
            &[("spin", NodePhase::Installing, Some(1))],
        ),
    ];
    let st = compute_status(&s, &nodes, None, None, &now);
    let c = st.nodes.clone().unwrap();
    assert_eq!(
        (c.targeted, c.installed, c.updating, c.failed),
        (5, 1, 2, 1)
    );
    let cond = |t: &str| {
        st.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == t)
            .cloned()
            .unwrap()
    };
    assert_eq!(cond("Ready").status, "False");
    assert_eq!(cond("Ready").reason.as_deref(), Some("NodesFailed"));
    assert_eq!(cond("Degraded").status, "True");
    assert_eq!(cond("Degraded").reason.as_deref(), Some("DigestMismatch"));
    assert!(
        cond("Degraded")
            .message
            .unwrap()
            .contains("b: DigestMismatch: bad bytes")
    );
    assert_eq!(cond("Progressing").status, "True");
    assert_eq!(st.observed_generation, Some(1));

    let nowhere = compute_status(&shim("x", &[("gpu", "h100")]), &nodes, None, None, &now);
    let ready = nowhere.conditions.unwrap().remove(0);
    assert_eq!(ready.reason.as_deref(), Some("NoTargetedNodes"));

    // a transition time is kept while the status holds
    let later = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
    let again = compute_status(&s, &nodes, None, Some(&st), &later);
    assert_eq!(again, st);
}

/// A node whose artifact came from a host whose certificate was not verified (containerd's
/// `skip_verify`) is named in the Shim's Ready condition; the others are not.
#[test]
fn a_node_that_fetched_from_an_unverified_host_is_named_in_ready() {
    let s = shim("spin", &[("wasm", "true")]);
    let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
    let served = [("wasm", "true"), ("containerd.x-k8s.io/spin", "true")];
    let mut nodes = vec![
        view("a", &served, &[("spin", NodePhase::Installed, Some(1))]),
        view("b", &served, &[("spin", NodePhase::Installed, Some(1))]),
    ];
    let ready = |nodes: &[NodeView]| {
        compute_status(&s, nodes, None, None, &now)
            .conditions
            .unwrap()
            .remove(0)
    };
    let plain = ready(&nodes);
    assert_eq!(plain.status, "True");
    assert!(!plain.message.unwrap().contains("not verified"));
    if let Some(st) = nodes[1].states.get_mut("spin") {
        st.insecure_source = Some("https://mirror.internal:5000".into());
    }
    if let Some(st) = nodes[0].states.get_mut("spin") {
        st.signed = Some("x: verified, signed by me".into());
    }
    let flagged = ready(&nodes);
    assert_eq!(flagged.status, "True");
    assert_eq!(
        flagged.message.as_deref(),
        Some(
            "2/2 nodes serve the handler; fetched from a registry host whose certificate was not verified (skip_verify in containerd's hosts.toml) on b; x: verified, signed by me"
        )
    );
}

#[test]
fn backoff_doubles_from_ten_seconds_and_stops_at_ten_minutes() {
    let secs: Vec<u64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
    assert_eq!(secs, [10, 20, 40, 80, 160, 320, 600, 600, 600]);
    assert_eq!(backoff(u32::MAX), Duration::from_secs(600));
}
