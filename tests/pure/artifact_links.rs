//! The link preflight (`artifact::check_links`) on real binaries: the host's `/bin/true` in
//! temporary roots that hold what its loader uses (found with `ldd`), and programs and a
//! shared library compiled here with `gcc`. Plus crafted and hostile files.

use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;
use shim_agent::artifact::{ArtifactError, LinkReport, check_links};
use shim_agent::hostroot::HostRoot;

/// The host paths `ldd` says `binary` loads: its interpreter, then `(name, path)` per library.
fn ldd(binary: &str) -> (String, Vec<(String, String)>) {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .expect("these tests need ldd (Debian's libc-bin) to learn what the host's loader uses");
    assert!(out.status.success(), "ldd {binary}: {out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    let mut interp = None;
    let mut libs = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some((name, rest)) = line.split_once(" => ") {
            let path = rest.split(" (").next().unwrap().to_string();
            libs.push((name.to_string(), path));
        } else if line.starts_with('/') {
            interp = Some(line.split(" (").next().unwrap().to_string());
        }
    }
    (interp.expect("ldd names an interpreter"), libs)
}

/// A temporary root holding copies of `/bin/true`'s interpreter and libraries at the same host
/// paths, with the host's ld.so.cache when `with_cache`.
struct Root {
    dir: tempfile::TempDir,
    interp: String,
    libs: Vec<(String, String)>,
}

impl Root {
    fn new(with_cache: bool) -> Root {
        let (interp, libs) = ldd("/bin/true");
        let root = Root {
            dir: tempfile::tempdir().unwrap(),
            interp,
            libs,
        };
        root.copy_in(&root.interp.clone());
        for (_, path) in root.libs.clone() {
            root.copy_in(&path);
        }
        if with_cache {
            root.copy_in("/etc/ld.so.cache");
        }
        root
    }

    /// Copy the host's file at `host_path` to the same path under the root.
    fn copy_in(&self, host_path: &str) {
        self.put(host_path, &std::fs::read(host_path).unwrap());
    }

    fn put(&self, host_path: &str, bytes: &[u8]) {
        let at = self.path(host_path);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, bytes).unwrap();
    }

    fn path(&self, host_path: &str) -> PathBuf {
        self.dir.path().join(host_path.trim_start_matches('/'))
    }

    fn libc(&self) -> String {
        let (_, path) = self
            .libs
            .iter()
            .find(|(n, _)| n == "libc.so.6")
            .expect("libc.so.6");
        path.clone()
    }

    fn check(&self, binary: &Path) -> Result<LinkReport, ArtifactError> {
        check_links(&HostRoot::new(self.dir.path()).unwrap(), binary)
    }
}

/// The `missing` list of a `MissingLibraries` error.
fn missing(result: Result<LinkReport, ArtifactError>) -> Vec<String> {
    match result {
        Err(ArtifactError::MissingLibraries { missing, .. }) => missing,
        other => panic!("expected MissingLibraries, got {other:?}"),
    }
}

fn names(report: &LinkReport) -> Vec<&str> {
    report.libraries.iter().map(|l| l.name.as_str()).collect()
}

#[test]
fn true_resolves_in_a_root_with_its_loader_libc_and_the_hosts_cache() {
    let root = Root::new(true);
    let report = root.check(Path::new("/bin/true")).unwrap();
    assert!(!report.is_static);
    assert_eq!(report.interpreter.as_deref(), Some(root.interp.as_str()));
    assert_eq!(names(&report), ["libc.so.6"]);
    assert_eq!(report.libraries[0].path, root.libc());
}

#[test]
fn true_resolves_through_the_default_directories_without_a_cache() {
    let root = Root::new(false);
    let report = root.check(Path::new("/bin/true")).unwrap();
    assert_eq!(names(&report), ["libc.so.6"]);
    assert!(root.path(&report.libraries[0].path).is_file());
}

