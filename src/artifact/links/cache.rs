//! `/etc/ld.so.cache` as glibc's loader reads it (`elf/dl-cache.c`, `sysdeps/generic/dl-cache.h`),
//! and the text of `/etc/ld.so.conf` as `ldconfig` reads it (`elf/ldconfig.c`, `parse_conf`).
//!
//! The cache comes in two layouts:
//! - new (glibc ≥ 2.32 writes only this): `glibc-ld.so.cache1.1`, a 48-byte header (`nlibs` at
//!   20, `len_strings` at 24, an endianness flag at 28), then `nlibs` entries of 24 bytes
//!   (`flags: i32, key: u32, value: u32, osversion: u32, hwcap: u64`); `key` and `value` are
//!   offsets from the start of that header;
//! - old (`ld.so-1.7.0`, then `nlibs`, then 12-byte entries `flags, key, value` whose offsets
//!   count from the end of the entries); glibc ≤ 2.31 writes it with a new-format cache
//!   right after the entries, aligned to 8, which is then the one used.
//!
//! Guarantees: nothing here panics on any input; every offset is checked; strings are
//! borrowed from the cache's bytes, at most `PATH_MAX` long; the entry count is capped.
//! The module uses nothing of the crate (the `elf_links` fuzz target compiles it on its own).

use std::collections::HashMap;

const OLD_MAGIC: &[u8] = b"ld.so-1.7.0";
const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
const OLD_HEADER: usize = 16;
const OLD_ENTRY: usize = 12;
const NEW_HEADER: usize = 48;
const NEW_ENTRY: usize = 24;
/// At most this many entries are indexed (real caches hold a few thousand).
pub const MAX_CACHE_ENTRIES: usize = 1 << 18;
/// The longest key or value (`PATH_MAX`).
const MAX_STRING_BYTES: usize = 4096;
/// The entry's type bits (`FLAG_TYPE_MASK`) and the ELF libc6 type (`FLAG_ELF_LIBC6`).
pub const FLAG_TYPE_MASK: i32 = 0x00ff;
pub const FLAG_ELF_LIBC6: i32 = 0x0003;

/// One usable entry: its flags, where the library is, and its hwcap bits (0 for the
/// directories every CPU searches).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheEntry<'a> {
    pub flags: i32,
    pub value: &'a [u8],
    pub hwcap: u64,
}

/// A parsed cache: its entries by key (the soname), in the file's order.
#[derive(Debug, Default)]
pub struct LdCache<'a> {
    by_key: HashMap<&'a [u8], Vec<CacheEntry<'a>>>,
}

impl<'a> LdCache<'a> {
    /// Parse a cache file. `big_endian` is used when the file does not say (the old format,
    /// and new-format caches written before glibc 2.33 recorded it).
    pub fn parse(bytes: &'a [u8], big_endian: bool) -> Result<Self, String> {
        if bytes.starts_with(OLD_MAGIC) {
            let nlibs = read_u32(bytes, 12, big_endian).ok_or("the cache header is truncated")?;
            let nlibs = fits(bytes.len(), OLD_HEADER, OLD_ENTRY, nlibs)?;
            let end = OLD_HEADER + nlibs * OLD_ENTRY;
            let new_at = end.next_multiple_of(8);
            if let Some(new) = bytes.get(new_at..)
                && new.len() >= NEW_HEADER
                && new.starts_with(NEW_MAGIC)
            {
                return Self::parse_new(new, big_endian);
            }
            return Ok(Self::parse_old(bytes, nlibs, end, big_endian));
        }
        if bytes.starts_with(NEW_MAGIC) {
            return Self::parse_new(bytes, big_endian);
        }
        Err("not an ld.so.cache (no ld.so-1.7.0 or glibc-ld.so.cache1.1 magic)".into())
    }

    fn parse_old(bytes: &'a [u8], nlibs: usize, strings: usize, big_endian: bool) -> Self {
        let mut cache = LdCache::default();
        for i in 0..nlibs {
            let at = OLD_HEADER + i * OLD_ENTRY;
            let field = |k: usize| read_u32(bytes, at + 4 * k, big_endian);
            let (Some(flags), Some(key), Some(value)) = (field(0), field(1), field(2)) else {
                continue;
            };
            let string = |off: u32| cstr_at(bytes, strings.checked_add(off as usize)?);
            cache.add(flags as i32, string(key), string(value), 0);
        }
        cache
    }

