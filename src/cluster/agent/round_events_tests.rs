use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

use super::RoundEvents;

fn node() -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some("n1".into()),
        ..Default::default()
    }
}

fn shim(name: &str) -> Option<ObjectReference> {
    Some(ObjectReference {
        kind: Some("Shim".into()),
        name: Some(name.into()),
        ..Default::default()
    })
}

/// (type, reason, note, what it is about) of each write.
fn seen(writes: &[(Event, Vec<ObjectReference>)]) -> Vec<(EventType, String, String, String)> {
    writes
        .iter()
        .map(|(e, refs)| {
            assert_eq!(refs.len(), 1, "one object per write");
            let r = &refs[0];
            let about = format!(
                "{}/{}",
                r.kind.as_deref().unwrap_or(""),
                r.name.as_deref().unwrap_or("")
            );
            (
                e.type_,
                e.reason.clone(),
                e.note.clone().unwrap_or_default(),
                about,
            )
        })
        .collect()
}

#[test]
fn the_node_gets_one_event_per_kind_and_each_shim_its_own() {
    let mut r = RoundEvents::default();
    let normal = |reason: &'static str, note: &str| (EventType::Normal, reason, note.to_string());
    r.tell("a", normal("Installed", "a: serves"), node(), shim("a"));
    r.tell("b", normal("Upgraded", "b: new"), node(), shim("b"));
    r.tell("c", normal("Installed", "c: serves"), node(), shim("c"));
    let warn = (EventType::Warning, "Installed", "odd".to_string());
    r.tell("d", warn, node(), shim("d"));
    r.tell("gone", normal("Uninstalled", "gone: removed"), node(), None);
    r.tell("e", normal("Installed", "e: serves"), node(), shim("e"));
    let w = seen(&r.take_writes());
    let n = |t, reason: &str, note: &str, about: &str| {
        (t, reason.to_string(), note.to_string(), about.to_string())
    };
    use EventType::{Normal, Warning};
    assert_eq!(
        w,
        vec![
            n(Normal, "Installed", "a: serves", "Shim/a"),
            n(Normal, "Upgraded", "b: new", "Shim/b"),
            n(Normal, "Installed", "c: serves", "Shim/c"),
            n(Warning, "Installed", "odd", "Shim/d"),
            // its Shim is gone: the Node's Event is the only one, whole
            n(Normal, "Uninstalled", "gone: removed", "Node/n1"),
            n(Normal, "Installed", "e: serves", "Shim/e"),
            n(
                Normal,
                "Installed",
                "Installed for 3 Shims: a, c, e; each Shim's own Event says more",
                "Node/n1"
            ),
            // alone in its kind: its own note
            n(Normal, "Upgraded", "b: new", "Node/n1"),
            n(Warning, "Installed", "odd", "Node/n1"),
        ]
    );
    assert!(r.take_writes().is_empty(), "the round is emptied");
}

#[test]
fn a_node_event_for_many_shims_lists_twenty_and_counts_the_rest() {
    let mut r = RoundEvents::default();
    for i in (0..50).rev() {
        let ev = (EventType::Normal, "Installed", format!("s{i}"));
        r.tell(&format!("s{i:02}"), ev, node(), shim(&format!("s{i:02}")));
    }
    let w = seen(&r.take_writes());
    assert_eq!(w.len(), 51, "50 on the Shims, one on the Node");
    let (_, _, note, about) = &w[50];
    assert_eq!(about, "Node/n1");
    let names: Vec<String> = (0..20).map(|i| format!("s{i:02}")).collect();
    assert_eq!(
        note,
        &format!(
            "Installed for 50 Shims: {} and 30 more; each Shim's own Event says more",
            names.join(", ")
        )
    );
}

#[test]
fn long_and_unicode_shim_names_are_clipped_to_a_note_the_api_takes() {
    let mut r = RoundEvents::default();
    let long = "ß".repeat(200) + "🦀";
    for i in 0..30 {
        let name = format!("{long}{i}");
        let ev = (EventType::Warning, "InstallFailed", "x".repeat(5000));
        r.tell(&name, ev, node(), shim(&name));
    }
    for (e, _) in r.take_writes() {
        let note = e.note.unwrap_or_default();
        assert!(
            note.len() <= crate::text::EVENT_NOTE_MAX_BYTES,
            "{} bytes",
            note.len()
        );
    }
}
