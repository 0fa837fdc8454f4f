//! The search order and its corners, on crafted x86-64 objects in temporary roots (the
//! real binaries are in `tests/pure/artifact_links.rs`).

use object::elf;

use super::dynamic::tests::build_elf;
use super::*;

const INTERP: &str = "/lib/ld.so";

/// A temporary root and a directory outside it for the binary (a real path, like the store).
struct Case {
    root_dir: tempfile::TempDir,
    bin_dir: tempfile::TempDir,
}

/// What an object names: `(tag, string)` dynamic entries.
type Names<'a> = &'a [(i64, &'a str)];

impl Case {
    /// A root holding a loader at [`INTERP`].
    fn new() -> Case {
        let case = Case {
            root_dir: tempfile::tempdir().unwrap(),
            bin_dir: tempfile::tempdir().unwrap(),
        };
        case.put_lib(INTERP, &[(elf::DT_SONAME, "ld.so")]);
        case
    }

    fn put(&self, host_path: &str, bytes: &[u8]) {
        let at = self.root_dir.path().join(host_path.trim_start_matches('/'));
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, bytes).unwrap();
    }

    fn put_lib(&self, host_path: &str, names: Names) {
        self.put(host_path, &build_elf(elf::EM_X86_64, None, names, &[]));
    }

    fn remove(&self, host_path: &str) {
        std::fs::remove_file(self.root_dir.path().join(host_path.trim_start_matches('/'))).unwrap();
    }

    /// Check a binary with `interp` that names `names` and has `values`.
    fn check_with(
        &self,
        interp: &str,
        names: Names,
        values: &[(i64, u64)],
    ) -> Result<LinkReport, ArtifactError> {
        let path = self.bin_dir.path().join("containerd-shim-test-v1");
        std::fs::write(
            &path,
            build_elf(elf::EM_X86_64, Some(interp), names, values),
        )
        .unwrap();
        check_links(&HostRoot::new(self.root_dir.path()).unwrap(), &path)
    }

    fn check(&self, names: Names) -> Result<LinkReport, ArtifactError> {
        self.check_with(INTERP, names, &[])
    }
}

fn paths(report: &LinkReport) -> Vec<(&str, &str)> {
    report
        .libraries
        .iter()
        .map(|l| (l.name.as_str(), l.path.as_str()))
        .collect()
}

fn missing(result: Result<LinkReport, ArtifactError>) -> Vec<String> {
    match result {
        Err(ArtifactError::MissingLibraries { missing, .. }) => missing,
        other => panic!("expected MissingLibraries, got {other:?}"),
    }
}

const NEEDED: i64 = elf::DT_NEEDED;

#[test]
fn rpath_is_inherited_by_dependencies_and_runpath_is_not() {
    let case = Case::new();
    case.put_lib("/opt/r/liba.so", &[(NEEDED, "libb.so")]);
    case.put_lib("/opt/r/libb.so", &[]);
    let report = case
        .check(&[(NEEDED, "liba.so"), (elf::DT_RPATH, "/opt/r")])
        .unwrap();
    assert_eq!(
        paths(&report),
        [("liba.so", "/opt/r/liba.so"), ("libb.so", "/opt/r/libb.so")]
    );
    let result = case.check(&[(NEEDED, "liba.so"), (elf::DT_RUNPATH, "/opt/r")]);
    assert_eq!(missing(result), ["libb.so"]);
}

#[test]
fn an_object_with_runpath_ignores_the_rpath_of_its_loaders() {
    let case = Case::new();
    case.put_lib(
        "/opt/r/liba.so",
        &[(NEEDED, "libb.so"), (elf::DT_RUNPATH, "/opt/elsewhere")],
    );
    case.put_lib("/opt/r/libb.so", &[]);
    let result = case.check(&[(NEEDED, "liba.so"), (elf::DT_RPATH, "/opt/r")]);
    assert_eq!(missing(result), ["libb.so"]);
}

#[test]
fn origin_in_a_library_found_on_the_host_is_its_host_directory() {
    let case = Case::new();
    case.put_lib(
        "/opt/a/liba.so",
        &[(NEEDED, "libb.so"), (elf::DT_RUNPATH, "$ORIGIN/sub")],
    );
    case.put_lib("/opt/a/sub/libb.so", &[]);
    let report = case
        .check(&[(NEEDED, "liba.so"), (elf::DT_RUNPATH, "/opt/a")])
        .unwrap();
    assert_eq!(report.libraries[1].path, "/opt/a/sub/libb.so");
}

#[test]
fn a_need_met_by_a_loaded_soname_is_not_searched_again() {
    let case = Case::new();
    // merged /usr: the default directory /lib (the loader's too) is a link into /usr/lib
    let root = case.root_dir.path();
    std::fs::create_dir_all(root.join("usr")).unwrap();
    std::fs::rename(root.join("lib"), root.join("usr/lib")).unwrap();
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    case.put_lib("/usr/lib/libx.so.1", &[(elf::DT_SONAME, "libalias.so")]);
    let report = case.check(&[(NEEDED, "libx.so.1"), (NEEDED, "libalias.so")]);
    assert_eq!(paths(&report.unwrap()), [("libx.so.1", "/lib/libx.so.1")]);
}

#[test]
fn nodeflib_skips_the_default_directories() {
    let case = Case::new();
    case.put_lib("/usr/lib/liba.so", &[]);
    assert!(case.check(&[(NEEDED, "liba.so")]).is_ok());
    let nodeflib = [(elf::DT_FLAGS_1, u64::from(elf::DF_1_NODEFLIB))];
    let result = case.check_with(INTERP, &[(NEEDED, "liba.so")], &nodeflib);
    assert_eq!(missing(result), ["liba.so"]);
}

#[test]
fn a_file_that_is_not_a_shared_object_stops_the_search() {
    let case = Case::new();
    case.put("/opt/r/liba.so", b"not an ELF file");
    case.put_lib("/usr/lib/liba.so", &[]);
    let result = case.check(&[(NEEDED, "liba.so"), (elf::DT_RUNPATH, "/opt/r")]);
    assert_eq!(
        missing(result),
        ["liba.so (/opt/r/liba.so: invalid ELF header)"]
    );
    let mut truncated = build_elf(elf::EM_X86_64, None, &[(NEEDED, "libz.so")], &[]);
    truncated.truncate(100);
    case.put("/opt/r/liba.so", &truncated);
    let result = missing(case.check(&[(NEEDED, "liba.so"), (elf::DT_RUNPATH, "/opt/r")]));
    assert!(
        result[0].starts_with("liba.so (/opt/r/liba.so: "),
        "{result:?}"
    );
}

#[test]
fn musl_answers_its_own_libc_names_and_reads_its_path_file() {
    let case = Case::new();
    let musl = "/lib/ld-musl-x86_64.so.1";
    case.put_lib(musl, &[]);
    case.put_lib("/opt/m/libfoo.so.1", &[]);
    let names = [
        (NEEDED, "libc.so"),
        (NEEDED, "libpthread.so.0"),
        (NEEDED, "libfoo.so.1"),
    ];
    assert_eq!(missing(case.check_with(musl, &names, &[])), ["libfoo.so.1"]);
    case.put("/etc/ld-musl-x86_64.path", b"/opt/m\n");
    let report = case.check_with(musl, &names, &[]).unwrap();
    assert_eq!(paths(&report), [("libfoo.so.1", "/opt/m/libfoo.so.1")]);
}

#[test]
fn an_interpreter_for_another_machine_is_reported() {
    let case = Case::new();
    case.put(INTERP, &build_elf(elf::EM_AARCH64, None, &[], &[]));
    assert_eq!(
        missing(case.check(&[])),
        ["interpreter /lib/ld.so (built for another machine)"]
    );
}

#[test]
fn cycles_and_shared_dependencies_are_examined_once() {
    let case = Case::new();
    case.put_lib("/usr/lib/liba.so", &[(NEEDED, "libb.so")]);
    case.put_lib(
        "/usr/lib/libb.so",
        &[(NEEDED, "liba.so"), (NEEDED, "ld.so")],
    );
    let report = case
        .check(&[(NEEDED, "liba.so"), (NEEDED, "libb.so")])
        .unwrap();
    let names: Vec<&str> = report.libraries.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["liba.so", "libb.so"]);
}

