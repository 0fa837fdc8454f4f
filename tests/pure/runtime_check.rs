//! Installed is not working: the preflight of a new shim (its libraries, its `-v`) before any
//! restart, and the functional check after it (a sandbox through each new handler) before the
//! commit, against the scripted containerd. The same checks against real containerd 1.6 and
//! 2.3 are in `tests/node/check.rs`.

use shim_agent::state::{Phase, StateStore};

use crate::support::live::*;
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, Route, TEST_SHIM_ANSWER, TestServer, sha256_hex, static_elf, tar_gz};

/// A Shim `name` whose artifact holds `binary` as its shim.
pub(crate) fn shim_with_binary(w: &World, name: &str, binary: Vec<u8>) -> shim_agent::txn::Change {
    let bytes = tar_gz(&[Entry::File("containerd-shim-x-v2", binary, 0o755)]);
    let p = w.art.join(format!("{name}.tgz"));
    std::fs::write(&p, &bytes).unwrap();
    let s = ShimBuilder::new(name)
        .artifact(&format!("file://{}", p.display()), &sha256_hex(&bytes))
        .build();
    shim_agent::txn::Change::Install(Box::new(s))
}

/// A static x86-64 program that executes `ud2`: killed by SIGILL, as a shim built for a CPU
/// this one is not.
fn sigill_elf() -> Vec<u8> {
    let mut elf = static_elf("");
    let code_at = 64 + 56;
    elf[code_at] = 0x0f;
    elf[code_at + 1] = 0x0b;
    elf
}

#[test]
fn a_new_handler_is_proven_after_it_is_served_and_before_the_commit() {
    let w = world();
    let f = fake(&w);
    let report = block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    let phases: Vec<Phase> = report.phases.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        phases[phases.len() - 3..],
        [Phase::Verified, Phase::Proven, Phase::Committed]
    );
    assert_eq!(*f.proved.borrow(), [vec!["spin".to_string()]]);
    let st = state(&w);
    assert_eq!(
        st.shims["spin"].shim_version.as_deref(),
        Some("1.0.0"),
        "the preflight records what `-v` said ({TEST_SHIM_ANSWER:?})"
    );
}

#[test]
fn a_handler_that_cannot_run_a_sandbox_is_rolled_back_and_blamed_alone() {
    let w = world();
    let mut f = fake(&w);
    f.fail_checks = vec!["spin".into()];
    let e = block(node(&w, &f).apply(vec![shim(&w, "spin", "1"), shim(&w, "slight", "1")]))
        .unwrap_err();
    assert_eq!(e.reason(), "SandboxCheckFailed");
    assert_eq!(e.blamed.clone(), ["spin"]);
    let text = format!("{e:#}");
    assert!(
        text.contains("could not run a pod sandbox")
            && text.contains("unsupported protocol")
            && text.contains("rolled back"),
        "{text}"
    );
    assert_eq!(config(&w), w.original, "the config bytes are back");
    assert_eq!(*f.restarts.borrow(), 2, "the restart, and the rollback's");
    let st = state(&w);
    assert!(st.journal.is_none() && st.shims.is_empty(), "{st:?}");
    assert!(!f.serving.borrow().contains("spin"));
}

#[test]
fn the_check_container_of_a_shim_is_recorded_with_it_for_recovery_and_first_boot() {
    let w = world();
    let f = fake(&w);
    let s = shim_builder(&w, "wasm", "1")
        .check_container(
            "docker.io/library/hello:v1",
            &["/hello.wasm"],
            Some("hello"),
            30,
        )
        .build();
    block(node(&w, &f).apply(vec![shim_agent::txn::Change::Install(Box::new(s))])).unwrap();
    let check = state(&w).shims["wasm"].check.clone().unwrap();
    assert_eq!(
        (
            check.image.as_str(),
            check.command,
            check.output_contains,
            check.timeout_secs
        ),
        (
            "docker.io/library/hello:v1",
            vec!["/hello.wasm".to_string()],
            Some("hello".to_string()),
            30
        )
    );
}

