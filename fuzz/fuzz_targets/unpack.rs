//! Fuzz target `unpack`: arbitrary bytes through the artifact unpacker (`unpack_stream`) into
//! a fresh directory.
//!
//! The first byte picks how the rest is fed: as it is (0: the decoders and format detection
//! see raw bytes), or compressed here with gzip (1), zstd (2) or xz (3), so that the tar
//! walk behind each decoder gets arbitrary tars inside sound streams.
//!
//! Asserts: no panic; nothing appears beside the target directory; no path under it
//! resolves outside it.
//!
//! The unpacker's sources are included with `#[path]`, as config_edit does for the engine, so
//! that the sanitizer build does not compile the whole agent. `Limits` stands in for fetch.rs's
//! (which also holds the network's timeouts): the unpacker reads only these three fields.
#![no_main]

// The unpacker's modules at the crate root: to them `super` is this file, which provides
// `ArtifactError` and `Limits` as `src/artifact/mod.rs` does.
#[allow(dead_code)]
#[path = "../../src/artifact/elf.rs"]
mod elf;
#[allow(dead_code)]
#[path = "../../src/artifact/error.rs"]
mod error;
#[path = "../../src/artifact/format.rs"]
mod format;
#[path = "../../src/artifact/paths.rs"]
mod paths;
#[path = "../../src/artifact/unpack.rs"]
mod unpack;

use error::ArtifactError;

/// The unpacker's caps.
#[derive(Debug, Clone)]
pub struct Limits {
    pub max_unpacked_bytes: u64,
    pub max_file_bytes: u64,
    pub max_entries: u64,
}

use std::io::Write;
use std::path::Path;

use unpack::{UnpackOptions, unpack_stream};
use libfuzzer_sys::fuzz_target;

fn compress(how: u8, data: &[u8]) -> Vec<u8> {
    match how % 4 {
        1 => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(data).expect("gzip");
            e.finish().expect("gzip")
        }
        2 => ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest),
        3 => {
            let mut w = lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(0))
                .expect("xz");
            w.write_all(data).expect("xz");
            w.finish().expect("xz")
        }
        _ => data.to_vec(),
    }
}

/// Every path under `dest`, followed through links, stays under `dest` (or dangles).
fn assert_contained(dest: &Path) {
    let root = dest.canonicalize().expect("canonical dest");
    let mut todo = vec![dest.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if let Ok(real) = p.canonicalize() {
                assert!(real.starts_with(&root), "{} escapes", p.display());
            }
            if e.file_type().expect("file type").is_dir() {
                todo.push(p);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, rest)) = data.split_first() else {
        return;
    };
    let bytes = compress(how, rest);
    let parent = tempfile::tempdir().expect("tempdir");
    let dest = parent.path().join("dest");
    std::fs::create_dir(&dest).expect("dest");
    let limits = Limits {
        max_unpacked_bytes: 8 << 20,
        max_file_bytes: 4 << 20,
        max_entries: 256,
    };
    let opts = UnpackOptions {
        location: "fuzz",
        bare_name: "containerd-shim-fuzz-v2",
        limits: &limits,
    };
    let _ = unpack_stream(&bytes[..], &dest, &opts);
    let top: Vec<_> = std::fs::read_dir(parent.path())
        .expect("read parent")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(top, ["dest"], "something appeared beside dest");
    assert_contained(&dest);
});
