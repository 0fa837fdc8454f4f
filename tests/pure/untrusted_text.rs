//! Untrusted text cannot panic the daemon: arbitrary Unicode of any length, as artifact file
//! names, extension replies, failure messages and reasons written by other nodes, Shim files,
//! configs and kubeconfigs, goes through every builder of an Event, a condition, the node
//! annotation, a metric label and a log line. Each builder stays within its limit and
//! produces text that reads back.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use proptest::prelude::*;
use shim_agent::api::Shim;
use shim_agent::api::extension::HookName;
use shim_agent::api::load::parse_shims;
use shim_agent::artifact::unpack::{UnpackOptions, unpack_stream};
use shim_agent::artifact::{Limits, find_shim_binary};
use shim_agent::cluster::coordinator::status::{NodeView, compute_status};
use shim_agent::cluster::nodestate::{
    NodePhase, ShimNodeState, node_patch, parse_states, states_wanted,
};
use shim_agent::cluster::target::{Inputs, plan_node};
use shim_agent::events;
use shim_agent::hooks::wire::{Answer, MAX_MESSAGE, parse_response};
use shim_agent::reconciler::memory::FailureNote;
use shim_agent::state::{NodeState, RetainedVersion};
use shim_agent::text::{EVENT_NOTE_MAX_BYTES, MESSAGE_MAX_BYTES};

use crate::support::shim_builder::ShimBuilder;

fn shim(name: &str) -> Shim {
    ShimBuilder::new(name)
        .generation(1)
        .artifact("https://e.com/a", &"a".repeat(64))
        .build()
}

/// Text the way it comes: any Unicode, some of it long, control characters included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        ".{0,3000}",
        "[ü🎉\u{0}-\u{1f}a-z\\u{10ffff}]{900,1100}",
    ]
}