#[test]
fn a_node_without_a_sandbox_image_is_told_before_anything_is_fetched_or_restarted() {
    let w = world();
    let mut f = fake(&w);
    f.no_sandbox_image = true;
    let e = block(node(&w, &f).apply(vec![shim(&w, "spin", "1"), shim(&w, "slight", "1")]))
        .unwrap_err();
    assert_eq!(e.reason(), "NoSandboxImage");
    let mut blamed = e.blamed.clone();
    blamed.sort();
    assert_eq!(blamed, ["slight", "spin"], "each Shim waits for the node");
    let text = format!("{e:#}");
    assert!(
        text.contains("no pod can run on it") && text.contains("not to blame"),
        "{text}"
    );
    assert_eq!(*f.restarts.borrow(), 0);
    assert!(f.proved.borrow().is_empty());
    assert_eq!(config(&w), w.original);
    let store = w.root.resolve("/var/lib/shim-agent/store/sha256").unwrap();
    assert!(
        !store.exists() || std::fs::read_dir(&store).unwrap().next().is_none(),
        "nothing was fetched"
    );
}

#[test]
fn a_shim_whose_libraries_are_missing_is_refused_before_any_restart() {
    let w = world();
    let f = fake(&w);
    // /bin/true needs its interpreter and libc.so.6, which the test's root does not have
    let e = block(node(&w, &f).apply(vec![
        shim_with_binary(&w, "spin", std::fs::read("/bin/true").unwrap()),
        shim(&w, "slight", "1"),
    ]))
    .unwrap_err();
    assert_eq!(e.reason(), "MissingLibraries");
    assert_eq!(e.blamed.clone(), ["spin"]);
    let text = format!("{e:#}");
    assert!(
        text.contains("libc.so.6") && text.contains("interpreter"),
        "each missing one is named: {text}"
    );
    assert_eq!(
        *f.restarts.borrow(),
        0,
        "no restart for a shim that cannot run"
    );
    assert_eq!(config(&w), w.original);
    assert!(state(&w).journal.is_none());
}

#[test]
fn a_shim_killed_by_its_own_cpu_instructions_is_refused_by_the_preflight() {
    let w = world();
    let f = fake(&w);
    let e =
        block(node(&w, &f).apply(vec![shim_with_binary(&w, "spin", sigill_elf())])).unwrap_err();
    assert_eq!(e.reason(), "ShimDoesNotRun");
    let text = format!("{e:#}");
    assert!(text.contains("SIGILL"), "{text}");
    assert_eq!(*f.restarts.borrow(), 0);
    assert_eq!(config(&w), w.original);
}