#[test]
fn the_cache_is_what_finds_a_library_outside_the_default_directories() {
    let root = Root::new(false);
    let libc = root.libc();
    std::fs::rename(root.path(&libc), root.dir.path().join("libc-moved")).unwrap();
    root.put("/opt/odd/libc.so.6", &std::fs::read(&libc).unwrap());
    assert_eq!(missing(root.check(Path::new("/bin/true"))), ["libc.so.6"]);
    let flags = if cfg!(target_arch = "x86_64") {
        0x0303
    } else if cfg!(target_arch = "aarch64") {
        0x0a03
    } else {
        return eprintln!("SKIPPED: no cache flags known for this machine");
    };
    root.put(
        "/etc/ld.so.cache",
        &new_cache(&[(flags, "libc.so.6", "/opt/odd/libc.so.6")]),
    );
    let report = root.check(Path::new("/bin/true")).unwrap();
    assert_eq!(report.libraries[0].path, "/opt/odd/libc.so.6");
}

#[test]
fn true_without_libc_fails_naming_libc() {
    for with_cache in [true, false] {
        let root = Root::new(with_cache);
        std::fs::remove_file(root.path(&root.libc())).unwrap();
        let err = root.check(Path::new("/bin/true")).unwrap_err();
        assert_eq!(err.reason(), "MissingLibraries");
        let message = err.to_string();
        assert!(
            message.starts_with("/bin/true cannot run on this node: libc.so.6 not found"),
            "{message}"
        );
        assert!(message.contains("statically linked build"), "{message}");
        assert_eq!(missing(Err(err)), ["libc.so.6"], "with cache: {with_cache}");
    }
}

#[test]
fn true_without_its_interpreter_fails_naming_the_interpreter() {
    let root = Root::new(true);
    std::fs::remove_file(root.path(&root.interp)).unwrap();
    let expected = format!("interpreter {}", root.interp);
    assert_eq!(missing(root.check(Path::new("/bin/true"))), [expected]);
}

/// A tree built with gcc: `bin/prog` linked to `lib/libshimagenttest.so.1`, with `ldflags`.
struct Built {
    dir: tempfile::TempDir,
}

impl Built {
    fn new(ldflags: &[&str]) -> Built {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::create_dir_all(d.join("bin")).unwrap();
        std::fs::create_dir_all(d.join("lib")).unwrap();
        std::fs::write(d.join("lib.c"), "int shimagenttest(void) { return 42; }\n").unwrap();
        std::fs::write(
            d.join("main.c"),
            "int shimagenttest(void);\nint main(void) { return shimagenttest() == 42 ? 0 : 1; }\n",
        )
        .unwrap();
        gcc(
            d,
            &[
                "-shared",
                "-fPIC",
                "-Wl,-soname,libshimagenttest.so.1",
                "-o",
                "lib/libshimagenttest.so.1",
                "lib.c",
            ],
        );
        let mut args = vec![
            "-o",
            "bin/prog",
            "main.c",
            "-Llib",
            "-l:libshimagenttest.so.1",
        ];
        args.extend(ldflags);
        gcc(d, &args);
        Built { dir }
    }

    fn prog(&self) -> PathBuf {
        self.dir.path().join("bin/prog")
    }

    fn lib(&self) -> PathBuf {
        self.dir.path().join("lib/libshimagenttest.so.1")
    }
}