/// A tar holding files named `names` (each made a valid relative name), and no shim.
fn tar_of(names: &[String]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (i, n) in names.iter().enumerate() {
        let clean: String = n
            .chars()
            .filter(|c| *c != '/' && *c != '\0' && *c != '\\')
            .take(40)
            .collect();
        let name = format!("{i}-{clean}");
        let mut h = tar::Header::new_gnu();
        h.set_size(1);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, &name, &b"x"[..]).unwrap();
    }
    b.into_inner().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn artifact_names_become_a_clear_error_and_a_clipped_event(names in prop::collection::vec(text(), 1..30)) {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits::default();
        let opts = UnpackOptions { location: "file:///x.tar", bare_name: "x", limits: &limits };
        let tar = tar_of(&names);
        // names the archive format cannot hold are refused by the unpacker, never a panic
        if unpack_stream(&tar[..], dir.path(), &opts).is_ok() {
            let e = find_shim_binary(dir.path(), None, "amd64").unwrap_err();
            prop_assert_eq!(e.reason(), "NoShimBinary");
            let note = format!("{}: Shim \"s\": {e}", e.reason());
            let ev = events::event(EventType::Warning, "InstallFailed", "InstallFailed", &note);
            let n = ev.note.unwrap();
            prop_assert!(n.len() <= EVENT_NOTE_MAX_BYTES);
            prop_assert!(n.starts_with("NoShimBinary"));
        }
    }

    #[test]
    fn any_event_note_and_reason_is_clipped(note in text(), reason in text()) {
        let ev = events::event(EventType::Normal, &reason, &reason, &note);
        prop_assert!(ev.note.unwrap().len() <= EVENT_NOTE_MAX_BYTES);
    }

    #[test]
    fn failure_notes_and_retained_tasks_make_an_annotation_that_reads_back(
        reason in text(), message in text(), task in text()
    ) {
        let s = shim("uni");
        let cluster = vec![s.clone()];
        let mut state = NodeState::default();
        state.retained.push(RetainedVersion {
            name: "gone".into(),
            digest: "d".into(),
            dir: "/opt/shim-agent/shims/gone/d".into(),
            since: 1,
            tasks: vec![task.clone()],
            task_count: 1,
        });
        let labels = BTreeMap::new();
        let held = BTreeSet::new();
        let inputs = Inputs {
            node_labels: &labels,
            cluster: &cluster,
            statics: &[],
            statics_ok: true,
            state: &state,
            pods: &[],
            held: &held,
        };
        let plan = plan_node(&inputs);
        let clipped = shim_agent::text::clip(&message, MESSAGE_MAX_BYTES);
        let failures = BTreeMap::from([(
            "uni".to_string(),
            FailureNote { reason: reason.clone(), message: clipped, generation: Some(1) },
        )]);
        let states = states_wanted(&inputs, &plan, &failures, &BTreeMap::new(), "now");
        let patch = node_patch(&labels, &BTreeMap::new(), false, &BTreeSet::new(), &states)
            .expect("a patch");
        let value = patch["metadata"]["annotations"][shim_agent::cluster::STATE_ANNOTATION]
            .as_str()
            .expect("the annotation")
            .to_string();
        let back = parse_states(Some(&BTreeMap::from([(
            shim_agent::cluster::STATE_ANNOTATION.to_string(),
            value,
        )])));
        prop_assert_eq!(back, states);
    }

    #[test]
    fn other_nodes_reasons_and_messages_make_bounded_conditions(
        reason in text(), message in text(), node in text()
    ) {
        let s = shim("uni");
        let entry = ShimNodeState {
            version: None,
            insecure_source: None,
            signed: None,
            phase: NodePhase::Failed,
            digest: None,
            reason: Some(reason),
            message: Some(message),
            generation: Some(1),
            since: "t".into(),
            retained: vec![],
        };
        let nodes = vec![NodeView {
            name: node,
            labels: BTreeMap::new(),
            states: BTreeMap::from([("uni".to_string(), entry)]),
        }];
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let st = compute_status(&s, &nodes, None, None, &now);
        for c in st.conditions.unwrap_or_default() {
            prop_assert!(c.message.unwrap_or_default().len() <= MESSAGE_MAX_BYTES);
            prop_assert!(c.reason.unwrap_or_default().len() <= 128);
        }
    }

    #[test]
    fn extension_replies_of_any_text_are_parsed_or_refused(message in text(), kind in text()) {
        for hook in [HookName::BeforeNodeRestart, HookName::BeforeRollout] {
            let body = serde_json::json!({
                "apiVersion": "hooks.containerd.x-k8s.io/v1alpha1",
                "kind": format!("{}Response", hook.as_str()),
                "status": "Failure",
                "message": message,
            });
            match parse_response(hook, body.to_string().as_bytes()) {
                Ok(Answer::Failure(m)) => prop_assert!(m.len() <= MAX_MESSAGE),
                Ok(other) => prop_assert!(false, "a Failure read as {other:?}"),
                Err(e) => prop_assert!(!e.is_empty()),
            }
            let odd = serde_json::json!({"apiVersion": kind, "kind": kind, "status": "Success"});
            if let Err(e) = parse_response(hook, odd.to_string().as_bytes()) {
                prop_assert!(e.len() < 1000);
            }
        }
    }

    #[test]
    fn metric_labels_and_log_lines_take_any_text(name in text(), line in text()) {
        shim_agent::telemetry::retained(&[(name.clone(), 3)]);
        let out = shim_agent::telemetry::metrics().encode();
        prop_assert!(out.contains("shim_agent_retained_versions"));
        tracing::subscriber::with_default(
            tracing_subscriber::fmt().with_writer(std::io::sink).finish(),
            || tracing::info!(shim = %name, "{line}"),
        );
    }

    #[test]
    fn shim_files_configs_and_kubeconfigs_of_any_text_are_refused_not_a_panic(t in text()) {
        let _ = parse_shims(&t, "x.yaml");
        let _ = kube::config::Kubeconfig::from_yaml(&t);
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.toml");
        std::fs::write(&cfg, &t).unwrap();
        let _ = shim_agent::settings::load(&cfg, true);
    }
}
