//! Where the loader looks: the machine's names (multiarch triplets, `$PLATFORM`, `$LIB`,
//! the ld.so.cache flags it accepts), the default directories, dynamic string tokens in
//! `DT_RPATH`/`DT_RUNPATH`, musl's names and path file, and the files under the root that
//! say where libraries are (`/etc/ld.so.cache`, `/etc/ld.so.conf`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use object::elf;

use super::cache::{ConfLine, FLAG_ELF_LIBC6, FLAG_TYPE_MASK, glob_match, parse_conf};
use super::dynamic::Ident;
use crate::hostroot::HostRoot;

/// At most this many `ld.so.conf` files are read (includes included).
const MAX_CONF_FILES: usize = 256;
/// How deep `include` may nest.
const MAX_CONF_DEPTH: usize = 8;
/// The largest `ld.so.conf` or musl path file read.
const MAX_CONF_BYTES: u64 = 1024 * 1024;
/// The largest ld.so.cache read.
const MAX_CACHE_BYTES: u64 = 32 * 1024 * 1024;
/// Where glibc's cache is.
const CACHE_PATH: &str = "/etc/ld.so.cache";

/// A place a file may be: a host path (looked up under the root), or a real path of this
/// process (the binary's own directory and what `$ORIGIN` reaches from it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Loc {
    Host(String),
    Real(PathBuf),
}

impl Loc {
    /// `self` (a directory) joined with `name`.
    pub fn join(&self, name: &str) -> Loc {
        match self {
            Loc::Host(dir) => Loc::Host(format!("{}/{name}", dir.trim_end_matches('/'))),
            Loc::Real(dir) => Loc::Real(dir.join(name)),
        }
    }

    /// The directory holding `self`, as glibc computes `$ORIGIN`: the path as found, less its
    /// last component.
    pub fn parent(&self) -> Loc {
        match self {
            Loc::Host(p) => match p.rsplit_once('/') {
                Some(("", _)) | None => Loc::Host("/".into()),
                Some((dir, _)) => Loc::Host(dir.into()),
            },
            Loc::Real(p) => Loc::Real(p.parent().unwrap_or(Path::new("/")).to_path_buf()),
        }
    }

    /// The path this process opens, if the root can map it.
    pub fn local(&self, root: &HostRoot) -> Option<PathBuf> {
        match self {
            Loc::Host(p) => root.resolve(p).ok(),
            Loc::Real(p) => Some(p.clone()),
        }
    }

    /// How the report names it.
    pub fn display(&self) -> String {
        match self {
            Loc::Host(p) => p.clone(),
            Loc::Real(p) => p.display().to_string(),
        }
    }
}

/// The Debian/Ubuntu multiarch triplets of a machine (`/usr/lib/<triplet>`).
pub fn triplets(id: &Ident) -> &'static [&'static str] {
    match (id.machine, id.class64, id.big_endian) {
        (elf::EM_X86_64, true, _) => &["x86_64-linux-gnu"],
        (elf::EM_X86_64, false, _) => &["x86_64-linux-gnux32"],
        (elf::EM_386, _, _) => &["i386-linux-gnu"],
        (elf::EM_AARCH64, true, false) => &["aarch64-linux-gnu"],
        (elf::EM_ARM, false, false) => &["arm-linux-gnueabihf", "arm-linux-gnueabi"],
        (elf::EM_RISCV, true, _) => &["riscv64-linux-gnu"],
        (elf::EM_PPC64, true, false) => &["powerpc64le-linux-gnu"],
        (elf::EM_PPC64, true, true) => &["powerpc64-linux-gnu"],
        (elf::EM_S390, true, _) => &["s390x-linux-gnu"],
        (elf::EM_LOONGARCH, true, _) => &["loongarch64-linux-gnu"],
        (elf::EM_MIPS, true, false) => &["mips64el-linux-gnuabi64"],
        (elf::EM_MIPS, true, true) => &["mips64-linux-gnuabi64"],
        _ => &[],
    }
}

/// `$PLATFORM` (glibc's `AT_PLATFORM` string for the machine's usual CPU).
pub fn platform(id: &Ident) -> &'static str {
    match (id.machine, id.big_endian) {
        (elf::EM_X86_64, _) => "x86_64",
        (elf::EM_386, _) => "i686",
        (elf::EM_AARCH64, _) => "aarch64",
        (elf::EM_ARM, _) => "v7l",
        (elf::EM_RISCV, _) => "riscv64",
        (elf::EM_PPC64, false) => "powerpc64le",
        (elf::EM_PPC64, true) => "powerpc64",
        (elf::EM_S390, _) => "s390x",
        (elf::EM_LOONGARCH, _) => "loongarch64",
        (elf::EM_MIPS, _) => "mips64",
        _ => "unknown",
    }
}