#[test]
fn missing_items_are_reported_once_in_the_order_first_needed() {
    let case = Case::new();
    case.put_lib(
        "/usr/lib/liba.so",
        &[(NEEDED, "libq.so"), (NEEDED, "libz.so")],
    );
    let names = [
        (NEEDED, "libz.so"),
        (NEEDED, "liba.so"),
        (NEEDED, "libz.so"),
    ];
    assert_eq!(missing(case.check(&names)), ["libz.so", "libq.so"]);
    case.remove(INTERP);
    let err = case.check(&names).unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("interpreter /lib/ld.so, libz.so, libq.so not found"),
        "{message}"
    );
}

#[test]
fn needed_paths_are_opened_as_given_and_relative_ones_are_not_found() {
    let case = Case::new();
    case.put_lib("/opt/p/libp.so", &[]);
    case.put_lib("/usr/lib/sub/libq.so", &[]);
    let report = case.check(&[(NEEDED, "/opt/p/libp.so")]).unwrap();
    assert_eq!(paths(&report), [("/opt/p/libp.so", "/opt/p/libp.so")]);
    assert_eq!(
        missing(case.check(&[(NEEDED, "sub/libq.so")])),
        ["sub/libq.so"]
    );
}

#[test]
fn more_objects_than_the_cap_are_refused() {
    let case = Case::new();
    let names: Vec<String> = (0..MAX_OBJECTS).map(|i| format!("lib{i}.so")).collect();
    for n in &names {
        case.put_lib(&format!("/usr/lib/{n}"), &[]);
    }
    let needed: Vec<(i64, &str)> = names.iter().map(|n| (NEEDED, n.as_str())).collect();
    match case.check(&needed) {
        Err(ArtifactError::NotExecutable { detail, .. }) => {
            assert!(detail.contains("more than 512"), "{detail}");
        }
        other => panic!("expected NotExecutable, got {other:?}"),
    }
    assert!(case.check(&needed[..MAX_OBJECTS - 1]).is_ok());
}

#[test]
fn a_hostile_search_is_cut_short_by_the_lookup_budget() {
    let case = Case::new();
    let runpath: Vec<String> = (0..700).map(|i| format!("/a{i}")).collect();
    let runpath = runpath.join(":");
    let names: Vec<String> = (0..200).map(|i| format!("lib{i}.so")).collect();
    let mut tags: Vec<(i64, &str)> = names.iter().map(|n| (NEEDED, n.as_str())).collect();
    tags.push((elf::DT_RUNPATH, &runpath));
    match case.check(&tags) {
        Err(ArtifactError::NotExecutable { detail, .. }) => {
            assert!(detail.contains("lookups"), "{detail}");
        }
        other => panic!("expected NotExecutable, got {other:?}"),
    }
    // a tenth of it is a search like any other
    assert_eq!(missing(case.check(&tags[180..])).len(), 20);
}
