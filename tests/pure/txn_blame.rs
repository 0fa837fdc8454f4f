//! A batch with one Shim whose change cannot be prepared (its artifact fails verification, it
//! has no shim binary, an option path names no file): the transaction blames that Shim alone,
//! by type, with its step's own reason; the agent sets it aside and the others go on together,
//! in one transaction with one restart.

use std::collections::{BTreeMap, BTreeSet};

use shim_agent::api::Shim;
use shim_agent::cluster::target::{Inputs, plan_node};
use shim_agent::reconciler::judge::{Ended, Judgement, judge};
use shim_agent::reconciler::memory::Memory;
use shim_agent::state::NodeState;
use shim_agent::txn::{Change, TxnError, real_work};
use tokio::time::Instant;

use crate::support::live::*;

/// The changes the agent plans for `cluster` on an unlabelled node, `held` held back.
fn planned(cluster: &[Shim], state: &NodeState, held: &BTreeSet<String>) -> Vec<Change> {
    let inputs = Inputs {
        node_labels: &BTreeMap::new(),
        cluster,
        statics: &[],
        statics_ok: true,
        state,
        pods: &[],
        held,
    };
    plan_node(&inputs).changes
}

/// The bad Shims, each with the reason its failure keeps.
fn bad_shims(w: &World) -> Vec<(Shim, &'static str)> {
    let good = shim_builder(w, "bad", "1");
    let location = format!("file://{}", w.art.join("bad-1.tgz").display());
    vec![
        (
            good.clone().artifact(&location, &"0".repeat(64)).build(),
            "DigestMismatch",
        ),
        (good.clone().binary("no-such-shim").build(), "NoShimBinary"),
        (
            good.option_path("ConfigPath", "no/such/file.toml").build(),
            "InvalidFetchSpec",
        ),
    ]
}

#[test]
fn one_bad_shim_in_a_batch_is_blamed_alone_and_the_others_go_on_together() {
    for i in 0..bad_shims(&world()).len() {
        let w = world();
        let f = fake(&w);
        let (bad, reason) = bad_shims(&w).swap_remove(i);
        let cluster = vec![
            shim_builder(&w, "alpha", "1").build(),
            bad,
            shim_builder(&w, "omega", "1").build(),
        ];
        let n = node(&w, &f);
        let (store, mut state) = block(n.open()).unwrap();
        let changes = planned(&cluster, &state, &BTreeSet::new());
        let work = real_work(&changes, &state, &n.host_facts(&state));
        assert_eq!(work, ["alpha", "bad", "omega"]);

        let e = block(n.apply_with(&store, &mut state, changes)).unwrap_err();
        let t: &TxnError = &e;
        assert_eq!(t.blamed, ["bad"], "{reason}: {e:#}");
        assert_eq!((t.reason(), t.phase), (reason, None), "{e:#}");
        assert_eq!(e.reason(), reason, "the step's own reason, as before");
        assert_eq!(*f.restarts.borrow(), 0);
        assert!(state.shims.is_empty() && state.journal.is_none());

        // the agent blames it alone: it is held back, the others go on together at once
        assert_eq!(
            judge(&work, &e.blamed.clone(), Ended::Failed),
            Judgement::Blame(vec!["bad".to_string()]),
            "{reason}"
        );
        let mut memory = Memory::default();
        let now = Instant::now();
        memory.failed("bad", cluster.get(1), reason, format!("{e:#}"), now);
        let held = memory.held(now);
        let mut plan = shim_agent::cluster::target::NodePlan {
            changes: planned(&cluster, &state, &held),
            ..Default::default()
        };
        let work = real_work(&plan.changes, &state, &n.host_facts(&state));
        memory.restrict_to_solo(&mut plan.changes, &work);
        assert_eq!(work, ["alpha", "omega"]);
        let report = block(n.apply_with(&store, &mut state, plan.changes)).unwrap();
        assert_eq!(report.installed, ["alpha", "omega"], "{reason}");
        assert_eq!(*f.restarts.borrow(), 1, "one transaction, one restart");
    }
}
