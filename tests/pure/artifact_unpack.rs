//! Hostile archives: each is refused with the entry and the rule named, and the store
//! holds nothing new afterwards. Served over file:// (same pipeline as HTTP).
//!
//! Every rule is checked in every format the unpacker reads — tar, tar.gz, tar.zst and
//! tar.xz (`Format::ALL` in tests/support) — since one tar walk serves them all behind
//! different decoders; the stream-level cases (no tar inside, cut short, flipped bytes) in
//! the compressed ones.

use shim_agent::artifact::{
    ArtifactError, ArtifactSource, Fetcher, Limits, RetryPolicy, Store, StoredArtifact,
    find_shim_binary, node_platform,
};

use crate::support::*;

/// Fetch `bytes` with this sha256 into a fresh store.
async fn fetch(
    bytes: &[u8],
    sha256: String,
    limits: Limits,
) -> (tempfile::TempDir, Result<StoredArtifact, ArtifactError>) {
    let d = tempfile::tempdir().unwrap();
    let (url, _) = file_url(d.path(), "artifact", bytes);
    let s = Store::open(d.path().join("store")).unwrap();
    let f = Fetcher::new(limits, RetryPolicy::default()).unwrap();
    let src = ArtifactSource {
        location: url,
        sha256: Some(sha256),
    };
    let r = f.fetch_into_store(&src, &s).await;
    (d, r)
}

/// Fetch `bytes` (with their correct sha256) and expect `reason`; nothing may be left.
/// `what` (the format) is named in every failed assertion.
async fn refused_with(what: Format, bytes: &[u8], limits: Limits, reason: &str) -> ArtifactError {
    let d = tempfile::tempdir().unwrap();
    let (url, _) = file_url(d.path(), &format!("evil.{}", what.ext()), bytes);
    let s = Store::open(d.path().join("store")).unwrap();
    let before = snapshot(s.path());
    let outside_before = snapshot(d.path());
    let f = Fetcher::new(limits, RetryPolicy::default()).unwrap();
    let src = ArtifactSource {
        location: url,
        sha256: Some(sha256_hex(bytes)),
    };
    let e = f.fetch_into_store(&src, &s).await.unwrap_err();
    assert_eq!(e.reason(), reason, "{what:?}: {e}");
    assert!(!e.is_transient(), "{what:?}: {e}");
    assert_eq!(snapshot(s.path()), before, "{what:?}: store changed: {e}");
    assert_eq!(
        snapshot(d.path()),
        outside_before,
        "{what:?}: something appeared: {e}"
    );
    e
}

/// In every format, the archive `make` builds is refused with `reason` and a message that
/// holds each of `needles`.
async fn refused_in_every_format(
    make: impl Fn(Format) -> Vec<u8>,
    limits: Limits,
    reason: &str,
    needles: &[&str],
) {
    for what in Format::ALL {
        let e = refused_with(what, &make(what), limits.clone(), reason).await;
        let msg = e.to_string();
        for n in needles {
            assert!(msg.contains(n), "{what:?}: {n:?} not in: {msg}");
        }
    }
}

