//! Finding the shim binary in an unpacked artifact and installing it under /opt through a
//! HostRoot: candidates, architecture, modes, content addressing, no in-place rewrites.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use shim_agent::artifact::{find_shim_binary, node_platform, place_binary};
use shim_agent::hostroot::HostRoot;

use crate::support::*;

fn tree(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for (name, bytes) in files {
        let p = d.path().join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
    d
}

fn arch() -> String {
    node_platform().arch
}

#[test]
fn the_single_containerd_shim_file_is_found() {
    let d = tree(&[
        ("bin/containerd-shim-demo-v2", real_elf()),
        ("README.md", b"x".to_vec()),
    ]);
    let p = find_shim_binary(d.path(), None, &arch()).unwrap();
    assert_eq!(p, d.path().join("bin/containerd-shim-demo-v2"));
}

#[test]
fn no_candidate_lists_what_the_artifact_holds() {
    let d = tree(&[("bin/shim", real_elf()), ("README.md", b"x".to_vec())]);
    let e = find_shim_binary(d.path(), None, &arch()).unwrap_err();
    assert_eq!(e.reason(), "NoShimBinary");
    let msg = e.to_string();
    assert!(
        msg.contains("bin/shim") && msg.contains("README.md"),
        "{msg}"
    );
    assert!(msg.contains("runtime.binary"), "{msg}");
}

#[test]
fn two_candidates_are_ambiguous_unless_runtime_binary_picks_one() {
    let d = tree(&[
        ("containerd-shim-spin-v2", real_elf()),
        ("containerd-shim-slight-v1", real_elf()),
    ]);
    let e = find_shim_binary(d.path(), None, &arch()).unwrap_err();
    assert_eq!(e.reason(), "AmbiguousShimBinary");
    let msg = e.to_string();
    assert!(
        msg.contains("containerd-shim-spin-v2") && msg.contains("containerd-shim-slight-v1"),
        "{msg}"
    );
    let p = find_shim_binary(d.path(), Some("containerd-shim-spin-v2"), &arch()).unwrap();
    assert!(p.ends_with("containerd-shim-spin-v2"));
    let e = find_shim_binary(d.path(), Some("containerd-shim-other-v2"), &arch()).unwrap_err();
    assert_eq!(e.reason(), "NoShimBinary");
}

#[test]
fn a_binary_for_another_architecture_is_refused() {
    let d = tree(&[("containerd-shim-demo-v2", foreign_elf())]);
    let e = find_shim_binary(d.path(), None, &arch()).unwrap_err();
    assert_eq!(e.reason(), "WrongArchitecture");
    let msg = e.to_string();
    assert!(msg.contains(&format!("this node is {}", arch())), "{msg}");
}

#[test]
fn a_script_is_not_an_executable_elf() {
    let d = tree(&[("containerd-shim-demo-v2", b"#!/bin/sh\nexit 0\n".to_vec())]);
    let e = find_shim_binary(d.path(), None, &arch()).unwrap_err();
    assert_eq!(e.reason(), "NotExecutable");
}

fn placed_files(root: &Path) -> Vec<String> {
    snapshot(root)
}

#[test]
fn the_binary_is_installed_0755_at_its_content_addressed_path() {
    let art = tree(&[("containerd-shim-demo-v2", real_elf())]);
    let host = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.path()).unwrap();
    let digest = "ab".repeat(32);
    let bin = art.path().join("containerd-shim-demo-v2");
    let placed = place_binary(&root, "demo", &digest, &bin).unwrap();
    assert_eq!(
        placed.host_path,
        Path::new("/opt/shim-agent/shims/demo")
            .join(&digest)
            .join("containerd-shim-demo-v2")
    );
    assert!(!placed.already_present);
    let m = std::fs::metadata(&placed.local_path).unwrap();
    assert_eq!(m.permissions().mode() & 0o7777, 0o755);
    if std::fs::metadata("/proc/self").unwrap().uid() == 0 {
        assert_eq!((m.uid(), m.gid()), (0, 0));
    }
    assert_eq!(std::fs::read(&placed.local_path).unwrap(), real_elf());
    // nothing else: no temp files
    assert_eq!(
        std::fs::read_dir(placed.local_path.parent().unwrap())
            .unwrap()
            .count(),
        1
    );
}

