//! Helpers shared by the containerd engine tests: a test spec, an in-memory `apply`, an
//! independent TOML reader (serde, not the engine's own code) and the add/remove round trip.
#![allow(dead_code)]

use serde_json::{Value as Json, json};
use shim_agent::containerd::{
    AddOptions, ConfigFile, ConfigSet, Plan, RuntimeSpec, plan_add, plan_remove,
};

/// A spec using every field.
pub fn test_spec(handler: &str) -> RuntimeSpec {
    let mut options = serde_json::Map::new();
    options.insert("Foo".into(), json!("bar"));
    options.insert("Num".into(), json!(3));
    options.insert("Nested".into(), json!({"a": true}));
    RuntimeSpec {
        handler: handler.into(),
        runtime_type: format!("io.containerd.{handler}.v1"),
        runtime_path: Some(format!(
            "/opt/shim-agent/shims/{handler}/abc/containerd-shim-{handler}-v1"
        )),
        options,
        pod_annotations: vec!["example.com/*".into()],
        privileged_without_host_devices: true,
    }
}

/// What containerd must read for `test_spec` (written by hand, not by the engine).
pub fn expected_handler_json(spec: &RuntimeSpec) -> Json {
    let mut m = serde_json::Map::new();
    m.insert("runtime_type".into(), json!(spec.runtime_type));
    if let Some(p) = &spec.runtime_path {
        m.insert("runtime_path".into(), json!(p));
    }
    if !spec.pod_annotations.is_empty() {
        m.insert("pod_annotations".into(), json!(spec.pod_annotations));
    }
    if spec.privileged_without_host_devices {
        m.insert("privileged_without_host_devices".into(), json!(true));
    }
    if !spec.options.is_empty() {
        m.insert("options".into(), Json::Object(spec.options.clone()));
    }
    Json::Object(m)
}

/// Parse TOML with serde (independent of the engine's edit code).
pub fn parse_json(bytes: &[u8]) -> Json {
    let s = std::str::from_utf8(bytes).expect("utf-8");
    toml_edit::de::from_str::<Json>(s).unwrap_or_else(|e| panic!("does not parse: {e}\n{s}"))
}

pub fn version_of(j: &Json) -> i64 {
    j.get("version").and_then(Json::as_i64).unwrap_or(1)
}

/// The runtimes path for a config version (from the containerd docs, not from the engine).
pub fn runtimes_path(version: i64) -> Vec<&'static str> {
    let id = match version {
        1 => "cri",
        2 => "io.containerd.grpc.v1.cri",
        _ => "io.containerd.cri.v1.runtime",
    };
    vec!["plugins", id, "containerd", "runtimes"]
}

pub fn get<'a>(j: &'a Json, path: &[&str]) -> Option<&'a Json> {
    path.iter().try_fold(j, |cur, k| cur.get(*k))
}

/// Remove `path` + `key` from a JSON tree and prune objects left empty on the way.
pub fn remove_at(j: &mut Json, path: &[&str], key: &str) {
    fn rec(j: &mut Json, path: &[&str], key: &str) {
        let Some(obj) = j.as_object_mut() else { return };
        match path.split_first() {
            None => {
                obj.remove(key);
            }
            Some((first, rest)) => {
                if let Some(child) = obj.get_mut(*first) {
                    rec(child, rest, key);
                    if child.as_object().is_some_and(|o| o.is_empty()) {
                        obj.remove(*first);
                    }
                }
            }
        }
    }
    rec(j, path, key)
}

/// Apply a plan to an in-memory set, checking each change's `before`.
pub fn apply_mem(set: &ConfigSet, plan: &Plan) -> ConfigSet {
    let mut out = set.clone();
    for c in &plan.changes {
        if c.host_path == out.main.host_path {
            assert_eq!(c.before.as_ref(), Some(&out.main.bytes), "stale main");
            out.main.bytes = c.after.clone().expect("the main file is never deleted");
            continue;
        }
        let pos = out.dropins.iter().position(|d| d.host_path == c.host_path);
        assert_eq!(
            c.before.as_ref(),
            pos.map(|i| &out.dropins[i].bytes),
            "stale drop-in"
        );
        match (pos, &c.after) {
            (Some(i), Some(b)) => out.dropins[i].bytes = b.clone(),
            (Some(i), None) => {
                out.dropins.remove(i);
            }
            (None, Some(b)) => out.dropins.push(ConfigFile {
                host_path: c.host_path.clone(),
                bytes: b.clone(),
            }),
            (None, None) => panic!("deleting a missing file"),
        }
    }
    out
}

