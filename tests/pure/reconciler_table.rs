//! `run` with static Shims decides the shared failure table (tests/support/failure_table.rs)
//! as the cluster agent does (tests/kube/reconciler_table.rs): through the real daemon round,
//! the real transaction engine, and a scripted containerd.

use shim_agent::api::Shim;
use shim_agent::daemon::reconcile;
use shim_agent::reconciler::memory::{Memory, spec_key};

use crate::support::failure_table::{TABLE, break_state_dir};
use crate::support::live::*;

/// Rounds until the node settles (no round asked to follow at once), at most `most`.
const MOST_ROUNDS: usize = 8;

#[test]
fn the_static_daemon_decides_the_failure_table_as_the_agent_does() {
    for row in TABLE {
        let w = world();
        let f = row.containerd(fake(&w), "");
        let dir = w.root.resolve("/etc/shim-agent/shims.d").unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        let shims: Vec<Shim> = row
            .builders(&w, "")
            .into_iter()
            .map(|b| b.build())
            .collect();
        for (b, shim) in row.builders(&w, "").into_iter().zip(&shims) {
            std::fs::write(dir.join(format!("{}.yaml", shim.name())), b.yaml()).unwrap();
        }
        let n = node(&w, &f);
        let decided = block(async {
            let (store, mut state) = n.open().await.unwrap();
            let key_of = |name: &str| spec_key(shims.iter().find(|s| s.name() == name).unwrap());
            row.seed_crashes(&mut state, "", key_of);
            store.save(&state).unwrap();
            if row.unsaveable {
                break_state_dir(&w);
            }
            let mut memory = Memory::default();
            settle(&n, &store, &mut state, &mut memory).await;
            if row.removes() {
                for s in shims.iter().filter(|s| row.is_removed(s.name(), "")) {
                    std::fs::remove_file(dir.join(format!("{}.yaml", s.name()))).unwrap();
                }
                settle(&n, &store, &mut state, &mut memory).await;
            }
            let failing = memory.notes().into_iter().map(|(n, note)| (n, note.reason));
            let installed = state.shims.keys().cloned().collect();
            row.decided(installed, failing.collect(), &f, "")
        });
        assert_eq!(decided, row.expected(""), "{}", row.what);
    }
}

/// Daemon rounds until the node settles (no round asked to follow at once), at most
/// [`MOST_ROUNDS`].
async fn settle(
    n: &shim_agent::txn::Node<'_, &FakeContainerd, &FakeContainerd>,
    store: &shim_agent::state::StateStore,
    state: &mut shim_agent::state::NodeState,
    memory: &mut Memory,
) {
    for _ in 0..MOST_ROUNDS {
        let _ = reconcile(n, store, state, memory).await;
        if !(memory.wants_rerun() && memory.take_rerun()) {
            break;
        }
    }
}

#[test]
fn a_round_whose_crash_record_cannot_be_saved_does_not_begin_and_backs_off() {
    let w = world();
    let f = fake(&w);
    let dir = w.root.resolve("/etc/shim-agent/shims.d").unwrap();
    std::fs::create_dir_all(&dir).unwrap();
    let b = shim_builder(&w, "a", "1");
    std::fs::write(dir.join("a.yaml"), b.yaml()).unwrap();
    let n = node(&w, &f);
    block(async {
        let (store, mut state) = n.open().await.unwrap();
        // the state directory goes away under the agent (a full or read-only disk would
        // refuse the write the same way)
        let state_dir = w.root.resolve("/var/lib/shim-agent").unwrap();
        let moved = state_dir.with_extension("gone");
        std::fs::rename(&state_dir, &moved).unwrap();
        std::fs::write(&state_dir, "not a directory").unwrap();
        let mut memory = Memory::default();
        let e = reconcile(&n, &store, &mut state, &mut memory)
            .await
            .unwrap_err();
        assert!(format!("{e:#}").contains("crash isolation"), "{e:#}");
        assert_eq!(*f.restarts.borrow(), 0, "nothing on the host changed");
        assert!(state.shims.is_empty() && state.working.is_none());
        assert_eq!(memory.failing(), ["a"], "it backs off like any failure");
        assert!(
            memory.held(tokio::time::Instant::now()).contains("a"),
            "not retried in a loop"
        );
    });
}