#[test]
fn an_identical_installed_file_keeps_its_inode_and_a_different_one_is_replaced_by_rename() {
    let art = tree(&[("containerd-shim-demo-v2", real_elf())]);
    let host = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.path()).unwrap();
    let digest = "cd".repeat(32);
    let bin = art.path().join("containerd-shim-demo-v2");
    let first = place_binary(&root, "demo", &digest, &bin).unwrap();
    let ino = std::fs::metadata(&first.local_path).unwrap().ino();

    let again = place_binary(&root, "demo", &digest, &bin).unwrap();
    assert!(again.already_present);
    assert_eq!(std::fs::metadata(&again.local_path).unwrap().ino(), ino);

    // Someone damaged the installed file: it is replaced by a new inode, not rewritten,
    // so a running shim holding the old one is unaffected.
    std::fs::write(&first.local_path, b"damaged").unwrap();
    let fixed = place_binary(&root, "demo", &digest, &bin).unwrap();
    assert!(!fixed.already_present);
    assert_ne!(std::fs::metadata(&fixed.local_path).unwrap().ino(), ino);
    assert_eq!(std::fs::read(&fixed.local_path).unwrap(), real_elf());
}

#[test]
fn a_failed_placement_leaves_nothing_under_opt() {
    let host = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.path()).unwrap();
    let before = placed_files(host.path());
    let missing = host.path().join("no-such-dir/containerd-shim-demo-v2");
    let e = place_binary(&root, "demo", &"ef".repeat(32), &missing).unwrap_err();
    assert_eq!(e.reason(), "IoError");
    assert_eq!(placed_files(host.path()), before);
}

#[test]
fn names_that_would_leave_the_shims_dir_are_refused() {
    let art = tree(&[("containerd-shim-demo-v2", real_elf())]);
    let host = tempfile::tempdir().unwrap();
    let root = HostRoot::new(host.path()).unwrap();
    let bin = art.path().join("containerd-shim-demo-v2");
    for (name, digest) in [("..", "ab"), ("demo", "../x"), ("a/b", "ab")] {
        let e = place_binary(&root, name, digest, &bin).unwrap_err();
        assert_eq!(e.reason(), "InvalidFetchSpec");
    }
    assert_eq!(placed_files(host.path()), Vec::<String>::new());
}

#[test]
fn trees_placed_side_by_side_on_a_fresh_host_all_arrive() {
    // a transaction places its trees in parallel, and on a fresh host each placement finds
    // /opt/shim-agent/shims missing: the one that creates it must not fail the others
    let src = tree(&[("containerd-shim-demo-v2", real_elf())]);
    let digest = "ab".repeat(32);
    for round in 0..40 {
        let host = tempfile::tempdir().unwrap();
        let root = HostRoot::new(host.path()).unwrap();
        let start = std::sync::Barrier::new(8);
        let results: Vec<_> = std::thread::scope(|s| {
            let placers: Vec<_> = (0..8)
                .map(|i| {
                    let (root, start, src) = (&root, &start, src.path());
                    let digest = digest.as_str();
                    s.spawn(move || {
                        start.wait();
                        shim_agent::artifact::place_tree(root, &format!("s{i}"), digest, src)
                    })
                })
                .collect();
            placers.into_iter().map(|p| p.join().unwrap()).collect()
        });
        for (i, r) in results.iter().enumerate() {
            assert!(r.is_ok(), "round {round}, placement {i}: {r:?}");
        }
        for i in 0..8 {
            let bin = host.path().join(format!(
                "opt/shim-agent/shims/s{i}/{digest}/containerd-shim-demo-v2"
            ));
            assert!(bin.is_file(), "round {round}: {} missing", bin.display());
        }
    }
}