async fn unsafe_entry(entries: &[Entry], entry: &str, rule: &str) {
    let named = format!("{entry:?}");
    refused_in_every_format(
        |f| f.archive(entries),
        Limits::default(),
        "UnsafeArchiveEntry",
        &[&named, rule],
    )
    .await;
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
async fn setuid_and_setgid_files_are_refused() {
    for mode in [0o4755, 0o2755] {
        unsafe_entry(
            &[Entry::File("containerd-shim-demo-v2", real_elf(), mode)],
            "containerd-shim-demo-v2",
            "setuid/setgid",
        )
        .await;
    }
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
async fn a_name_longer_than_linux_takes_is_refused() {
    let long = "n".repeat(300);
    let entries = [Entry::LongName(long.clone().into_bytes(), b"x".to_vec())];
    refused_in_every_format(
        |f| f.archive(&entries),
        Limits::default(),
        "UnsafeArchiveEntry",
        &["a name of 300 bytes in the path, longer than the 255"],
    )
    .await;
}

#[tokio::test]
async fn a_10_gib_bomb_is_refused_from_its_header() {
    // Claims 10 GiB; only 4 MiB of zeros are really there, the header alone must stop it.
    for what in Format::COMPRESSED {
        let bomb = what.compress(&bomb_tar(10 << 30, 4 << 20));
        assert!(
            bomb.len() < (1 << 20),
            "{what:?}: bomb is {} bytes",
            bomb.len()
        );
    }
    refused_in_every_format(
        |f| f.compress(&bomb_tar(10 << 30, 4 << 20)),
        Limits::default(),
        "ArchiveTooLarge",
        &["containerd-shim-bomb-v2", "10737418240"],
    )
    .await;
}

#[tokio::test]
async fn a_file_over_the_per_file_cap_is_refused() {
    let entries = [shim(), Entry::File("big", vec![7u8; 3 << 20], 0o644)];
    let limits = Limits {
        max_file_bytes: 2 << 20,
        ..Limits::default()
    };
    refused_in_every_format(
        |f| f.archive(&entries),
        limits,
        "ArchiveTooLarge",
        &["\"big\"", "above the per-file limit of 2097152"],
    )
    .await;
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
    refused_in_every_format(
        |f| f.archive(&entries),
        limits,
        "ArchiveTooLarge",
        &["\"c\"", "would exceed the unpacked limit"],
    )
    .await;
}

#[tokio::test]
async fn zeros_after_the_archive_count_against_the_cap() {
    // A valid tiny archive followed, inside the same stream, by 32 MiB of zeros: a few KiB
    // compressed, 8 times the cap once decompressed.
    let mut tar = tar_bytes(&[shim()]);
    tar.extend(vec![0u8; 32 << 20]);
    for what in Format::COMPRESSED {
        let n = what.compress(&tar).len();
        assert!(n < (1 << 20), "{what:?}: {n} bytes compressed");
    }
    let limits = Limits {
        max_unpacked_bytes: 4 << 20,
        ..Limits::default()
    };
    refused_in_every_format(
        |f| f.compress(&tar),
        limits,
        "ArchiveTooLarge",
        &[
            "(data after the end of the archive)",
            "more than 4194304 bytes",
        ],
    )
    .await;
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
    refused_in_every_format(
        |f| f.archive(&entries),
        limits,
        "ArchiveTooLarge",
        &["more than 3 entries"],
    )
    .await;
}

#[tokio::test]
async fn a_huge_long_name_is_refused_before_it_is_held_in_memory() {
    // The tar crate reads a GNU long name whole into memory: 8 MiB of it must stop at the
    // header cap (1 MiB), not at the unpacked limit.
    let entries = [shim(), Entry::HugeLongName(8 << 20)];
    refused_in_every_format(
        |f| f.archive(&entries),
        Limits::default(),
        "ArchiveTooLarge",
        &["after containerd-shim-demo-v2", "bytes of tar headers"],
    )
    .await;
}

#[tokio::test]
async fn data_skipped_after_a_directory_counts_against_the_header_cap() {
    // A directory's data is never written, only skipped: 8 MiB of it still counts.
    let entries = [Entry::DirWithData("d/", 8 << 20), shim()];
    refused_in_every_format(
        |f| f.archive(&entries),
        Limits::default(),
        "ArchiveTooLarge",
        &["after d/", "skipped data"],
    )
    .await;
}

#[tokio::test]
async fn a_compressed_stream_without_a_tar_inside_is_not_an_archive() {
    for what in Format::COMPRESSED {
        let e = refused_with(
            what,
            &what.compress(b"just text"),
            Limits::default(),
            "NotAnArchive",
        )
        .await;
        let msg = e.to_string();
        assert!(msg.contains("does not hold a tar"), "{what:?}: {msg}");
        assert!(msg.contains("\"just text\""), "{what:?}: {msg}");
        assert!(msg.contains("tar.zst, tar.xz"), "{what:?}: {msg}");
    }
    let e = refused_with(
        Format::Tar,
        b"<html>not found</html>",
        Limits::default(),
        "NotAnArchive",
    )
    .await;
    assert!(e.to_string().contains("HTML page"), "{e}");
}

#[tokio::test]
async fn a_stream_cut_inside_an_entry_is_truncated() {
    // 1 MiB of noise: several zstd blocks and xz chunks, so the cut falls after the first.
    let mut data = real_elf();
    data.extend(noise(1 << 20));
    let tar = tar_bytes(&[
        Entry::File("containerd-shim-demo-v2", data, 0o755),
        Entry::File("README", b"x".to_vec(), 0o644),
    ]);
    for what in Format::ALL {
        let full = what.compress(&tar);
        // Cut in the middle of the shim's data: the header promised more.
        let cut = full.len() / 2;
        let e = refused_with(what, &full[..cut], Limits::default(), "TruncatedArchive").await;
        let msg = e.to_string();
        assert!(msg.contains("containerd-shim-demo-v2"), "{what:?}: {msg}");
        if what != Format::Tar {
            let codec = what.codec();
            assert!(
                msg.contains(&format!("the {codec} stream ends early")),
                "{what:?}: {msg}"
            );
        }
    }
}

#[tokio::test]
async fn a_plain_tar_cut_inside_a_header_is_truncated() {
    let tar = tar_bytes(&[shim(), Entry::File("README", b"x".to_vec(), 0o644)]);
    let readme_header = 512 + real_elf().len().div_ceil(512) * 512;
    let e = refused_with(
        Format::Tar,
        &tar[..readme_header + 100],
        Limits::default(),
        "TruncatedArchive",
    )
    .await;
    let msg = e.to_string();
    assert!(
        msg.contains("the tar data ends early at entry \"after containerd-shim-demo-v2\""),
        "{msg}"
    );
}

#[tokio::test]
async fn a_compressed_stream_missing_its_last_byte_is_truncated() {
    // The tar is whole, only the format's trailer (size, checksum, index) is cut.
    let tar = tar_bytes(&[shim()]);
    for what in Format::COMPRESSED {
        let full = what.compress(&tar);
        let e = refused_with(
            what,
            &full[..full.len() - 1],
            Limits::default(),
            "TruncatedArchive",
        )
        .await;
        assert!(e.to_string().contains("stream ends early"), "{what:?}: {e}");
    }
}

#[tokio::test]
async fn a_flipped_byte_in_the_compressed_stream_is_corrupt() {
    let tar = tar_bytes(&[shim(), Entry::File("payload", noise(64 << 10), 0o644)]);
    for what in Format::COMPRESSED {
        let codec = what.codec();
        // stored as it is where the format can: only its checksum catches the flip
        let mut bytes = what.store(&tar);
        let at = bytes.len() - (40 << 10); // inside the payload
        bytes[at] ^= 0x55;
        let e = refused_with(what, &bytes, Limits::default(), "CorruptArchive").await;
        assert!(
            e.to_string().contains(&format!("bad {codec} data")),
            "{what:?}: {e}"
        );
    }
}

/// A zstd frame header asking for a 2 GiB window (`--long=31`), and nothing after it.
fn zstd_with_a_2_gib_window() -> Vec<u8> {
    // magic, frame header descriptor (no size, no checksum), window log 10 + 21
    vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, 21 << 3]
}

/// An xz stream header and a block header whose LZMA2 dictionary is 1 GiB.
fn xz_with_a_1_gib_dictionary() -> Vec<u8> {
    let crc = |b: &[u8]| {
        let mut c = flate2::Crc::new();
        c.update(b);
        c.sum().to_le_bytes()
    };
    let mut v = vec![0xfd, b'7', b'z', b'X', b'Z', 0x00, 0x00, 0x01]; // CRC32 check
    v.extend(crc(&[0x00, 0x01]));
    // size (12 / 4 - 1), flags (one filter), LZMA2 (0x21), 1 property byte: 36 = 1 GiB
    let block = [0x02, 0x00, 0x21, 0x01, 36, 0, 0, 0];
    v.extend(block);
    v.extend(crc(&block));
    v.extend([0u8; 64]);
    v
}

#[tokio::test]
async fn a_zstd_window_or_xz_dictionary_over_128_mib_is_refused() {
    let e = refused_with(
        Format::Zst,
        &zstd_with_a_2_gib_window(),
        Limits::default(),
        "ArchiveTooLarge",
    )
    .await;
    let msg = e.to_string();
    assert!(
        msg.contains("(zstd stream header)") && msg.contains("2147483648-byte window"),
        "{msg}"
    );
    let e = refused_with(
        Format::Xz,
        &xz_with_a_1_gib_dictionary(),
        Limits::default(),
        "ArchiveTooLarge",
    )
    .await;
    let msg = e.to_string();
    assert!(
        msg.contains("(xz stream header)") && msg.contains("more than 128 MiB of memory"),
        "{msg}"
    );
}

#[tokio::test]
async fn bytes_after_the_archive_are_read_into_the_digest() {
    for what in Format::ALL {
        let mut bytes = what.archive(&[shim()]);
        bytes.extend_from_slice(b"\ntrailing bytes that are no part of the archive\n");
        // The digest of every byte matches: installed.
        let (_d, r) = fetch(&bytes, sha256_hex(&bytes), Limits::default()).await;
        let a = r.unwrap_or_else(|e| panic!("{what:?}: {e}"));
        assert_eq!(a.digest, sha256_hex(&bytes), "{what:?}");
        // The digest of the archive alone does not: the trailing bytes were hashed too.
        let n = bytes.len() - 48;
        let (_d, r) = fetch(&bytes, sha256_hex(&bytes[..n]), Limits::default()).await;
        let e = r.unwrap_err();
        assert_eq!(e.reason(), "DigestMismatch", "{what:?}: {e}");
    }
}

#[tokio::test]
async fn safe_links_and_modes_are_kept() {
    use std::os::unix::fs::PermissionsExt;
    for what in Format::ALL {
        let art = what.archive(&[
            Entry::Dir("bin/"),
            Entry::File("bin/containerd-shim-demo-v2", real_elf(), 0o775),
            Entry::Symlink("containerd-shim-demo-v2", "bin/containerd-shim-demo-v2"),
            Entry::Dir("doc/"),
            Entry::Symlink("doc/shim", "../bin/containerd-shim-demo-v2"),
            Entry::Hardlink("bin/copy", "bin/containerd-shim-demo-v2"),
            Entry::File("doc/README", b"hi".to_vec(), 0o600),
        ]);
        let (_d, r) = fetch(&art, sha256_hex(&art), Limits::default()).await;
        let a = r.unwrap_or_else(|e| panic!("{what:?}: {e}"));
        let mode = |p: &str| {
            std::fs::metadata(a.dir.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("bin/containerd-shim-demo-v2"), 0o755, "{what:?}");
        assert_eq!(mode("doc/README"), 0o644, "{what:?}");
        assert_eq!(std::fs::read(a.dir.join("doc/shim")).unwrap(), real_elf());
        assert_eq!(std::fs::read(a.dir.join("bin/copy")).unwrap(), real_elf());
    }
}

#[tokio::test]
async fn names_of_any_bytes_unpack_and_are_listed_when_no_shim_is_found() {
    // Non-ASCII, invalid UTF-8, control characters, and a long path: all unpack, and the
    // "no shim binary" error lists them, escaped, without panicking.
    let long: Vec<u8> = ["é".repeat(100), "🎉".repeat(50), "ü".repeat(100)]
        .join("/")
        .into_bytes();
    let entries = [
        Entry::RawName("файл-ü-🎉".as_bytes().to_vec(), b"1".to_vec(), 0o644),
        Entry::RawName(b"bin-\xff\xfe".to_vec(), b"2".to_vec(), 0o755),
        Entry::RawName(b"esc-\x1b[31m-\n".to_vec(), b"3".to_vec(), 0o644),
        Entry::LongName(long, b"4".to_vec()),
    ];
    for what in Format::ALL {
        let art = what.archive(&entries);
        let (_d, r) = fetch(&art, sha256_hex(&art), Limits::default()).await;
        let a = r.unwrap_or_else(|e| panic!("{what:?}: {e}"));
        let e = find_shim_binary(&a.dir, None, &node_platform().arch).unwrap_err();
        assert_eq!(e.reason(), "NoShimBinary", "{what:?}: {e}");
        let msg = e.to_string();
        assert!(msg.contains("\"файл-ü-🎉\""), "{what:?}: {msg}");
        assert!(msg.contains("\"bin-\u{fffd}\u{fffd}\""), "{what:?}: {msg}");
        assert!(msg.contains(r#""esc-\u{1b}[31m-\n""#), "{what:?}: {msg}");
        assert!(msg.contains("🎉🎉") && msg.contains('…'), "{what:?}: {msg}");
        assert!(
            !msg.contains('\n') && !msg.contains('\x1b'),
            "{what:?}: {msg}"
        );
    }
}

#[tokio::test]
async fn a_hostile_name_in_an_error_is_escaped_and_cut() {
    let mut name = b"\xff\xfe-".to_vec();
    name.extend("ж/".repeat(150).into_bytes());
    name.extend(b"../x");
    let entries = [Entry::LongName(name, b"x".to_vec())];
    for what in Format::ALL {
        let e = refused_with(
            what,
            &what.archive(&entries),
            Limits::default(),
            "UnsafeArchiveEntry",
        )
        .await;
        let msg = e.to_string();
        assert!(
            msg.starts_with("unsafe entry \"\u{fffd}\u{fffd}-ж/ж/"),
            "{what:?}: {msg}"
        );
        assert!(msg.contains("…(457 bytes)"), "{what:?}: {msg}");
        assert!(msg.contains("\"..\""), "{what:?}: {msg}");
    }
}
