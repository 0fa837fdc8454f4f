//! Fuzz target `elf_links`: arbitrary bytes through the link preflight's parsers: the ELF
//! reader (`read_ident`, `read_dyn_info`: header, program headers, `PT_DYNAMIC` and its
//! strings), the ld.so.cache parser (`LdCache::parse`, then lookups) and the `ld.so.conf`
//! text parser with its glob.
//!
//! The first byte picks how the rest is fed: raw to the ELF reader (0), behind a 64-bit (1) or
//! 32-bit (2) little-endian or a 64-bit big-endian (3) ELF ident, so that the header and
//! program-header walks get past the magic; raw to the cache parser (4), behind the new (5)
//! or old (6) cache magic; as `ld.so.conf` text (7).
//!
//! Asserts: no panic; what is read stays within the caps (`DT_NEEDED` count, string
//! lengths).
//!
//! The parsers' sources are included with `#[path]`, as the other targets do, so the fuzz
//! build does not compile the whole agent; both files use nothing of the crate.
#![no_main]

#[allow(dead_code)]
#[path = "../../src/artifact/links/cache.rs"]
mod cache;
#[allow(dead_code)]
#[path = "../../src/artifact/links/dynamic.rs"]
mod dynamic;

use libfuzzer_sys::fuzz_target;

/// `PATH_MAX` bytes, each at most a 3-byte replacement character once decoded.
const MAX_STRING_CHARS: usize = 3 * 4096;

fn check_elf(bytes: &[u8]) {
    let _ = dynamic::read_ident(bytes);
    if let Ok((_, info)) = dynamic::read_dyn_info(bytes) {
        assert!(info.needed.len() <= 4096, "{} DT_NEEDED", info.needed.len());
        let strings = info.needed.iter().chain(&info.interp).chain(&info.runpath);
        for s in strings.chain(&info.rpath).chain(&info.soname) {
            assert!(s.len() <= MAX_STRING_CHARS, "a string of {} bytes", s.len());
        }
        assert!(info.rpath.is_none() || info.runpath.is_none());
    }
}

fn check_cache(bytes: &[u8]) {
    for big_endian in [false, true] {
        if let Ok(cache) = cache::LdCache::parse(bytes, big_endian) {
            for name in ["libc.so.6", "a", ""] {
                if let Some(path) = cache.lookup(name, |_| true) {
                    assert!(path.len() <= MAX_STRING_CHARS);
                }
            }
        }
    }
}

fn check_conf(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for line in cache::parse_conf(&text) {
        if let cache::ConfLine::Include(patterns) = line {
            for p in patterns {
                let _ = cache::glob_match(&p, &text);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&how, rest)) = data.split_first() else {
        return;
    };
    let prefixed = |prefix: &[u8]| [prefix, rest].concat();
    match how % 8 {
        0 => check_elf(rest),
        1 => check_elf(&prefixed(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0")),
        2 => check_elf(&prefixed(b"\x7fELF\x01\x01\x01\0\0\0\0\0\0\0\0\0")),
        3 => check_elf(&prefixed(b"\x7fELF\x02\x02\x01\0\0\0\0\0\0\0\0\0")),
        4 => check_cache(rest),
        5 => check_cache(&prefixed(b"glibc-ld.so.cache1.1")),
        6 => check_cache(&prefixed(b"ld.so-1.7.0\0")),
        _ => check_conf(rest),
    }
});