/// What `$LIB` may stand for: `lib64` (64-bit) or `lib` (32-bit), and the multiarch
/// `lib/<triplet>` Debian's loader uses.
pub fn lib_tokens(id: &Ident) -> Vec<String> {
    let mut out = vec![if id.class64 { "lib64" } else { "lib" }.to_string()];
    out.extend(triplets(id).iter().map(|t| format!("lib/{t}")));
    out
}

/// glibc's default directories for the machine: the multiarch ones, `/lib64` and
/// `/usr/lib64` for 64-bit objects, then `/lib` and `/usr/lib`.
pub fn default_dirs(id: &Ident) -> Vec<Loc> {
    let mut dirs = Vec::new();
    for t in triplets(id) {
        dirs.push(format!("/lib/{t}"));
        dirs.push(format!("/usr/lib/{t}"));
    }
    if id.class64 {
        dirs.extend(["/lib64".into(), "/usr/lib64".into()]);
    }
    dirs.extend(["/lib".into(), "/usr/lib".into()]);
    dirs.into_iter().map(Loc::Host).collect()
}

/// Whether an ld.so.cache entry's flags are the ones glibc's loader for this machine accepts
/// (`_dl_cache_check_flags`: an ELF libc6 object, and the machine's `FLAG_*_LIB64` or ABI
/// bits where the port defines them).
pub fn cache_flags_fit(id: &Ident, flags: i32) -> bool {
    if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6 {
        return false;
    }
    let required = flags & 0xff00;
    match (id.machine, id.class64) {
        (elf::EM_X86_64, true) => required == 0x0300,
        (elf::EM_X86_64, false) => required == 0x0800,
        (elf::EM_386, _) => required == 0,
        (elf::EM_AARCH64, true) => required == 0x0a00,
        (elf::EM_ARM, false) => [0, 0x0900, 0x0b00].contains(&required),
        (elf::EM_RISCV, true) => [0x0f00, 0x1000].contains(&required),
        (elf::EM_PPC64, true) => required == 0x0500,
        (elf::EM_S390, true) => required == 0x0400,
        (elf::EM_LOONGARCH, true) => [0x1100, 0x1200].contains(&required),
        (elf::EM_MIPS, true) => [0x0700, 0x0e00].contains(&required),
        _ => true,
    }
}

/// The values of one search-path token set: `$ORIGIN` always, `$LIB` and `$PLATFORM` for
/// glibc (musl expands only `$ORIGIN`).
pub struct Tokens<'a> {
    pub origin: &'a Loc,
    pub lib: &'a [String],
    pub platform: Option<&'a str>,
}

/// Expand one `DT_RPATH`/`DT_RUNPATH` list (`:`-separated) into directories, as glibc's
/// `_dl_dst_substitute` does: `$NAME` or `${NAME}`; unknown names stay as they are; `$LIB`
/// yields one directory per value. Relative entries (the process's working directory, which
/// this check cannot know) are dropped.
pub fn expand_path_list(list: &str, tokens: &Tokens) -> Vec<Loc> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for entry in list.split(':') {
        let lib_values: Vec<Option<&str>> = if tokens.platform.is_some() && entry.contains("LIB") {
            tokens.lib.iter().map(|l| Some(l.as_str())).collect()
        } else {
            vec![None]
        };
        for lib in lib_values {
            if let Some(dir) = expand_entry(entry, tokens, lib)
                && seen.insert(dir.clone())
            {
                out.push(dir);
            }
        }
    }
    out
}

/// One entry with its tokens replaced; `None` when it is relative.
fn expand_entry(entry: &str, tokens: &Tokens, lib: Option<&str>) -> Option<Loc> {
    let origin = tokens.origin.display();
    let mut text = String::new();
    let mut used_origin = false;
    let mut chars = entry.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            text.push(c);
            continue;
        }
        let braced = chars.next_if_eq(&'{').is_some();
        let mut name = String::new();
        while let Some(n) = chars.next_if(|n| n.is_ascii_alphanumeric() || *n == '_') {
            name.push(n);
        }
        let closed = !braced || chars.next_if_eq(&'}').is_some();
        let value = match name.as_str() {
            _ if !closed => None,
            "ORIGIN" => {
                used_origin = true;
                Some(origin.as_str())
            }
            "LIB" => lib,
            "PLATFORM" => tokens.platform,
            _ => None,
        };
        match value {
            Some(v) => text.push_str(v),
            None => {
                text.push('$');
                text.push_str(if braced { "{" } else { "" });
                text.push_str(&name);
                text.push_str(if braced && closed { "}" } else { "" });
            }
        }
    }
    if !text.starts_with('/') {
        return None;
    }
    Some(match tokens.origin {
        Loc::Real(_) if used_origin => Loc::Real(PathBuf::from(text)),
        _ => Loc::Host(text),
    })
}