#[test]
fn a_recovery_at_verified_proves_again_before_it_commits() {
    let w = world();
    let f = fake(&w);
    block(node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap();
    // the same install, interrupted right after Verified: put the journal back as it was then
    let dir = w.root.resolve("/var/lib/shim-agent").unwrap();
    let store = StateStore::open(&dir).unwrap();
    let mut st = store.load().unwrap().state;
    let rec = st.shims.remove("spin").unwrap();
    let mut j = shim_agent::state::Journal::planned(
        "1-1".into(),
        shim_agent::state::TxnKind::Install,
        vec!["spin".into()],
    );
    j.phase = Phase::Verified;
    j.pending = vec![rec];
    st.journal = Some(j);
    store.save(&st).unwrap();
    drop(store);
    let sweeps = *f.sweeps.borrow();

    block(node(&w, &f).open()).unwrap();
    assert_eq!(
        *f.sweeps.borrow(),
        sweeps + 1,
        "leftover checks swept at start"
    );
    assert_eq!(
        f.proved.borrow().len(),
        2,
        "proven again: {:?}",
        f.proved.borrow()
    );
    let st = state(&w);
    assert!(st.journal.is_none() && st.shims.contains_key("spin"));
}

/// The process's count of failed runtime checks with `reason`
/// (`shim_agent_runtime_checks_total{result="failed",reason=…}`), as `/metrics` serves it.
fn failed_checks(reason: &str) -> u64 {
    let text = shim_agent::telemetry::metrics().encode();
    let want = format!("reason=\"{reason}\"");
    text.lines()
        .filter(|l| l.starts_with("shim_agent_runtime_checks_total{"))
        .filter(|l| l.contains("result=\"failed\"") && l.contains(&want))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_failed_preflight_is_counted_among_the_runtime_checks_by_its_reason() {
    // the registry is the process's: other tests count too, so only a rise is asserted (no
    // other path records this reason)
    let before = failed_checks("MissingLibraries");
    let w = world();
    let f = fake(&w);
    let e = block(node(&w, &f).apply(vec![shim_with_binary(
        &w,
        "spin",
        std::fs::read("/bin/true").unwrap(),
    )]))
    .unwrap_err();
    assert_eq!(e.reason(), "MissingLibraries");
    assert!(
        failed_checks("MissingLibraries") > before,
        "counted: {}",
        shim_agent::telemetry::metrics()
            .encode()
            .lines()
            .filter(|l| l.starts_with("shim_agent_runtime_checks"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    let before = failed_checks("ShimDoesNotRun");
    let e =
        block(node(&w, &f).apply(vec![shim_with_binary(&w, "slight", sigill_elf())])).unwrap_err();
    assert_eq!(e.reason(), "ShimDoesNotRun");
    assert!(failed_checks("ShimDoesNotRun") > before);
}

#[test]
fn log_directories_of_checks_a_crash_interrupted_are_removed_at_the_next_start() {
    let w = world();
    let f = fake(&w);
    let checks = w.root.resolve("/var/lib/shim-agent/checks").unwrap();
    for id in ["spin-18a2b3c4d5e6f708", "slight-18a2b3c4d5e6f709"] {
        std::fs::create_dir_all(checks.join(id)).unwrap();
        std::fs::write(checks.join(id).join("check.log"), "partial\n").unwrap();
    }
    block(node(&w, &f).open()).unwrap();
    assert_eq!(
        std::fs::read_dir(&checks).unwrap().count(),
        0,
        "every leftover log directory is gone"
    );

    // and a start with no checks directory at all is just a start
    std::fs::remove_dir(&checks).unwrap();
    block(node(&w, &f).open()).unwrap();
    assert!(!checks.exists());
}

#[test]
fn a_node_whose_containerd_no_build_fits_is_told_before_anything_is_fetched() {
    let w = world();
    let mut f = fake(&w);
    f.version = Some("1.6.20~ds1".into());
    let server = TestServer::start();
    let tgz = tar_gz(&[Entry::File(
        "containerd-shim-x-v2",
        crate::support::real_elf(),
        0o755,
    )]);
    server.route("/for-2.0.tgz", Route::ok(tgz.clone()));
    server.route("/for-2.3.tgz", Route::ok(tgz.clone()));
    let sha = sha256_hex(&tgz);
    let arch = shim_agent::artifact::node_platform().arch;
    let s = ShimBuilder::new("spin")
        .platform_for_containerd(
            "linux",
            &arch,
            ">=2.0, <2.3",
            &server.url("/for-2.0.tgz"),
            &sha,
        )
        .platform_for_containerd("linux", &arch, ">=2.3", &server.url("/for-2.3.tgz"), &sha)
        .build();
    let e =
        block(node(&w, &f).apply(vec![shim_agent::txn::Change::Install(Box::new(s))])).unwrap_err();
    assert_eq!(e.reason(), "NoBuildForContainerd", "{e:#}");
    assert_eq!(e.blamed.clone(), ["spin"]);
    let text = format!("{e:#}");
    assert!(
        text.contains("1.6.20") && text.contains(">=2.3"),
        "the node's version and the ranges offered: {text}"
    );
    assert_eq!(server.total_hits(), 0, "no build was asked for");
    let store = w.root.resolve("/var/lib/shim-agent/store/sha256").unwrap();
    assert!(
        !store.exists() || std::fs::read_dir(&store).unwrap().next().is_none(),
        "nothing was stored"
    );
    assert_eq!(*f.restarts.borrow(), 0);
    assert_eq!(config(&w), w.original);
    assert!(state(&w).journal.is_none());
}
