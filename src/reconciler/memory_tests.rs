use super::*;
use crate::reconciler::judge::{Ended, Judgement, judge};
use crate::retry::BACKOFF_BASE_SECS;

#[test]
fn one_change_is_its_own_culprit_and_an_unnamed_batch_runs_alone() {
    let w = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        judge(&w(&["a"]), &[], Ended::Failed),
        Judgement::Blame(w(&["a"]))
    );
    assert_eq!(
        judge(&w(&["a", "b"]), &w(&["b"]), Ended::Failed),
        Judgement::Blame(w(&["b"]))
    );
    assert_eq!(
        judge(&w(&["a", "b"]), &[], Ended::Failed),
        Judgement::RunAlone(w(&["a", "b"]))
    );
    assert_eq!(judge(&w(&["a"]), &[], Ended::Stopping), Judgement::Stopping);
    // the Shims changed while the node waited for its first slot: plan again, no blame
    assert_eq!(
        judge(&w(&["a", "b"]), &w(&["b"]), Ended::Superseded),
        Judgement::Replan
    );
    // no slot while the API server was away: the whole batch waits, nobody is blamed
    assert_eq!(
        judge(&w(&["a", "b"]), &w(&["b"]), Ended::OnlyWaits),
        Judgement::Wait(w(&["a", "b"]))
    );
    // nothing tried (no real work), nothing named
    assert_eq!(judge(&[], &[], Ended::Failed), Judgement::Blame(vec![]));
}

#[test]
fn a_failure_backs_off_doubling_and_is_held_until_then() {
    let mut m = Memory::default();
    let t0 = Instant::now();
    assert_eq!(m.failed("a", None, "X", "m".into(), t0), backoff(1));
    assert_eq!(m.failed("a", None, "X", "m".into(), t0), backoff(2));
    assert_eq!(m.held(t0), BTreeSet::from(["a".to_string()]));
    let later = t0 + backoff(2) + Duration::from_secs(1);
    assert!(m.held(later).is_empty());
    assert!(m.failures["a"].retry_at.is_some(), "held() is pure");
    m.expire(later);
    assert_eq!(
        m.failures["a"].retry_at, None,
        "cleared once due; the note stays"
    );
    assert_eq!(m.failing(), vec!["a"]);
    m.succeeded(&["a".to_string()]);
    assert!(m.failures.is_empty());
}

#[test]
fn a_set_aside_shim_is_reported_once_and_a_split_batch_reruns_at_once() {
    let mut m = Memory::default();
    let note = FailureNote {
        reason: "AgentCrashed".into(),
        message: "m".into(),
        generation: None,
    };
    assert!(m.set_aside("c", note.clone(), "k".into(), 2));
    assert!(!m.set_aside("c", note.clone(), "k".into(), 2));
    assert_eq!(m.failing(), vec!["c"]);
    m.keep_aside_only(&BTreeSet::new());
    assert!(m.set_aside("c", note, "k".into(), 2));
    // a batch split: each alone, the next round at once, and again while any waits
    m.run_alone(["x".to_string()]);
    assert!(m.take_rerun());
    assert!(!m.take_rerun());
    assert!(m.wants_rerun());
}

#[test]
fn a_change_that_waits_for_the_api_server_is_held_briefly_and_is_no_failure() {
    let mut m = Memory::default();
    let t0 = Instant::now();
    let names = vec!["a".to_string(), "b".to_string()];
    let first = m.wait(&names, "node-1", t0);
    assert!(first >= Duration::from_millis(500) && first <= Duration::from_secs(1));
    assert_eq!(m.held(t0), BTreeSet::from(["a".into(), "b".into()]));
    assert_eq!(m.next_due(None), Some(t0 + first));
    assert!(m.failing().is_empty() && m.notes().is_empty(), "no failure");
    // it doubles while the server stays away, up to WAIT_MAX_SECS
    let mut last = first;
    for _ in 0..12 {
        last = m.wait(&names, "node-1", t0);
    }
    let max = Duration::from_secs(WAIT_MAX_SECS);
    assert!(last >= max / 2 && last <= max, "{last:?}");
    assert!(m.held(t0 + max).is_empty());
    m.expire(t0 + max);
    assert_eq!(
        m.next_due(None),
        None,
        "no past retry keeps the timer firing"
    );
    // nodes turned away together come back spread out
    let pauses: BTreeSet<Duration> = (0..50)
        .map(|i| Memory::default().wait(&names, &format!("node-{i}"), t0))
        .collect();
    assert!(pauses.len() > 40, "{pauses:?}");
    // it went through: forgotten, the next wait starts short again
    m.succeeded(&names);
    assert!(m.held(t0).is_empty());
    assert!(m.wait(&names, "node-1", t0) <= Duration::from_secs(1));
}