/// musl's loader is installed as `ld-musl-<arch>.so.1`.
pub fn is_musl_loader(interp: &str) -> bool {
    interp
        .rsplit('/')
        .next()
        .is_some_and(|n| n.starts_with("ld-musl-"))
}

/// The names musl's loader answers itself (`lib` + `c`, `pthread`, `rt`, `m`, `dl`, `util`,
/// `xnet` + `.`), as `load_library` does.
pub fn is_musl_self(name: &str) -> bool {
    let reserved = ["c.", "pthread.", "rt.", "m.", "dl.", "util.", "xnet."];
    name.strip_prefix("lib")
        .is_some_and(|rest| reserved.iter().any(|r| rest.starts_with(r)))
}

/// The root's ld.so.cache, if it is there and not too large.
pub fn read_cache(root: &HostRoot) -> Option<Vec<u8>> {
    let path = root.resolve(CACHE_PATH).ok()?;
    let meta = std::fs::metadata(&path).ok()?;
    if !meta.is_file() || meta.len() > MAX_CACHE_BYTES {
        return None;
    }
    std::fs::read(path).ok()
}

/// musl's search path: `/etc/ld-musl-<arch>.path` (directories separated by `:` or newlines)
/// if the root has it, else musl's built-in `/lib:/usr/local/lib:/usr/lib`.
pub fn musl_dirs(root: &HostRoot, interp: &str) -> Vec<Loc> {
    let name = interp.rsplit('/').next().unwrap_or_default();
    let arch = name
        .strip_prefix("ld-musl-")
        .and_then(|a| a.split(".so").next())
        .unwrap_or_default();
    let text = read_small(root, &format!("/etc/ld-musl-{arch}.path"));
    let list = text.as_deref().unwrap_or("/lib:/usr/local/lib:/usr/lib");
    list.split([':', '\n'])
        .map(str::trim)
        .filter(|d| d.starts_with('/'))
        .map(|d| Loc::Host(d.to_string()))
        .collect()
}

/// The directories `/etc/ld.so.conf` names (and the files it includes), in order.
pub fn conf_dirs(root: &HostRoot) -> Vec<Loc> {
    let mut dirs = Vec::new();
    let mut files = 0;
    read_conf(root, "/etc/ld.so.conf", 0, &mut files, &mut dirs);
    dirs.into_iter().map(Loc::Host).collect()
}

fn read_conf(root: &HostRoot, file: &str, depth: usize, files: &mut usize, out: &mut Vec<String>) {
    *files += 1;
    if depth > MAX_CONF_DEPTH || *files > MAX_CONF_FILES {
        return;
    }
    let Some(text) = read_small(root, file) else {
        return;
    };
    let here = Loc::Host(file.to_string()).parent().display();
    for line in parse_conf(&text) {
        match line {
            ConfLine::Dirs(dirs) => {
                for d in dirs.into_iter().filter(|d| d.starts_with('/')) {
                    if !out.contains(&d) {
                        out.push(d);
                    }
                }
            }
            ConfLine::Include(patterns) => {
                for pattern in patterns {
                    let pattern = if pattern.starts_with('/') {
                        pattern
                    } else {
                        format!("{}/{pattern}", here.trim_end_matches('/'))
                    };
                    for f in glob_files(root, &pattern) {
                        read_conf(root, &f, depth + 1, files, out);
                    }
                }
            }
        }
    }
}

/// The host paths matching `pattern`, whose last component may hold `*`, sorted.
fn glob_files(root: &HostRoot, pattern: &str) -> Vec<String> {
    let Some((dir, last)) = pattern.rsplit_once('/') else {
        return Vec::new();
    };
    if !last.contains('*') {
        return vec![pattern.to_string()];
    }
    let Some(entries) = root
        .resolve(if dir.is_empty() { "/" } else { dir })
        .ok()
        .and_then(|d| std::fs::read_dir(d).ok())
    else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .take(MAX_CONF_FILES)
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| glob_match(last, n))
        .collect();
    names.sort();
    names.into_iter().map(|n| format!("{dir}/{n}")).collect()
}