/// The lines of `a` that a longest common subsequence with `b` leaves out (changed or
/// removed), and the lines of `b` it leaves out (changed or added).
pub fn line_diff(a: &[u8], b: &[u8]) -> (Vec<String>, Vec<String>) {
    let a: Vec<String> = String::from_utf8_lossy(a)
        .lines()
        .map(String::from)
        .collect();
    let b: Vec<String> = String::from_utf8_lossy(b)
        .lines()
        .map(String::from)
        .collect();
    let mut l = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            l[i][j] = if a[i] == b[j] {
                l[i + 1][j + 1] + 1
            } else {
                l[i + 1][j].max(l[i][j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    let (mut gone, mut new) = (Vec::new(), Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
        } else if j < b.len() && (i == a.len() || l[i][j + 1] >= l[i + 1][j]) {
            new.push(b[j].clone());
            j += 1;
        } else {
            gone.push(a[i].clone());
            i += 1;
        }
    }
    (gone, new)
}

/// Adding `handler` keeps every line of `before`, except a line holding an inline table on
/// the path, which may only grow by the handler's entry: it keeps its text up to the `{`,
/// and the new line names the handler.
pub fn check_lines_kept(name: &str, before: &[u8], after: &[u8], handler: &str) {
    let (gone, new) = line_diff(before, after);
    for line in &gone {
        let head = line.find('{').map(|i| &line[..=i]).unwrap_or_else(|| {
            panic!(
                "{name}: line `{line}` changed or removed:\n{}",
                String::from_utf8_lossy(after)
            )
        });
        assert!(
            new.iter()
                .any(|m| m.starts_with(head) && m.len() > line.len() && m.contains(handler)),
            "{name}: inline line `{line}` did not just gain `{handler}`:\n{}",
            String::from_utf8_lossy(after)
        );
    }
}

/// The full contract of add then remove on one config set.
pub fn check_add_remove_round_trip(
    name: &str,
    set: &ConfigSet,
    spec: &RuntimeSpec,
    dropin: Option<&str>,
) {
    let plan =
        plan_add(set, spec, &AddOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!plan.is_empty(), "{name}: add planned nothing");
    let added = apply_mem(set, &plan);
    let main_before = parse_json(&set.main.bytes);
    let version = version_of(&main_before);
    let path = runtimes_path(version);
    let (holder_before, holder_after) = match dropin {
        Some(d) => {
            assert_eq!(
                added.main.bytes, set.main.bytes,
                "{name}: main file must not change"
            );
            let f = added
                .dropins
                .iter()
                .find(|f| f.host_path.to_str() == Some(d))
                .unwrap_or_else(|| panic!("{name}: no drop-in {d}: {:?}", plan.changes));
            let j = parse_json(&f.bytes);
            assert_eq!(
                version_of(&j),
                version,
                "{name}: drop-in must carry the main version"
            );
            (json!({"version": version}), j)
        }
        None => {
            assert!(
                added.dropins == set.dropins,
                "{name}: drop-ins must not change"
            );
            check_lines_kept(name, &set.main.bytes, &added.main.bytes, &spec.handler);
            (main_before.clone(), parse_json(&added.main.bytes))
        }
    };
    let got = get(
        &holder_after,
        &[&path[..], &[spec.handler.as_str()]].concat(),
    )
    .cloned();
    assert_eq!(
        got,
        Some(expected_handler_json(spec)),
        "{name}: handler at {path:?}"
    );
    // Every other table keeps its value; runc made explicit only where 1.x needs it.
    let mut rest = holder_after.clone();
    remove_at(&mut rest, &path, &spec.handler);
    let had_runtimes = get(&holder_before, &path)
        .and_then(Json::as_object)
        .is_some_and(|o| !o.is_empty());
    if version <= 2 && !had_runtimes && dropin.is_none() {
        assert_eq!(
            get(&rest, &[&path[..], &["runc"]].concat()),
            Some(&json!({"runtime_type": "io.containerd.runc.v2"})),
            "{name}: runc kept"
        );
        remove_at(&mut rest, &path, "runc");
    }
    if dropin.is_none() {
        // compare with empty tables along the runtimes path pruned on both sides
        let mut before_norm = holder_before.clone();
        remove_at(&mut before_norm, &path, "");
        assert_eq!(rest, before_norm, "{name}: other tables changed");
    }
    // add∘add = add
    assert!(
        plan_add(&added, spec, &AddOptions::default())
            .unwrap()
            .is_empty(),
        "{name}: not idempotent"
    );
    // a different handler of the same name is a conflict naming the file
    let mut other = spec.clone();
    other.runtime_type = "io.containerd.other.v9".into();
    let e = plan_add(&added, &other, &AddOptions::default()).unwrap_err();
    assert_eq!(e.reason(), "HandlerConflict", "{name}: {e}");
    assert!(e.to_string().contains("runtime_type"), "{name}: {e}");
    // remove∘add = identity
    let removed = apply_mem(
        &added,
        &plan_remove(&added, &spec.handler).unwrap_or_else(|e| panic!("{name}: {e}")),
    );
    assert_eq!(
        String::from_utf8_lossy(&removed.main.bytes),
        String::from_utf8_lossy(&set.main.bytes),
        "{name}: remove did not restore the bytes"
    );
    assert!(
        removed == *set,
        "{name}: remove did not restore the drop-ins"
    );
    assert!(
        plan_remove(&removed, &spec.handler).unwrap().is_empty(),
        "{name}: remove not idempotent"
    );
}