    fn parse_new(bytes: &'a [u8], default_big: bool) -> Result<Self, String> {
        if bytes.len() < NEW_HEADER {
            return Err("the cache header is truncated".into());
        }
        // cache_file_new_flags_endian_{little,big} = 2, 3; 0 is "unset".
        let big_endian = match bytes[28] & 3 {
            2 => false,
            3 => true,
            _ => default_big,
        };
        let nlibs = read_u32(bytes, 20, big_endian).ok_or("the cache header is truncated")?;
        let nlibs = fits(bytes.len(), NEW_HEADER, NEW_ENTRY, nlibs)?;
        let mut cache = LdCache::default();
        for i in 0..nlibs {
            let at = NEW_HEADER + i * NEW_ENTRY;
            let field = |k: usize| read_u32(bytes, at + 4 * k, big_endian);
            let (Some(flags), Some(key), Some(value)) = (field(0), field(1), field(2)) else {
                continue;
            };
            let hwcap = read_u64(bytes, at + 16, big_endian).unwrap_or(0);
            let string = |off: u32| cstr_at(bytes, off as usize);
            cache.add(flags as i32, string(key), string(value), hwcap);
        }
        Ok(cache)
    }

    fn add(&mut self, flags: i32, key: Option<&'a [u8]>, value: Option<&'a [u8]>, hwcap: u64) {
        if let (Some(key), Some(value)) = (key, value) {
            let entry = CacheEntry {
                flags,
                value,
                hwcap,
            };
            self.by_key.entry(key).or_default().push(entry);
        }
    }

    /// The number of distinct keys.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// True when the cache lists nothing.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Where the cache puts `name`: the first entry whose flags `accept` takes, preferring
    /// entries without hwcap bits (every CPU searches those; glibc-hwcaps subdirectories only
    /// some), as the loader's lookup returns one path.
    pub fn lookup(&self, name: &str, accept: impl Fn(i32) -> bool) -> Option<String> {
        let entries = self.by_key.get(name.as_bytes())?;
        let usable = || entries.iter().filter(|e| accept(e.flags));
        let best = usable()
            .find(|e| e.hwcap == 0)
            .or_else(|| usable().next())?;
        Some(String::from_utf8_lossy(best.value).into_owned())
    }
}

/// `nlibs` entries of `entry` bytes after a `header` must fit in `len` bytes (the check
/// dl-cache.c makes, without overflow), and stay under [`MAX_CACHE_ENTRIES`].
fn fits(len: usize, header: usize, entry: usize, nlibs: u32) -> Result<usize, String> {
    let nlibs = nlibs as usize;
    if (len - header) / entry < nlibs {
        return Err(format!(
            "the cache is corrupt: {nlibs} entries do not fit in {len} bytes"
        ));
    }
    if nlibs > MAX_CACHE_ENTRIES {
        return Err(format!(
            "the cache has {nlibs} entries, more than {MAX_CACHE_ENTRIES}"
        ));
    }
    Ok(nlibs)
}

fn read_u32(bytes: &[u8], at: usize, big_endian: bool) -> Option<u32> {
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big_endian {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    })
}

fn read_u64(bytes: &[u8], at: usize, big_endian: bool) -> Option<u64> {
    let b: [u8; 8] = bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(if big_endian {
        u64::from_be_bytes(b)
    } else {
        u64::from_le_bytes(b)
    })
}

/// The non-empty NUL-terminated string at `at`, if it ends within `PATH_MAX` bytes.
fn cstr_at(bytes: &[u8], at: usize) -> Option<&[u8]> {
    let rest = bytes.get(at..)?;
    let rest = rest.get(..rest.len().min(MAX_STRING_BYTES))?;
    let end = rest.iter().position(|&b| b == 0)?;
    let s = rest.get(..end)?;
    (!s.is_empty()).then_some(s)
}

/// One line of an `ld.so.conf` file, as `ldconfig`'s `parse_conf` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfLine {
    /// `include PATTERN...`: further files (globs, relative to the including file's directory).
    Include(Vec<String>),
    /// Directories whose libraries `ldconfig` caches.
    Dirs(Vec<String>),
}

/// Parse the text of an `ld.so.conf` file: comments (`#`) dropped, `include` lines, `hwcap`
/// lines ignored, and directories (several per line allowed, separated by blanks, `:` or `,`;
/// a legacy `=TYPE` suffix dropped).
pub fn parse_conf(text: &str) -> Vec<ConfLine> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        match words.next() {
            None => {}
            Some("include") => out.push(ConfLine::Include(words.map(str::to_string).collect())),
            Some("hwcap") => {}
            Some(_) => {
                let dirs = line
                    .split(|c: char| c.is_whitespace() || c == ':' || c == ',')
                    .filter_map(|d| d.split('=').next())
                    .filter(|d| !d.is_empty())
                    .map(str::to_string)
                    .collect();
                out.push(ConfLine::Dirs(dirs));
            }
        }
    }
    out
}