/// A small text file under the root, if it is there.
fn read_small(root: &HostRoot, host_path: &str) -> Option<String> {
    use std::io::Read;
    let file = std::fs::File::open(root.resolve(host_path).ok()?).ok()?;
    let mut text = String::new();
    file.take(MAX_CONF_BYTES).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const X86_64: Ident = Ident {
        class64: true,
        big_endian: false,
        machine: elf::EM_X86_64,
        e_type: elf::ET_DYN,
    };

    fn expand(list: &str, origin: Loc) -> Vec<Loc> {
        let lib = lib_tokens(&X86_64);
        let tokens = Tokens {
            origin: &origin,
            lib: &lib,
            platform: Some(platform(&X86_64)),
        };
        expand_path_list(list, &tokens)
    }

    #[test]
    fn origin_expands_to_the_objects_directory_of_its_kind() {
        let real = Loc::Real(PathBuf::from("/store/abc/bin"));
        assert_eq!(
            expand("$ORIGIN/../lib:/opt/x", real),
            vec![
                Loc::Real(PathBuf::from("/store/abc/bin/../lib")),
                Loc::Host("/opt/x".into())
            ]
        );
        let host = Loc::Host("/usr/lib".into());
        assert_eq!(
            expand("${ORIGIN}/sub", host),
            vec![Loc::Host("/usr/lib/sub".into())]
        );
    }

    #[test]
    fn lib_and_platform_expand_and_unknown_tokens_stay() {
        let origin = Loc::Host("/".into());
        assert_eq!(
            expand("/opt/$LIB/$PLATFORM:/x/$FOO:/y/${LIB}x:relative:", origin),
            vec![
                Loc::Host("/opt/lib64/x86_64".into()),
                Loc::Host("/opt/lib/x86_64-linux-gnu/x86_64".into()),
                Loc::Host("/x/$FOO".into()),
                Loc::Host("/y/lib64x".into()),
                Loc::Host("/y/lib/x86_64-linux-gnux".into()),
            ]
        );
        // `$LIBX` is no token
        assert_eq!(
            expand("/a/$LIBX", Loc::Host("/".into())),
            vec![Loc::Host("/a/$LIBX".into())]
        );
    }

    #[test]
    fn defaults_cover_multiarch_lib64_and_lib() {
        let dirs: Vec<String> = default_dirs(&X86_64).iter().map(Loc::display).collect();
        assert_eq!(
            dirs,
            [
                "/lib/x86_64-linux-gnu",
                "/usr/lib/x86_64-linux-gnu",
                "/lib64",
                "/usr/lib64",
                "/lib",
                "/usr/lib"
            ]
        );
    }

    #[test]
    fn cache_flags_must_be_libc6_for_the_machine() {
        assert!(cache_flags_fit(&X86_64, 0x0303));
        assert!(!cache_flags_fit(&X86_64, 0x0003));
        assert!(!cache_flags_fit(&X86_64, 0x0301));
        let i386 = Ident {
            class64: false,
            machine: elf::EM_386,
            ..X86_64
        };
        assert!(cache_flags_fit(&i386, 0x0003));
        assert!(!cache_flags_fit(&i386, 0x0303));
    }

    #[test]
    fn conf_includes_are_followed_relative_and_by_glob() {
        let d = tempfile::tempdir().unwrap();
        let root = HostRoot::new(d.path()).unwrap();
        std::fs::create_dir_all(d.path().join("etc/ld.so.conf.d")).unwrap();
        std::fs::write(
            d.path().join("etc/ld.so.conf"),
            "include ld.so.conf.d/*.conf\n/opt/last\n",
        )
        .unwrap();
        std::fs::write(d.path().join("etc/ld.so.conf.d/b.conf"), "/opt/b\n").unwrap();
        std::fs::write(d.path().join("etc/ld.so.conf.d/a.conf"), "/opt/a\n").unwrap();
        std::fs::write(d.path().join("etc/ld.so.conf.d/a.conf.off"), "/opt/no\n").unwrap();
        // an include of itself ends at the depth cap
        std::fs::write(d.path().join("etc/ld.so.conf.d/c.conf"), "include c.conf\n").unwrap();
        let dirs: Vec<String> = conf_dirs(&root).iter().map(Loc::display).collect();
        assert_eq!(dirs, ["/opt/a", "/opt/b", "/opt/last"]);
    }

    #[test]
    fn musl_reads_its_path_file_or_uses_its_defaults() {
        let d = tempfile::tempdir().unwrap();
        let root = HostRoot::new(d.path()).unwrap();
        let interp = "/lib/ld-musl-x86_64.so.1";
        let dirs: Vec<String> = musl_dirs(&root, interp).iter().map(Loc::display).collect();
        assert_eq!(dirs, ["/lib", "/usr/local/lib", "/usr/lib"]);
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/ld-musl-x86_64.path"), "/a:/b\n/c\n").unwrap();
        let dirs: Vec<String> = musl_dirs(&root, interp).iter().map(Loc::display).collect();
        assert_eq!(dirs, ["/a", "/b", "/c"]);
    }
}
