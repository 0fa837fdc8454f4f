//! Hostile archives: each is refused with the entry and the rule named, and the store
//! holds nothing new afterwards. Served over file:// (same pipeline as HTTP).

mod support;

use shim_agent::artifact::{ArtifactError, ArtifactSource, Fetcher, Limits, RetryPolicy, Store};
use support::*;

/// Fetch `bytes` (with their correct sha256) and expect `reason`; nothing may be left.
async fn refused_with(bytes: &[u8], limits: Limits, reason: &str) -> ArtifactError {
    let d = tempfile::tempdir().unwrap();
    let (url, _) = file_url(d.path(), "evil.tgz", bytes);
    let s = Store::open(d.path().join("store")).unwrap();
    let before = snapshot(s.path());
    let outside_before = snapshot(d.path());
    let f = Fetcher::new(limits, RetryPolicy::default()).unwrap();
    let src = ArtifactSource {
        location: url,
        sha256: Some(sha256_hex(bytes)),
    };
    let e = f.fetch_into_store(&src, &s).await.unwrap_err();
    assert_eq!(e.reason(), reason, "{e}");
    assert!(!e.is_transient(), "{e}");
    assert_eq!(snapshot(s.path()), before, "store changed: {e}");
    assert_eq!(
        snapshot(d.path()),
        outside_before,
        "something appeared: {e}"
    );
    e
}

async fn unsafe_entry(entries: &[Entry], entry: &str, rule: &str) {
    let e = refused_with(&tar_gz(entries), Limits::default(), "UnsafeArchiveEntry").await;
    let msg = e.to_string();
    assert!(
        msg.contains(&format!("{entry:?}")),
        "entry not named: {msg}"
    );
    assert!(msg.contains(rule), "rule not named: {msg}");
}

fn shim() -> Entry {
    Entry::File("containerd-shim-demo-v2", real_elf(), 0o755)
}

#[tokio::test]
async fn dotdot_paths_are_refused() {
    unsafe_entry(
        &[
            shim(),
            Entry::File("../../etc/passwd", b"root::0:0\n".to_vec(), 0o644),
        ],
        "../../etc/passwd",
        "\"..\"",
    )
    .await;
}

#[tokio::test]
async fn absolute_paths_are_refused() {
    unsafe_entry(
        &[Entry::File(
            "/etc/cron.d/evil",
            b"* * * * * root sh\n".to_vec(),
            0o644,
        )],
        "/etc/cron.d/evil",
        "absolute path",
    )
    .await;
}

#[tokio::test]
async fn a_symlink_to_etc_is_refused() {
    unsafe_entry(
        &[shim(), Entry::Symlink("etc", "/etc")],
        "etc",
        "symlink to absolute path \"/etc\"",
    )
    .await;
}

#[tokio::test]
async fn a_relative_symlink_climbing_out_is_refused() {
    unsafe_entry(
        &[Entry::Dir("a/"), Entry::Symlink("a/up", "../../..")],
        "a/up",
        "points outside the archive",
    )
    .await;
}

#[tokio::test]
async fn writing_through_a_symlink_is_refused() {
    // The link itself stays inside, but a later entry must not be written through it.
    unsafe_entry(
        &[
            Entry::Dir("real/"),
            Entry::Symlink("link", "real"),
            Entry::File("link/x", b"x".to_vec(), 0o644),
        ],
        "link/x",
        "passes through a symlink",
    )
    .await;
}

#[tokio::test]
async fn a_hardlink_outside_is_refused() {
    unsafe_entry(
        &[shim(), Entry::Hardlink("passwd", "/etc/passwd")],
        "passwd",
        "absolute path",
    )
    .await;
    unsafe_entry(
        &[shim(), Entry::Hardlink("shadow", "../../etc/shadow")],
        "shadow",
        "\"..\"",
    )
    .await;
}

#[tokio::test]
async fn device_nodes_and_fifos_are_refused() {
    unsafe_entry(&[Entry::CharDevice("null")], "null", "character device").await;
    unsafe_entry(&[Entry::Fifo("pipe")], "pipe", "fifo").await;
}

#[tokio::test]
async fn setuid_files_are_refused() {
    unsafe_entry(
        &[Entry::File("containerd-shim-demo-v2", real_elf(), 0o4755)],
        "containerd-shim-demo-v2",
        "setuid/setgid",
    )
    .await;
}

