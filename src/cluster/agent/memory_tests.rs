use super::*;

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
fn what_was_reported_is_reported_again_only_once_it_changes() {
    let mut m = Memory::default();
    let pods =
        |p: &[&str]| BTreeMap::from([("a".to_string(), p.iter().map(|s| s.to_string()).collect())]);
    assert_eq!(m.blocked_now(&pods(&["p1"])).len(), 1);
    assert!(m.blocked_now(&pods(&["p1"])).is_empty());
    assert_eq!(m.blocked_now(&pods(&["p1", "p2"])).len(), 1);
    assert!(m.conflict_seen("s"));
    assert!(!m.conflict_seen("s"));
    m.keep_conflicts_only(&Vec::<String>::new());
    assert!(m.conflict_seen("s"), "a conflict that ended and came back");
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
fn node_writes_back_off_to_a_minute() {
    let mut m = Memory::default();
    let t0 = Instant::now();
    for _ in 0..10 {
        m.node_sync_failed(t0);
    }
    assert_eq!(m.node_sync_due, Some(t0 + Duration::from_secs(60)));
    m.node_synced();
    assert_eq!((m.node_sync_due, m.node_sync_failures), (None, 0));
}

/// A plan of uninstalls of `names` (the test needs no Shim objects).
fn plan_of(names: &[&str]) -> NodePlan {
    NodePlan {
        changes: names
            .iter()
            .map(|n| Change::Uninstall(n.to_string()))
            .collect(),
        ..NodePlan::default()
    }
}

fn names_of(plan: &NodePlan) -> Vec<&str> {
    plan.changes.iter().map(change_name).collect()
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
