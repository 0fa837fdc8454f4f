//! Crash isolation, pure: a Shim that still makes the agent crash must not take the node down
//! with it. Under `Restart=on-failure` such a Shim would crash the agent on every start, and
//! every other Shim of the node would wait.
//!
//! - Before a round's risky steps (fetch, unpack, transaction, report) the agent records the
//!   Shims it works on, each with the spec it works on ([`begin`]), in the state store; the
//!   round's end clears it ([`end`]).
//! - At start, a record still there names the round the last process died in ([`count`]):
//!   each of its Shims gets a crash against that spec. A round of several Shims is then run
//!   one Shim at a time, so the next crash names the culprit alone.
//! - A Shim with [`CRASHES_TO_SET_ASIDE`] crashes at its current spec is set aside
//!   ([`set_aside`]): reported Failed with reason `AgentCrashed`, not worked on, until its
//!   spec changes. The other Shims keep converging.
//! - A round that ends normally for a Shim forgets its crashes ([`forget`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::state::{CrashRecord, NodeState, Working};

/// Crashes during a Shim's rounds, at one spec, after which it is set aside.
pub const CRASHES_TO_SET_ASIDE: u32 = 2;
/// The reason a set-aside Shim is reported with.
pub const REASON: &str = crate::api::names::reason::AGENT_CRASHED;

/// Record the round about to work on `shims` (name → spec key). Returns whether the state
/// changed (and must be saved before the risky steps).
pub fn begin(state: &mut NodeState, shims: BTreeMap<String, String>, now: u64) -> bool {
    if shims.is_empty() {
        return false;
    }
    if state.working.as_ref().is_some_and(|w| w.shims == shims) {
        return false;
    }
    state.working = Some(Working { shims, since: now });
    true
}

/// The round ended without a crash. Returns whether the state changed.
pub fn end(state: &mut NodeState) -> bool {
    state.working.take().is_some()
}

/// At start: count the round the last process died in, if any. Returns its Shims (to be run
/// one at a time when there were several).
pub fn count(state: &mut NodeState, now: u64) -> Vec<String> {
    let Some(w) = state.working.take() else {
        return Vec::new();
    };
    let alone = w.shims.len() == 1;
    for (name, key) in &w.shims {
        let rec = state
            .crashes
            .entry(name.clone())
            .or_insert_with(|| CrashRecord {
                spec_key: key.clone(),
                crashes: 0,
                alone: 0,
                last: now,
            });
        if rec.spec_key != *key {
            *rec = CrashRecord {
                spec_key: key.clone(),
                crashes: 0,
                alone: 0,
                last: now,
            };
        }
        rec.crashes += 1;
        rec.alone += u32::from(alone);
        rec.last = now;
    }
    w.shims.into_keys().collect()
}

/// The Shims set aside: [`CRASHES_TO_SET_ASIDE`] crashes at the spec `current` gives them now
/// (`None`: the Shim is gone, nothing to set aside).
pub fn set_aside(state: &NodeState, current: impl Fn(&str) -> Option<String>) -> BTreeSet<String> {
    state
        .crashes
        .iter()
        .filter(|(name, rec)| {
            rec.crashes >= CRASHES_TO_SET_ASIDE && current(name).as_deref() == Some(&rec.spec_key)
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Forget the crashes of `name` (its round ended normally, or its spec changed). Returns
/// whether the state changed.
pub fn forget(state: &mut NodeState, name: &str) -> bool {
    state.crashes.remove(name).is_some()
}

/// Forget the records of Shims whose spec changed or that are gone (`current`: the spec key
/// a Shim has now). Returns whether the state changed.
pub fn forget_stale(state: &mut NodeState, current: impl Fn(&str) -> Option<String>) -> bool {
    let before = state.crashes.len();
    state
        .crashes
        .retain(|name, rec| current(name).as_deref() == Some(&rec.spec_key));
    state.crashes.len() != before
}

/// What a person reads about a set-aside Shim.
pub fn message(rec: &CrashRecord) -> String {
    format!(
        "the agent crashed {} times while working on this Shim at its current spec; it is set \
         aside until its spec changes (the other Shims go on); see the agent's journal",
        rec.crashes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn two_crashes_at_one_spec_set_a_shim_aside_until_its_spec_changes() {
        let mut st = NodeState::default();
        let spec = |k: &'static str| move |_: &str| Some(k.to_string());
        assert!(begin(&mut st, keys(&[("bad", "k1")]), 1));
        // the process died: the next start counts it
        assert_eq!(count(&mut st, 2), vec!["bad"]);
        assert!(
            set_aside(&st, spec("k1")).is_empty(),
            "one crash is not enough"
        );
        begin(&mut st, keys(&[("bad", "k1")]), 3);
        count(&mut st, 4);
        assert_eq!(
            set_aside(&st, spec("k1")),
            BTreeSet::from(["bad".to_string()])
        );
        assert_eq!(st.crashes["bad"].alone, 2);
        // a new spec is a new start
        assert!(set_aside(&st, spec("k2")).is_empty());
        assert!(forget_stale(&mut st, spec("k2")));
        assert!(st.crashes.is_empty());
    }

    #[test]
    fn a_round_that_ends_leaves_no_crash_and_a_batch_crash_counts_for_each() {
        let mut st = NodeState::default();
        begin(&mut st, keys(&[("a", "1")]), 1);
        assert!(end(&mut st));
        assert!(count(&mut st, 2).is_empty());
        assert!(st.crashes.is_empty());
        begin(&mut st, keys(&[("a", "1"), ("b", "1")]), 3);
        assert_eq!(count(&mut st, 4), vec!["a", "b"]);
        assert_eq!((st.crashes["a"].crashes, st.crashes["a"].alone), (1, 0));
        // a (innocent) then succeeds alone
        assert!(forget(&mut st, "a"));
        assert!(st.crashes.contains_key("b"));
    }

    #[test]
    fn the_same_round_again_needs_no_write() {
        let mut st = NodeState::default();
        assert!(begin(&mut st, keys(&[("a", "1")]), 1));
        assert!(!begin(&mut st, keys(&[("a", "1")]), 2));
        assert!(!begin(&mut st, BTreeMap::new(), 2));
    }
}