#[tokio::test]
async fn duplicate_entries_are_refused() {
    unsafe_entry(
        &[
            shim(),
            Entry::File("containerd-shim-demo-v2", b"#!/bin/sh\n".to_vec(), 0o755),
        ],
        "containerd-shim-demo-v2",
        "duplicate entry",
    )
    .await;
}

#[tokio::test]
async fn a_10_gib_bomb_is_refused_from_its_header() {
    // Claims 10 GiB; only 4 MiB of zeros are really there, the header alone must stop it.
    let bomb = bomb_tgz(10 << 30, 4 << 20);
    assert!(bomb.len() < (1 << 20), "bomb is {} bytes", bomb.len());
    let e = refused_with(&bomb, Limits::default(), "ArchiveTooLarge").await;
    let msg = e.to_string();
    assert!(
        msg.contains("containerd-shim-bomb-v2") && msg.contains("10737418240"),
        "{msg}"
    );
}

#[tokio::test]
async fn many_small_files_over_the_total_cap_are_refused() {
    let mb = vec![0u8; 1 << 20];
    let entries = [
        Entry::File("a", mb.clone(), 0o644),
        Entry::File("b", mb.clone(), 0o644),
        Entry::File("c", mb, 0o644),
    ];
    let limits = Limits {
        max_unpacked_bytes: (5 << 20) / 2,
        ..Limits::default()
    };
    let e = refused_with(&tar_gz(&entries), limits, "ArchiveTooLarge").await;
    assert!(e.to_string().contains("\"c\""), "{e}");
}

#[tokio::test]
async fn zeros_after_the_archive_count_against_the_cap() {
    // A valid tiny archive followed, inside the same gzip stream, by 8 MiB of zeros.
    let mut tar = tar_bytes(&[shim()]);
    tar.extend(vec![0u8; 8 << 20]);
    let limits = Limits {
        max_unpacked_bytes: 4 << 20,
        ..Limits::default()
    };
    refused_with(&gzip(&tar), limits, "ArchiveTooLarge").await;
}

#[tokio::test]
async fn too_many_entries_are_refused() {
    let entries: Vec<Entry> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| Entry::File(n, vec![], 0o644))
        .collect();
    let limits = Limits {
        max_entries: 3,
        ..Limits::default()
    };
    let e = refused_with(&tar_gz(&entries), limits, "ArchiveTooLarge").await;
    assert!(e.to_string().contains("more than 3 entries"), "{e}");
}

#[tokio::test]
async fn a_gzip_without_a_tar_inside_is_not_an_archive() {
    let e = refused_with(&gzip(b"just text"), Limits::default(), "NotAnArchive").await;
    assert!(e.to_string().contains("does not hold a tar"), "{e}");
}

#[tokio::test]
async fn safe_links_and_modes_are_kept() {
    let d = tempfile::tempdir().unwrap();
    let art = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", real_elf(), 0o775),
        Entry::Symlink("containerd-shim-demo-v2", "bin/containerd-shim-demo-v2"),
        Entry::Dir("doc/"),
        Entry::Symlink("doc/shim", "../bin/containerd-shim-demo-v2"),
        Entry::Hardlink("bin/copy", "bin/containerd-shim-demo-v2"),
        Entry::File("doc/README", b"hi".to_vec(), 0o600),
    ]);
    let (url, _) = file_url(d.path(), "ok.tgz", &art);
    let s = Store::open(d.path().join("store")).unwrap();
    let f = Fetcher::new(Limits::default(), RetryPolicy::default()).unwrap();
    let a = f
        .fetch_into_store(
            &ArtifactSource {
                location: url,
                sha256: Some(sha256_hex(&art)),
            },
            &s,
        )
        .await
        .unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(a.dir.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("bin/containerd-shim-demo-v2"), 0o755);
    assert_eq!(mode("doc/README"), 0o644);
    assert_eq!(std::fs::read(a.dir.join("doc/shim")).unwrap(), real_elf());
    assert_eq!(std::fs::read(a.dir.join("bin/copy")).unwrap(), real_elf());
}

#[tokio::test]
async fn a_plain_tar_cut_inside_an_entry_is_truncated() {
    let tar = tar_bytes(&[shim(), Entry::File("README", b"x".to_vec(), 0o644)]);
    // Cut in the middle of the shim's data: the header promised more.
    let cut = &tar[..512 + real_elf().len() / 2];
    let e = refused_with(cut, Limits::default(), "TruncatedArchive").await;
    assert!(e.to_string().contains("containerd-shim-demo-v2"), "{e}");
}
