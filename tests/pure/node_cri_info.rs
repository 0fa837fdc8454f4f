//! The pure CRI `Status` parsers, on a verbose info map captured from the real containerd
//! 1.6.20 of the node env (`tests/fixtures/cri/`) and on a containerd 2.x-style reply that
//! lists its handlers.

use std::collections::HashMap;

use shim_agent::node::HandlerSource;
use shim_agent::node::cri::proto::{
    RuntimeCondition, RuntimeHandler, RuntimeStatus, StatusResponse,
};
use shim_agent::node::cri::{handlers_from_verbose_info, status_from_response};

/// `Status{verbose: true}` info map of Debian bookworm's containerd 1.6.20 with Debian's
/// config, captured over the CRI socket of the node env.
const INFO_1_6_20: &str = include_str!("../fixtures/cri/containerd-1.6.20-status-info.json");
/// The same containerd after `containerd-1.6.20-shimtest-config.toml` (runc plus `shimtest`
/// with a `runtime_path`) and a restart.
const INFO_1_6_20_SHIMTEST: &str =
    include_str!("../fixtures/cri/containerd-1.6.20-status-info-shimtest.json");

fn info_1_6_20() -> HashMap<String, String> {
    serde_json::from_str(INFO_1_6_20).expect("fixture is a JSON object of strings")
}

fn conditions(runtime: bool, network: bool) -> Option<RuntimeStatus> {
    let c = |t: &str, status: bool| RuntimeCondition {
        r#type: t.to_string(),
        status,
        reason: if status {
            String::new()
        } else {
            "NotReady".into()
        },
        message: if status {
            String::new()
        } else {
            "not yet".into()
        },
    };
    Some(RuntimeStatus {
        conditions: vec![c("RuntimeReady", runtime), c("NetworkReady", network)],
    })
}

#[test]
fn containerd_1_6_verbose_config_lists_runc() {
    assert_eq!(
        handlers_from_verbose_info(&info_1_6_20()).unwrap(),
        vec!["runc"]
    );
}

#[test]
fn containerd_1_6_status_is_ready_without_network_and_reads_handlers_from_config() {
    let resp = StatusResponse {
        status: conditions(true, false),
        info: info_1_6_20(),
        runtime_handlers: vec![],
    };
    let st = status_from_response(&resp).unwrap();
    assert!(st.runtime_ready);
    assert!(!st.network_ready);
    assert_eq!(st.handlers, vec!["runc"]);
    assert_eq!(st.handler_source, HandlerSource::VerboseConfig);
}

#[test]
fn containerd_1_6_verbose_config_lists_an_added_handler_next_to_runc() {
    let info: HashMap<String, String> = serde_json::from_str(INFO_1_6_20_SHIMTEST).unwrap();
    assert_eq!(
        handlers_from_verbose_info(&info).unwrap(),
        vec!["runc", "shimtest"]
    );
}

#[test]
fn an_added_handler_in_the_verbose_config_is_listed_sorted() {
    let mut info = info_1_6_20();
    let mut config: serde_json::Value = serde_json::from_str(&info["config"]).unwrap();
    config["containerd"]["runtimes"]["spin"] =
        serde_json::json!({"runtimeType": "io.containerd.spin.v2"});
    config["containerd"]["runtimes"]["aaa"] = serde_json::json!({});
    info.insert("config".into(), config.to_string());
    assert_eq!(
        handlers_from_verbose_info(&info).unwrap(),
        vec!["aaa", "runc", "spin"]
    );
}

#[test]
fn containerd_2_runtime_handlers_win_over_the_verbose_config() {
    let resp = StatusResponse {
        status: conditions(true, true),
        info: HashMap::new(),
        runtime_handlers: ["", "runc", "spin", "runc"]
            .iter()
            .map(|n| RuntimeHandler {
                name: n.to_string(),
            })
            .collect(),
    };
    let st = status_from_response(&resp).unwrap();
    assert_eq!(
        st.handlers,
        vec!["runc", "spin"],
        "default '' left out, deduplicated"
    );
    assert_eq!(st.handler_source, HandlerSource::RuntimeHandlers);
    assert!(st.runtime_ready && st.network_ready);
}

#[test]
fn a_runtime_not_ready_carries_reason_and_message() {
    let resp = StatusResponse {
        status: conditions(false, false),
        info: info_1_6_20(),
        runtime_handlers: vec![],
    };
    let st = status_from_response(&resp).unwrap();
    assert!(!st.runtime_ready);
    assert_eq!(st.runtime_detail, "NotReady: not yet");
}

#[test]
fn a_reply_without_conditions_is_not_ready() {
    let resp = StatusResponse {
        status: None,
        info: info_1_6_20(),
        runtime_handlers: vec![],
    };
    let st = status_from_response(&resp).unwrap();
    assert!(!st.runtime_ready);
    assert_eq!(st.runtime_detail, "no RuntimeReady condition");
}

#[test]
fn a_non_verbose_or_broken_info_is_a_cri_info_error() {
    let e = handlers_from_verbose_info(&HashMap::new()).unwrap_err();
    assert_eq!(e.reason(), "CriInfo");
    let bad: HashMap<String, String> = [("config".to_string(), "{not json".to_string())].into();
    assert_eq!(
        handlers_from_verbose_info(&bad).unwrap_err().reason(),
        "CriInfo"
    );
    let no_runtimes: HashMap<String, String> =
        [("config".to_string(), r#"{"containerd":{}}"#.to_string())].into();
    assert!(
        handlers_from_verbose_info(&no_runtimes)
            .unwrap_err()
            .to_string()
            .contains("containerd.runtimes")
    );
}