/// Whether `name` matches a glob component whose only wildcard is `*` (as glob(3) matches,
/// a leading `.` only by a leading `.`).
pub fn glob_match(pattern: &str, name: &str) -> bool {
    if name.starts_with('.') && !pattern.starts_with('.') {
        return false;
    }
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut pi, mut ni) = (0, 0);
    // The last `*` seen and where in `name` it started matching.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == '*'))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new-format cache with `entries` (flags, key, value, hwcap), strings after the table.
    pub(crate) fn new_cache(entries: &[(i32, &str, &str, u64)]) -> Vec<u8> {
        let mut head = NEW_MAGIC.to_vec();
        head.extend((entries.len() as u32).to_le_bytes());
        head.extend(0u32.to_le_bytes()); // len_strings: not read
        head.extend([2, 0, 0, 0]); // little endian
        head.resize(NEW_HEADER, 0);
        let mut strings = Vec::new();
        let base = NEW_HEADER + entries.len() * NEW_ENTRY;
        let mut table = Vec::new();
        for (flags, key, value, hwcap) in entries {
            let k = (base + strings.len()) as u32;
            strings.extend(key.as_bytes());
            strings.push(0);
            let v = (base + strings.len()) as u32;
            strings.extend(value.as_bytes());
            strings.push(0);
            table.extend(flags.to_le_bytes());
            table.extend(k.to_le_bytes());
            table.extend(v.to_le_bytes());
            table.extend(0u32.to_le_bytes());
            table.extend(hwcap.to_le_bytes());
        }
        [head, table, strings].concat()
    }

    /// An old-format cache of `old` entries, with `new` (a new-format cache) in its string
    /// table, as glibc ≤ 2.31's ldconfig writes by default.
    fn compat_cache(old: &[(i32, &str, &str)], new: &[u8]) -> Vec<u8> {
        let mut out = OLD_MAGIC.to_vec();
        out.push(0);
        out.extend((old.len() as u32).to_le_bytes());
        let end = OLD_HEADER + old.len() * OLD_ENTRY;
        let pad = end.next_multiple_of(8) - end;
        let mut strings = vec![0u8; pad];
        strings.extend(new);
        for (flags, key, value) in old {
            let k = strings.len() as u32;
            strings.extend(key.as_bytes());
            strings.push(0);
            let v = strings.len() as u32;
            strings.extend(value.as_bytes());
            strings.push(0);
            out.extend(flags.to_le_bytes());
            out.extend(k.to_le_bytes());
            out.extend(v.to_le_bytes());
        }
        out.extend(strings);
        out
    }

    const X86_64: i32 = 0x0303;

    #[test]
    fn a_new_format_cache_maps_sonames_to_paths() {
        let bytes = new_cache(&[
            (X86_64, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", 0),
            (0x0003, "libc.so.6", "/lib/i386-linux-gnu/libc.so.6", 0),
            (X86_64, "libseccomp.so.2", "/usr/lib/libseccomp.so.2", 0),
        ]);
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert_eq!(cache.len(), 2);
        let x86_64 = |f: i32| f == X86_64;
        assert_eq!(
            cache.lookup("libc.so.6", x86_64).as_deref(),
            Some("/lib/x86_64-linux-gnu/libc.so.6")
        );
        let i386 = |f: i32| f == 3;
        assert_eq!(
            cache.lookup("libc.so.6", i386).as_deref(),
            Some("/lib/i386-linux-gnu/libc.so.6")
        );
        assert_eq!(cache.lookup("libfoo.so.1", x86_64), None);
    }

    #[test]
    fn entries_without_hwcap_bits_win_over_hwcaps_subdirectories() {
        let v3 = 1u64 << 62;
        let bytes = new_cache(&[
            (
                X86_64,
                "libz.so.1",
                "/usr/lib/glibc-hwcaps/x86-64-v3/libz.so.1",
                v3,
            ),
            (X86_64, "libz.so.1", "/usr/lib/libz.so.1", 0),
            (
                X86_64,
                "libonly.so.1",
                "/usr/lib/glibc-hwcaps/x86-64-v3/libonly.so.1",
                v3,
            ),
        ]);
        let cache = LdCache::parse(&bytes, false).unwrap();
        let any = |_| true;
        assert_eq!(
            cache.lookup("libz.so.1", any).as_deref(),
            Some("/usr/lib/libz.so.1")
        );
        assert_eq!(
            cache.lookup("libonly.so.1", any).as_deref(),
            Some("/usr/lib/glibc-hwcaps/x86-64-v3/libonly.so.1")
        );
    }

    #[test]
    fn an_old_cache_carrying_a_new_one_is_read_through_the_new_one() {
        let new = new_cache(&[(X86_64, "libnew.so.1", "/lib/libnew.so.1", 0)]);
        let bytes = compat_cache(&[(X86_64, "libold.so.1", "/lib/libold.so.1")], &new);
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert_eq!(
            cache.lookup("libnew.so.1", |_| true).as_deref(),
            Some("/lib/libnew.so.1")
        );
        assert_eq!(cache.lookup("libold.so.1", |_| true), None);
    }

    #[test]
    fn an_old_cache_alone_is_read_from_its_own_entries() {
        let bytes = compat_cache(&[(3, "libold.so.1", "/lib/libold.so.1")], &[]);
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert_eq!(
            cache.lookup("libold.so.1", |f| f == 3).as_deref(),
            Some("/lib/libold.so.1")
        );
    }

    #[test]
    fn truncated_caches_are_refused_or_lose_only_the_cut_entries() {
        let bytes = new_cache(&[(X86_64, "libc.so.6", "/lib/libc.so.6", 0)]);
        for cut in 0..bytes.len() {
            match LdCache::parse(&bytes[..cut], false) {
                Err(_) => {}
                Ok(cache) => assert_eq!(cache.lookup("libc.so.6", |_| true), None, "cut {cut}"),
            }
        }
        assert!(LdCache::parse(b"glibc-ld.so.cache1.1", false).is_err());
        assert!(LdCache::parse(b"ld.so-1.7.0", false).is_err());
        assert!(LdCache::parse(b"\x7fELF", false).is_err());
    }

    #[test]
    fn hostile_counts_and_offsets_are_refused_or_skipped() {
        let mut bytes = new_cache(&[(X86_64, "libc.so.6", "/lib/libc.so.6", 0)]);
        bytes[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(
            LdCache::parse(&bytes, false)
                .unwrap_err()
                .contains("corrupt")
        );
        // key and value pointing past the end, and into the middle of nothing
        let mut bytes = new_cache(&[(X86_64, "libc.so.6", "/lib/libc.so.6", 0)]);
        bytes[NEW_HEADER + 4..NEW_HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert!(cache.is_empty());
        // a string without its NUL
        let mut bytes = new_cache(&[(X86_64, "libc.so.6", "/lib/libc.so.6", 0)]);
        bytes.pop();
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert!(cache.is_empty());
    }

    #[test]
    fn a_big_endian_cache_says_so_in_its_header() {
        let mut bytes = NEW_MAGIC.to_vec();
        bytes.extend(1u32.to_be_bytes());
        bytes.extend(0u32.to_be_bytes());
        bytes.extend([3, 0, 0, 0]);
        bytes.resize(NEW_HEADER, 0);
        let base = (NEW_HEADER + NEW_ENTRY) as u32;
        for v in [0x0403u32, base, base + 4, 0] {
            bytes.extend(v.to_be_bytes());
        }
        bytes.extend(0u64.to_be_bytes());
        bytes.extend(b"l.1\0/l\0");
        let cache = LdCache::parse(&bytes, false).unwrap();
        assert_eq!(cache.lookup("l.1", |f| f == 0x0403).as_deref(), Some("/l"));
    }

    #[test]
    fn the_hosts_own_cache_finds_libc() {
        let Ok(bytes) = std::fs::read("/etc/ld.so.cache") else {
            panic!("this test reads the host's /etc/ld.so.cache, which is missing (run ldconfig)");
        };
        let cache = LdCache::parse(&bytes, cfg!(target_endian = "big")).unwrap();
        let libc6 = |f: i32| f & FLAG_TYPE_MASK == FLAG_ELF_LIBC6;
        let libc = cache
            .lookup("libc.so.6", libc6)
            .expect("libc.so.6 in the cache");
        assert!(libc.ends_with("/libc.so.6"), "{libc}");
        assert!(std::path::Path::new(&libc).is_file(), "{libc}");
    }

    #[test]
    fn conf_lines_are_read_as_ldconfig_reads_them() {
        let text = "# comment\ninclude /etc/ld.so.conf.d/*.conf\n\n/usr/local/lib # more\n\
                    hwcap 0 nosegneg\n/opt/a:/opt/b, /opt/c=libc6\n";
        assert_eq!(
            parse_conf(text),
            vec![
                ConfLine::Include(vec!["/etc/ld.so.conf.d/*.conf".into()]),
                ConfLine::Dirs(vec!["/usr/local/lib".into()]),
                ConfLine::Dirs(vec!["/opt/a".into(), "/opt/b".into(), "/opt/c".into()]),
            ]
        );
    }

    #[test]
    fn globs_match_stars_only_and_not_hidden_files() {
        assert!(glob_match("*.conf", "libc.conf"));
        assert!(glob_match("*", "x"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("*.conf", "libc.conf.bak"));
        assert!(!glob_match("*.conf", ".hidden.conf"));
        assert!(!glob_match("a*b", "ac"));
    }
}
