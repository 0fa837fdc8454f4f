//! Property tests for the unpacker on generated hostile archives, in every format (tar,
//! tar.gz, tar.zst, tar.xz): whatever the entries (names with `..`, `/`, `.`, links in all
//! directions, duplicates), unpacking never panics, never touches anything outside its
//! target, and leaves no link that resolves outside it. Corrupted bytes never panic either,
//! whether the tar is corrupt inside a sound compressed stream or the compressed stream
//! itself is.

use std::path::Path;

use proptest::prelude::*;
use shim_agent::artifact::Limits;
use shim_agent::artifact::unpack::{UnpackOptions, unpack_stream};

use crate::support::Format;

#[derive(Debug, Clone)]
enum Kind {
    File,
    Dir,
    Symlink(String),
    Hardlink(String),
}

fn name() -> impl Strategy<Value = String> {
    let part = prop_oneof![
        Just("a"),
        Just("b"),
        Just(".."),
        Just("."),
        Just("outside"),
        Just("etc")
    ];
    (any::<bool>(), prop::collection::vec(part, 1..4)).prop_map(|(abs, parts)| {
        let joined = parts.join("/");
        if abs { format!("/{joined}") } else { joined }
    })
}

fn format() -> impl Strategy<Value = Format> {
    prop::sample::select(Format::ALL.to_vec())
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::File),
        Just(Kind::Dir),
        name().prop_map(Kind::Symlink),
        name().prop_map(Kind::Hardlink),
    ]
}

fn archive(entries: &[(String, Kind)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (n, k) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..n.len()].copy_from_slice(n.as_bytes());
        let (t, link) = match k {
            Kind::File => (tar::EntryType::Regular, None),
            Kind::Dir => (tar::EntryType::Directory, None),
            Kind::Symlink(l) => (tar::EntryType::Symlink, Some(l)),
            Kind::Hardlink(l) => (tar::EntryType::Link, Some(l)),
        };
        if let Some(l) = link {
            h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        let data: &[u8] = if matches!(k, Kind::File) {
            b"data"
        } else {
            b""
        };
        h.set_entry_type(t);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// Flip bytes and cut the end.
fn corrupt(
    mut bytes: Vec<u8>,
    flips: &[(prop::sample::Index, u8)],
    cut: &prop::sample::Index,
) -> Vec<u8> {
    for (i, b) in flips {
        let at = i.index(bytes.len());
        bytes[at] ^= b;
    }
    let keep = cut.index(bytes.len() + 1);
    bytes.truncate(keep);
    bytes
}

/// Every path under `dest`, followed through links, stays under `dest` (or dangles).
fn assert_contained(dest: &Path) {
    let root = dest.canonicalize().unwrap();
    let mut todo = vec![dest.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if let Ok(real) = p.canonicalize() {
                assert!(
                    real.starts_with(&root),
                    "{} resolves to {}",
                    p.display(),
                    real.display()
                );
            }
            if e.file_type().unwrap().is_dir() {
                todo.push(p);
            }
        }
    }
}

fn run(bytes: &[u8]) {
    let parent = tempfile::tempdir().unwrap();
    let dest = parent.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    std::fs::create_dir(parent.path().join("outside")).unwrap();
    std::fs::write(parent.path().join("outside/keep"), b"keep").unwrap();
    let limits = Limits::default();
    let opts = UnpackOptions {
        location: "generated",
        bare_name: "artifact",
        limits: &limits,
    };
    let _ = unpack_stream(bytes, &dest, &opts);
    let mut top: Vec<_> = std::fs::read_dir(parent.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    top.sort();
    assert_eq!(top, ["dest", "outside"]);
    assert_eq!(
        std::fs::read_dir(parent.path().join("outside"))
            .unwrap()
            .count(),
        1
    );
    assert_contained(&dest);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn generated_archives_never_escape(
        entries in prop::collection::vec((name(), kind()), 1..8),
        format in format(),
    ) {
        run(&format.compress(&archive(&entries)));
    }

    #[test]
    fn corrupted_archives_never_panic(
        entries in prop::collection::vec((name(), kind()), 1..4),
        format in format(),
        // corrupt the tar inside a sound stream, or the compressed stream itself
        inside in any::<bool>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let tar = archive(&entries);
        let bytes = if inside {
            format.compress(&corrupt(tar, &flips, &cut))
        } else {
            corrupt(format.compress(&tar), &flips, &cut)
        };
        run(&bytes);
    }
}
