use super::*;

fn sample() -> NodeState {
    let mut s = NodeState::default();
    s.shims.insert(
        "spin".into(),
        InstalledShim {
            name: "spin".into(),
            handler: "spin".into(),
            runtime_type: "io.containerd.spin.v2".into(),
            artifact_sha256: "ab".repeat(32),
            source: "file:///tmp/spin.tar.gz".into(),
            binary: "/opt/shim-agent/shims/spin/abab/containerd-shim-spin-v2".into(),
            spec_hash: "cd".repeat(32),
            config_files: vec![ConfigRecord {
                path: "/etc/containerd/config.toml".into(),
                sha256_before: Some("00".repeat(32)),
                sha256_after: Some("11".repeat(32)),
            }],
            state: ShimState::PendingVerification,
            origin: Origin::Offline,
            runtime_class: None,
            installed_at: 1,
            shim_version: None,
            insecure_source: None,
            signature: None,
            check: None,
        },
    );
    s
}

#[test]
fn a_saved_state_loads_back_identically() {
    let d = tempfile::tempdir().unwrap();
    let store = StateStore::open(d.path()).unwrap();
    assert_eq!(store.load().unwrap().state, NodeState::default());
    store.save(&sample()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.state, sample());
    assert_eq!(loaded.found_format, STATE_FORMAT);
    // only the document and the lock: no temp files
    let mut names: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["lock", "state.json"]);
}

#[test]
fn a_second_agent_gets_already_running() {
    let d = tempfile::tempdir().unwrap();
    let _first = StateStore::open(d.path()).unwrap();
    let e = StateStore::open(d.path()).unwrap_err();
    assert_eq!(e.reason(), "AlreadyRunning");
    assert!(e.to_string().contains("already running"), "{e}");
    drop(_first);
    StateStore::open(d.path()).unwrap();
}

fn assert_quarantined(bytes: &[u8]) {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join(STATE_FILE), bytes).unwrap();
    let store = StateStore::open(d.path()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.state, NodeState::default());
    let moved = loaded
        .quarantined
        .expect("corrupt file must be quarantined");
    assert!(moved.starts_with(d.path().join(QUARANTINE_DIR)));
    assert_eq!(
        std::fs::read(&moved).unwrap(),
        bytes,
        "quarantined file keeps its bytes"
    );
    assert!(!store.state_path().exists());
    // the next load is clean (no crash loop), and a save works
    assert!(store.load().unwrap().quarantined.is_none());
    store.save(&sample()).unwrap();
}

#[test]
fn truncated_garbage_and_tampered_documents_are_quarantined() {
    let good = encode(&sample()).unwrap();
    assert_quarantined(&good[..good.len() / 2]);
    assert_quarantined(b"\0\0\0\0");
    assert_quarantined(b"");
    let tampered = String::from_utf8(good.clone())
        .unwrap()
        .replace("spin.tar.gz", "evil.tar.gz");
    assert_quarantined(tampered.as_bytes());
}

#[test]
fn a_newer_format_is_refused_not_quarantined() {
    let d = tempfile::tempdir().unwrap();
    let doc = br#"{"format":99,"sha256":"x","state":{}}"#;
    std::fs::write(d.path().join(STATE_FILE), doc).unwrap();
    let store = StateStore::open(d.path()).unwrap();
    let e = store.load().unwrap_err();
    assert_eq!(e.reason(), "StateFormatTooNew");
    assert!(e.to_string().contains("newer shim-agent"), "{e}");
    assert_eq!(std::fs::read(store.state_path()).unwrap(), doc);
}

#[test]
fn a_format_1_document_is_upgraded_on_load_and_rewritten_in_the_current_format() {
    let d = tempfile::tempdir().unwrap();
    let body = serde_json::to_string(&serde_json::json!({ "shims": sample().shims })).unwrap();
    let doc = format!(
        r#"{{"format":1,"sha256":"{}","state":{body}}}"#,
        checksum(body.as_bytes())
    );
    std::fs::write(d.path().join(STATE_FILE), doc).unwrap();
    let store = StateStore::open(d.path()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.found_format, 1);
    assert_eq!(loaded.state, sample());
    store.save(&loaded.state).unwrap();
    let text = std::fs::read_to_string(store.state_path()).unwrap();
    assert!(
        text.starts_with(&format!("{{\"format\":{STATE_FORMAT},")),
        "{text}"
    );
    assert_eq!(store.load().unwrap().found_format, STATE_FORMAT);
}

#[test]
fn the_state_file_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    let store = StateStore::open(&d.path().join("state")).unwrap();
    store.save(&sample()).unwrap();
    let mode = std::fs::metadata(store.state_path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_format_4_document_loads_with_no_insecure_source_and_format_5_keeps_it() {
    let d = tempfile::tempdir().unwrap();
    let body = serde_json::to_string(&sample()).unwrap();
    assert!(!body.contains("insecure_source"), "{body}");
    let doc = format!(
        r#"{{"format":4,"sha256":"{}","state":{body}}}"#,
        checksum(body.as_bytes())
    );
    std::fs::write(d.path().join(STATE_FILE), doc).unwrap();
    let store = StateStore::open(d.path()).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!((loaded.found_format, loaded.state), (4, sample()));

    let mut insecure = sample();
    if let Some(r) = insecure.shims.get_mut("spin") {
        r.insecure_source = Some("mirror.example:5000".into());
    }
    store.save(&insecure).unwrap();
    let text = std::fs::read_to_string(store.state_path()).unwrap();
    assert!(
        text.contains(r#""insecure_source":"mirror.example:5000""#),
        "{text}"
    );
    assert_eq!(store.load().unwrap().state, insecure);
}
