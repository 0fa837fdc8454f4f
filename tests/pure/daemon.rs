//! `run` without a cluster: static Shims from shims.d are installed, changed, removed and
//! repaired, with as few restarts as the changes need and none when nothing changed.

use shim_agent::daemon::reconcile_once;
use shim_agent::state::{Origin, ShimState, StateStore};
use shim_agent::statics::{adopt_pending, read_static_shims, static_changes};
use shim_agent::txn::Change;

use crate::support::live::*;

fn shims_d(w: &World) -> std::path::PathBuf {
    let d = w.root.resolve("/etc/shim-agent/shims.d").unwrap();
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Write a static Shim file for `name` at `version` (the artifact is made like `shim()` does).
fn put_static(w: &World, name: &str, version: &str) {
    let Change::Install(s) = shim(w, name, version) else {
        unreachable!()
    };
    let yaml = serde_yaml::to_string(&*s).unwrap();
    std::fs::write(shims_d(w).join(format!("{name}.yaml")), yaml).unwrap();
}

fn round(w: &World, f: &FakeContainerd) -> u32 {
    let n = node(w, f);
    block(async {
        let (store, mut state) = n.open().await.unwrap();
        reconcile_once(&n, &store, &mut state).await.unwrap()
    })
}

#[test]
fn static_shims_are_installed_changed_and_removed_with_one_restart_per_round() {
    let w = world();
    let f = fake(&w);
    put_static(&w, "spin", "1");
    put_static(&w, "wasmtime", "1");
    assert_eq!(round(&w, &f), 1, "two new Shims, one restart");
    assert!(f.serving.borrow().contains("spin") && f.serving.borrow().contains("wasmtime"));
    assert_eq!(state(&w).shims["spin"].origin, Origin::Static);

    assert_eq!(round(&w, &f), 0, "nothing changed: no restart");
    // an unrelated file in containerd's directory: still nothing to do
    std::fs::write(
        w.root.resolve("/etc/containerd/notes.txt").unwrap(),
        "hello",
    )
    .unwrap();
    assert_eq!(round(&w, &f), 0);

    put_static(&w, "spin", "2");
    std::fs::remove_file(shims_d(&w).join("wasmtime.yaml")).unwrap();
    assert_eq!(
        round(&w, &f),
        1,
        "an upgrade and a removal share one restart"
    );
    assert!(!f.serving.borrow().contains("wasmtime"));
    assert!(!state(&w).shims.contains_key("wasmtime"));
    assert_eq!(*f.restarts.borrow(), 2);
}

#[test]
fn drift_is_repaired_a_removed_handler_with_a_restart_a_deleted_binary_without() {
    let w = world();
    let f = fake(&w);
    put_static(&w, "spin", "1");
    round(&w, &f);
    let cfg_path = w.root.resolve("/etc/containerd/config.toml").unwrap();
    let installed_cfg = std::fs::read(&cfg_path).unwrap();

    // someone deletes the binary: it comes back from the store, containerd keeps running
    let bin = w.root.resolve(&state(&w).shims["spin"].binary).unwrap();
    std::fs::remove_file(&bin).unwrap();
    assert_eq!(round(&w, &f), 0, "config unchanged: no restart");
    assert!(bin.exists());

    // someone restores containerd's original config: the handler comes back
    std::fs::write(&cfg_path, &w.original).unwrap();
    assert_eq!(round(&w, &f), 1);
    assert_eq!(std::fs::read(&cfg_path).unwrap(), installed_cfg);
    assert!(f.serving.borrow().contains("spin"));
}

#[test]
fn a_broken_shim_file_blocks_removals_but_not_the_others() {
    let w = world();
    let f = fake(&w);
    put_static(&w, "spin", "1");
    round(&w, &f);
    std::fs::write(
        shims_d(&w).join("spin.yaml"),
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nspec: [",
    )
    .unwrap();
    put_static(&w, "wasmtime", "1");
    let (shims, errors) = read_static_shims(&shims_d(&w));
    assert_eq!(shims.len(), 1);
    assert!(errors[0].contains("spin.yaml"), "{errors:?}");
    assert_eq!(round(&w, &f), 1);
    let st = state(&w);
    assert!(
        st.shims.contains_key("spin"),
        "a broken file must not uninstall what it held"
    );
    assert!(st.shims.contains_key("wasmtime"));
}

#[test]
fn only_static_shims_are_removed_when_their_file_goes() {
    let w = world();
    let f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "cli-installed", "1")])).unwrap();
    let mut st = state(&w);
    st.shims.get_mut("cli-installed").unwrap().origin = Origin::Cli;
    let changes = static_changes(&[], &st, false);
    assert!(changes.is_empty(), "{changes:?}");
    st.shims.get_mut("cli-installed").unwrap().origin = Origin::Static;
    assert!(
        matches!(&static_changes(&[], &st, false)[..], [Change::Uninstall(n)] if n == "cli-installed")
    );
    assert!(static_changes(&[], &st, true).is_empty());
}

#[test]
fn offline_installs_are_adopted_once_containerd_serves_them() {
    let w = world();
    let f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    let dir = w.root.resolve("/var/lib/shim-agent").unwrap();
    {
        let store = StateStore::open(&dir).unwrap();
        let mut st = store.load().unwrap().state;
        st.shims.get_mut("spin").unwrap().state = ShimState::PendingVerification;
        store.save(&st).unwrap();
    }
    // containerd does not serve it yet (never restarted since the "image" was baked)
    f.serving.borrow_mut().remove("spin");
    let store = StateStore::open(&dir).unwrap();
    let mut st = store.load().unwrap().state;
    assert_eq!(block(adopt_pending(&&f, &store, &mut st)).unwrap(), 1);
    assert_eq!(st.shims["spin"].state, ShimState::PendingVerification);
    f.reread_config();
    assert_eq!(block(adopt_pending(&&f, &store, &mut st)).unwrap(), 0);
    assert_eq!(
        store.load().unwrap().state.shims["spin"].state,
        ShimState::Installed
    );
    assert_eq!(f.proved.borrow().last().unwrap(), &["spin".to_string()]);
}

#[test]
fn an_offline_install_that_cannot_run_a_sandbox_stays_pending_and_unadopted() {
    let w = world();
    let mut f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    let dir = w.root.resolve("/var/lib/shim-agent").unwrap();
    let store = StateStore::open(&dir).unwrap();
    let mut st = store.load().unwrap().state;
    st.shims.get_mut("spin").unwrap().state = ShimState::PendingVerification;
    store.save(&st).unwrap();
    // served by containerd, but its runtime cannot start a sandbox on this node
    f.fail_checks = vec!["spin".into()];
    assert_eq!(block(adopt_pending(&&f, &store, &mut st)).unwrap(), 1);
    assert_eq!(
        store.load().unwrap().state.shims["spin"].state,
        ShimState::PendingVerification,
        "a shim that does not work is never adopted"
    );
}