fn gcc(dir: &Path, args: &[&str]) {
    let out = Command::new("gcc")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("these tests need gcc (installed on CI machines)");
    assert!(
        out.status.success(),
        "gcc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const ORIGIN_RUNPATH: &str = "-Wl,-rpath,$ORIGIN/../lib";

#[test]
fn a_program_finds_its_library_through_origin_in_runpath_and_in_rpath() {
    for dtags in ["-Wl,--enable-new-dtags", "-Wl,--disable-new-dtags"] {
        let built = Built::new(&[ORIGIN_RUNPATH, dtags]);
        let status = Command::new(built.prog()).status().unwrap();
        assert!(status.success(), "the program itself runs ({dtags})");
        let report = Root::new(true).check(&built.prog()).unwrap();
        assert_eq!(
            names(&report),
            ["libshimagenttest.so.1", "libc.so.6"],
            "{dtags}"
        );
        let found = PathBuf::from(&report.libraries[0].path)
            .canonicalize()
            .unwrap();
        assert_eq!(found, built.lib().canonicalize().unwrap());
    }
}

#[test]
fn a_program_whose_library_is_gone_fails_naming_it() {
    let built = Built::new(&[ORIGIN_RUNPATH]);
    std::fs::remove_file(built.lib()).unwrap();
    let err = Root::new(true).check(&built.prog()).unwrap_err();
    assert!(
        err.to_string()
            .contains(&built.prog().display().to_string()),
        "{err}"
    );
    assert_eq!(missing(Err(err)), ["libshimagenttest.so.1"]);
}

#[test]
fn a_library_in_a_directory_of_ld_so_conf_is_found_without_a_cache() {
    let built = Built::new(&[]);
    let root = Root::new(false);
    root.put(
        "/opt/shimagent/lib/libshimagenttest.so.1",
        &std::fs::read(built.lib()).unwrap(),
    );
    std::fs::remove_file(built.lib()).unwrap();
    assert_eq!(
        missing(root.check(&built.prog())),
        ["libshimagenttest.so.1"]
    );
    root.put("/etc/ld.so.conf", b"include /etc/ld.so.conf.d/*.conf\n");
    root.put(
        "/etc/ld.so.conf.d/shimagent.conf",
        b"# ours\n/opt/shimagent/lib\n",
    );
    let report = root.check(&built.prog()).unwrap();
    assert_eq!(
        report.libraries[0].path,
        "/opt/shimagent/lib/libshimagenttest.so.1"
    );
}

/// A 64-byte ELF header of a shared object for another machine or class than this one.
fn foreign_header(class64: bool) -> Vec<u8> {
    let machine: u16 = match (class64, std::env::consts::ARCH) {
        (true, "aarch64") => 62,
        (true, _) => 183,
        (false, _) => 3,
    };
    let mut h = vec![0x7f, b'E', b'L', b'F', if class64 { 2 } else { 1 }, 1, 1];
    h.resize(16, 0);
    h.extend(3u16.to_le_bytes()); // ET_DYN
    h.extend(machine.to_le_bytes());
    h.resize(64, 0);
    h
}

#[test]
fn a_library_of_another_machine_or_class_does_not_meet_the_need() {
    for class64 in [true, false] {
        let built = Built::new(&[ORIGIN_RUNPATH]);
        let root = Root::new(true);
        // the real one only in a default directory, the foreign one first in line
        root.put(
            "/usr/lib/libshimagenttest.so.1",
            &std::fs::read(built.lib()).unwrap(),
        );
        std::fs::write(built.lib(), foreign_header(class64)).unwrap();
        let report = root.check(&built.prog()).unwrap();
        assert_eq!(report.libraries[0].path, "/usr/lib/libshimagenttest.so.1");
        std::fs::remove_file(root.path("/usr/lib/libshimagenttest.so.1")).unwrap();
        assert_eq!(
            missing(root.check(&built.prog())),
            ["libshimagenttest.so.1"],
            "class64 {class64}"
        );
    }
}

#[test]
fn static_programs_and_files_that_are_not_elf_have_nothing_to_resolve() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.c"), "int main(void) { return 0; }\n").unwrap();
    let built = Command::new("gcc")
        .current_dir(dir.path())
        .args(["-static", "-o", "static", "main.c"])
        .status()
        .is_ok_and(|s| s.success());
    // without libc.a, Debian's ldconfig (static-pie): only read, never run
    let binary = if built {
        dir.path().join("static")
    } else {
        PathBuf::from("/sbin/ldconfig")
    };
    assert!(
        binary.is_file(),
        "neither gcc -static (libc6-dev) nor /sbin/ldconfig is here"
    );
    let empty = tempfile::tempdir().unwrap();
    let root = HostRoot::new(empty.path()).unwrap();
    let report = check_links(&root, &binary).unwrap();
    assert!(report.is_static, "{}: {report:?}", binary.display());
    assert_eq!(report.interpreter, None);
    std::fs::write(dir.path().join("script"), "#!/bin/sh\nexit 0\n").unwrap();
    assert!(
        check_links(&root, &dir.path().join("script"))
            .unwrap()
            .is_static
    );
}

/// `/bin/true` with `edit` applied, written to a temp file.
fn edited_true(edit: impl FnOnce(&mut Vec<u8>)) -> (tempfile::TempDir, PathBuf) {
    let mut bytes = std::fs::read("/bin/true").unwrap();
    edit(&mut bytes);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("true");
    std::fs::write(&path, bytes).unwrap();
    (dir, path)
}

fn not_executable(result: Result<LinkReport, ArtifactError>) -> String {
    match result {
        Err(ArtifactError::NotExecutable { detail, .. }) => detail,
        other => panic!("expected NotExecutable, got {other:?}"),
    }
}

#[test]
fn a_truncated_elf_is_not_executable() {
    let root = Root::new(true);
    for len in [8, 40, 200] {
        let (_dir, path) = edited_true(|b| b.truncate(len));
        let detail = not_executable(root.check(&path));
        assert!(!detail.is_empty(), "cut at {len}");
    }
}

#[test]
fn an_elf_whose_dynamic_section_points_outside_the_file_is_not_executable() {
    assert_eq!(
        std::fs::read("/bin/true").unwrap()[4..6],
        [2, 1],
        "a 64-bit little-endian host"
    );
    let (_dir, path) = edited_true(|b| {
        let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as usize;
        let phoff = u64::from_le_bytes(b[32..40].try_into().unwrap()) as usize;
        let (size, count) = (u16_at(b, 54), u16_at(b, 56));
        let dynamic = (0..count)
            .map(|i| phoff + i * size)
            .find(|&at| b[at..at + 4] == 2u32.to_le_bytes())
            .expect("/bin/true has PT_DYNAMIC");
        b[dynamic + 8..dynamic + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    });
    let detail = not_executable(Root::new(true).check(&path));
    assert!(detail.contains("PT_DYNAMIC"), "{detail}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_bytes_never_panic_and_elf_looking_garbage_is_refused(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        magic in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let root = HostRoot::new(dir.path()).unwrap();
        let mut data = if magic { b"\x7fELF".to_vec() } else { Vec::new() };
        data.extend(&bytes);
        let path = dir.path().join("shim");
        std::fs::write(&path, &data).unwrap();
        let result = check_links(&root, &path);
        if !data.starts_with(b"\x7fELF") {
            prop_assert!(result.unwrap().is_static);
        } else if data.len() < 52 {
            prop_assert!(matches!(result, Err(ArtifactError::NotExecutable { .. })), "{result:?}");
        }
    }
}

/// A new-format ld.so.cache (little-endian) of `(flags, key, value)` entries.
fn new_cache(entries: &[(i32, &str, &str)]) -> Vec<u8> {
    let mut out = b"glibc-ld.so.cache1.1".to_vec();
    out.extend((entries.len() as u32).to_le_bytes());
    out.extend(0u32.to_le_bytes());
    out.extend([2, 0, 0, 0]);
    out.resize(48, 0);
    let mut strings = Vec::new();
    let base = 48 + 24 * entries.len();
    for (flags, key, value) in entries {
        let k = (base + strings.len()) as u32;
        strings.extend(key.bytes().chain([0]));
        let v = (base + strings.len()) as u32;
        strings.extend(value.bytes().chain([0]));
        for word in [*flags as u32, k, v, 0] {
            out.extend(word.to_le_bytes());
        }
        out.extend(0u64.to_le_bytes());
    }
    out.extend(strings);
    out
}