#[test]
fn a_failing_shim_waits_its_pause_and_a_new_spec_runs_at_once() {
    let t0 = Instant::now();
    let mut r = Memory::default();
    let (k1, k2) = (shim_at("a", "1"), shim_at("a", "2"));
    let m = String::new;
    assert_eq!(
        r.failed("a", Some(&k1), "DriftUnrepairable", m(), t0),
        Duration::from_secs(BACKOFF_BASE_SECS)
    );
    assert_eq!(
        r.failed("a", Some(&k1), "DriftUnrepairable", m(), t0),
        Duration::from_secs(2 * BACKOFF_BASE_SECS)
    );
    let same = [k1.clone()];
    r.forget_stale(&Wanted::new(&[], &same));
    assert_eq!(r.held(t0), BTreeSet::from(["a".to_string()]));
    assert!(r.held(t0 + Duration::from_secs(21)).is_empty());
    let new = [k2];
    r.forget_stale(&Wanted::new(&[], &new));
    assert!(r.held(t0).is_empty(), "a new spec");
    assert!(r.failing().is_empty());
    r.failed("b", None, "x", m(), t0);
    r.succeeded(&["b".to_string()]);
    assert!(r.failing().is_empty());
}

#[test]
fn a_failed_uninstall_stays_while_the_shim_is_gone_and_goes_when_it_comes_back() {
    let t0 = Instant::now();
    let mut r = Memory::default();
    r.failed("a", None, "RolledBack", String::new(), t0);
    r.forget_stale(&Wanted::default());
    assert_eq!(r.failing(), vec!["a"], "still to be removed");
    let back = [shim_at("a", "1")];
    r.forget_stale(&Wanted::new(&back, &[]));
    assert!(r.failing().is_empty(), "wanted again: installed at once");
}

#[test]
fn a_static_shim_wins_over_the_clusters_of_its_name() {
    let cluster = [shim_at("a", "1")];
    let statics = [shim_at("a", "2")];
    let w = Wanted::new(&cluster, &statics);
    assert_eq!(w.key("a"), spec_key(&statics[0]));
    assert_eq!(w.key("gone"), UNINSTALL_KEY);
}

/// The cluster agent's wanted Shims are those that target its node: one that stops doing so
/// is keyed as an uninstall, as the static daemon keys a file gone from `shims.d`.
#[test]
fn a_shim_left_out_of_the_wanted_ones_is_keyed_as_an_uninstall() {
    let cluster = [shim_at("a", "1"), shim_at("b", "1")];
    let w = Wanted::of(cluster.iter().filter(|s| s.name() == "a"));
    assert_eq!(w.key("a"), spec_key(&cluster[0]));
    assert_eq!(w.key("b"), UNINSTALL_KEY);
    assert!(w.get("b").is_none());
}

/// A Shim `name` whose spec differs by `version`.
fn shim_at(name: &str, version: &str) -> Shim {
    let y = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: {name}}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file:///{version}\", sha256: {}}}}}\n  runtimeClass: {{name: {name}}}\n",
        "a".repeat(64)
    );
    crate::api::load::parse_shims(&y, "t.yaml")
        .unwrap()
        .remove(0)
}

/// A plan of uninstalls of `names` (the test needs no Shim objects).
fn plan_of(names: &[&str]) -> Vec<Change> {
    names
        .iter()
        .map(|n| Change::Uninstall(n.to_string()))
        .collect()
}

fn names_of(plan: &[Change]) -> Vec<&str> {
    plan.iter().map(change_name).collect()
}

#[test]
fn after_an_unnamed_batch_failure_each_shim_runs_alone_in_turn() {
    let w = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut m = Memory::default();
    // nobody waits to run alone: the plan stays whole
    let mut plan = plan_of(&["a", "b", "idle"]);
    m.restrict_to_solo(&mut plan, &w(&["a", "b"]));
    assert_eq!(names_of(&plan), ["a", "b", "idle"]);

    // the batch a, b, c failed unnamed: the first of them alone, with the changes that do
    // no real work; then the next one
    m.run_alone(w(&["a", "b", "c"]));
    let mut plan = plan_of(&["a", "b", "c", "idle"]);
    m.restrict_to_solo(&mut plan, &w(&["a", "b", "c"]));
    assert_eq!(names_of(&plan), ["a", "idle"]);
    assert!(m.wants_rerun(), "b and c still wait to run alone");
    let mut plan = plan_of(&["b", "c", "idle"]);
    m.restrict_to_solo(&mut plan, &w(&["b", "c"]));
    assert_eq!(names_of(&plan), ["b", "idle"]);
    let mut plan = plan_of(&["c"]);
    m.restrict_to_solo(&mut plan, &w(&["c"]));
    assert_eq!(names_of(&plan), ["c"]);
    assert!(m.take_rerun(), "asked for by the split");
    assert!(!m.wants_rerun(), "no one left to run alone");

    // the Shims that waited need no work any more: they are forgotten, the plan stays whole
    m.run_alone(w(&["x", "y"]));
    let mut plan = plan_of(&["d", "e"]);
    m.restrict_to_solo(&mut plan, &w(&["d", "e"]));
    assert_eq!(names_of(&plan), ["d", "e"]);
    assert!(m.take_rerun());
    assert!(!m.wants_rerun(), "x and y forgotten");
}
