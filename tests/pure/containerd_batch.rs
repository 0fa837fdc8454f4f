//! A batch of handlers planned on one parse of the files (`plan_adds`, `plan_removes`)
//! writes exactly what planning them one after another does (`plan_add`, `plan_remove`, each
//! on the files the one before left), on every editable corpus config, in place, by the
//! default policy and as drop-ins; refuses what that refuses, naming the same spec; and a
//! batch removed gives back the original files.

use std::path::PathBuf;

use shim_agent::containerd::{
    AddOptions, ConfigSet, DropinPolicy, RuntimeSpec, plan_add, plan_adds, plan_remove,
    plan_removes,
};

use crate::containerd_corpus::editable_corpus_sets;
use crate::support::containerd::*;

/// Five new handlers, then the first again with another binary (a replace).
fn batch() -> Vec<RuntimeSpec> {
    let mut specs: Vec<RuntimeSpec> = ["wasm-a", "wasm-b", "spin", "gvisor", "kata-qemu"]
        .iter()
        .map(|h| test_spec(h))
        .collect();
    let mut again = test_spec("wasm-a");
    again.runtime_path = Some("/opt/shim-agent/shims/wasm-a/def/containerd-shim-wasm-a-v1".into());
    specs.push(again);
    specs
}

/// The specs one after another: the files at the end, or the failing spec and its reason.
fn one_at_a_time(
    set: &ConfigSet,
    specs: &[(RuntimeSpec, AddOptions)],
) -> Result<ConfigSet, (usize, &'static str)> {
    let mut view = set.clone();
    for (i, (spec, opts)) in specs.iter().enumerate() {
        let plan = plan_add(&view, spec, opts).map_err(|e| (i, e.reason()))?;
        view = apply_mem(&view, &plan);
    }
    Ok(view)
}

#[test]
fn a_batch_planned_at_once_writes_what_one_at_a_time_writes() {
    let policies = [
        DropinPolicy::Auto,
        DropinPolicy::Never,
        DropinPolicy::Dir(PathBuf::from("conf.d")),
    ];
    let (mut same, mut refused) = (0, 0);
    for (name, set) in editable_corpus_sets() {
        for dropin in &policies {
            let specs: Vec<(RuntimeSpec, AddOptions)> = batch()
                .into_iter()
                .enumerate()
                .map(|(i, spec)| {
                    let opts = AddOptions {
                        replace: i == 5,
                        dropin: dropin.clone(),
                    };
                    (spec, opts)
                })
                .collect();
            let at_once = plan_adds(&set, &specs);
            match (one_at_a_time(&set, &specs), at_once) {
                (Ok(want), Ok(plan)) => {
                    // apply_mem checks each change's `before` against the files as they are
                    assert_eq!(apply_mem(&set, &plan), want, "{name}, {dropin:?}");
                    removed_alike(&name, &want, &set);
                    same += 1;
                }
                (Err((i, reason)), Err((j, e))) => {
                    assert_eq!((j, e.reason()), (i, reason), "{name}, {dropin:?}: {e}");
                    refused += 1;
                }
                (want, got) => panic!(
                    "{name}, {dropin:?}: one at a time {:?}, at once {:?}",
                    want.map(|_| "ok"),
                    got.map(|_| "ok").map_err(|(i, e)| format!("spec {i}: {e}"))
                ),
            }
        }
    }
    assert!(
        same >= 40,
        "only {same} batches planned ({refused} refused)"
    );
}

/// The batch's handlers removed at once and one at a time: the same files, the original ones.
fn removed_alike(name: &str, installed: &ConfigSet, original: &ConfigSet) {
    let handlers: Vec<String> = batch().iter().take(5).map(|s| s.handler.clone()).collect();
    let mut one = installed.clone();
    for h in &handlers {
        let plan = plan_remove(&one, h).unwrap_or_else(|e| panic!("{name}: remove {h}: {e}"));
        one = apply_mem(&one, &plan);
    }
    let plan = plan_removes(installed, &handlers)
        .unwrap_or_else(|(i, e)| panic!("{name}: remove at once, handler {i}: {e}"));
    let at_once = apply_mem(installed, &plan);
    assert_eq!(at_once, one, "{name}: removed at once and one at a time");
    assert_eq!(
        at_once, *original,
        "{name}: removed, the files as they were"
    );
}
