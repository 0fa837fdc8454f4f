//! The ELF reader on crafted objects, and the builder the link tests craft them with.

use super::*;

/// A little-endian 64-bit ELF shared object or executable, one `PT_LOAD` mapping the whole
/// file at address 0: `interp`, then `(tag, string)` dynamic entries whose strings go to
/// the string table, then `(tag, value)` entries as they are.
pub(crate) fn build_elf(
    machine: u16,
    interp: Option<&str>,
    strings: &[(i64, &str)],
    values: &[(i64, u64)],
) -> Vec<u8> {
    let phnum: u16 = 3;
    let interp_at = 64 + 56 * u64::from(phnum);
    let interp_bytes = interp
        .map(|i| format!("{i}\0").into_bytes())
        .unwrap_or_default();
    let strtab_at = interp_at + interp_bytes.len() as u64;
    let mut strtab = vec![0u8];
    let mut dynamic = Vec::new();
    for (tag, s) in strings {
        dynamic.push((*tag, strtab.len() as u64));
        strtab.extend(s.as_bytes());
        strtab.push(0);
    }
    dynamic.push((elf::DT_STRTAB, strtab_at));
    dynamic.push((elf::DT_STRSZ, strtab.len() as u64));
    dynamic.extend(values);
    dynamic.push((elf::DT_NULL, 0));
    let dyn_at = (strtab_at + strtab.len() as u64).next_multiple_of(8);
    let dyn_len = 16 * dynamic.len() as u64;
    let total = dyn_at + dyn_len;
    let mut out = Vec::new();
    out.extend(elf::ELFMAG);
    out.extend([elf::ELFCLASS64, elf::ELFDATA2LSB, 1, 0]);
    out.resize(16, 0);
    out.extend(elf::ET_DYN.to_le_bytes());
    out.extend(machine.to_le_bytes());
    out.extend(1u32.to_le_bytes()); // e_version
    out.extend(0u64.to_le_bytes()); // e_entry
    out.extend(64u64.to_le_bytes()); // e_phoff
    out.extend(0u64.to_le_bytes()); // e_shoff
    out.extend(0u32.to_le_bytes()); // e_flags
    for half in [64u16, 56, phnum, 64, 0, 0] {
        out.extend(half.to_le_bytes());
    }
    let interp_type = if interp.is_some() {
        elf::PT_INTERP
    } else {
        elf::PT_NOTE
    };
    let phdrs = [
        (interp_type, interp_at, interp_bytes.len() as u64),
        (elf::PT_LOAD, 0, total),
        (elf::PT_DYNAMIC, dyn_at, dyn_len),
    ];
    for (p_type, offset, size) in phdrs {
        out.extend(p_type.to_le_bytes());
        out.extend(4u32.to_le_bytes()); // p_flags
        for word in [offset, offset, offset, size, size, 8] {
            out.extend(word.to_le_bytes());
        }
    }
    out.extend(interp_bytes);
    out.extend(strtab);
    out.resize(dyn_at as usize, 0);
    for (tag, val) in dynamic {
        out.extend(tag.to_le_bytes());
        out.extend(val.to_le_bytes());
    }
    out
}

fn read(bytes: &[u8]) -> Result<DynInfo, ElfProblem> {
    read_dyn_info(bytes).map(|(_, info)| info)
}

fn malformed_detail(bytes: &[u8]) -> String {
    match read(bytes) {
        Err(ElfProblem::Malformed(d)) => d,
        other => panic!("expected a malformed ELF, got {other:?}"),
    }
}

#[test]
fn reads_the_interpreter_needs_paths_and_soname() {
    let bytes = build_elf(
        elf::EM_X86_64,
        Some("/lib64/ld-linux-x86-64.so.2"),
        &[
            (elf::DT_NEEDED, "libseccomp.so.2"),
            (elf::DT_NEEDED, "libc.so.6"),
            (elf::DT_RPATH, "/ignored"),
            (elf::DT_RUNPATH, "$ORIGIN/../lib"),
            (elf::DT_SONAME, "libshim.so.1"),
        ],
        &[(elf::DT_FLAGS_1, u64::from(elf::DF_1_NODEFLIB))],
    );
    let (ident, info) = read_dyn_info(bytes.as_slice()).unwrap();
    assert_eq!(
        (ident.machine, ident.class64, ident.big_endian),
        (62, true, false)
    );
    assert_eq!(info.interp.as_deref(), Some("/lib64/ld-linux-x86-64.so.2"));
    assert_eq!(info.needed, ["libseccomp.so.2", "libc.so.6"]);
    assert_eq!(info.runpath.as_deref(), Some("$ORIGIN/../lib"));
    assert_eq!(info.rpath, None, "DT_RPATH is ignored beside DT_RUNPATH");
    assert_eq!(info.soname.as_deref(), Some("libshim.so.1"));
    assert!(info.nodeflib);
}

#[test]
fn an_object_without_needs_reads_as_empty() {
    let info = read(&build_elf(elf::EM_AARCH64, None, &[], &[])).unwrap();
    assert_eq!(info, DynInfo::default());
}

#[test]
fn a_file_without_the_magic_is_not_elf() {
    assert!(matches!(read(b"#!/bin/sh\n"), Err(ElfProblem::NotElf)));
    assert!(matches!(read(b""), Err(ElfProblem::NotElf)));
}

#[test]
fn every_truncation_is_an_error_not_a_panic() {
    let bytes = build_elf(
        elf::EM_X86_64,
        Some("/lib/ld.so"),
        &[(elf::DT_NEEDED, "libc.so.6")],
        &[],
    );
    for cut in 4..bytes.len() {
        assert!(read(&bytes[..cut]).is_err(), "cut at {cut} was accepted");
    }
}

#[test]
fn a_dynamic_section_outside_the_file_is_malformed() {
    let mut bytes = build_elf(elf::EM_X86_64, None, &[(elf::DT_NEEDED, "a.so")], &[]);
    // the third program header's p_offset
    let at = 64 + 2 * 56 + 8;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(malformed_detail(&bytes).contains("outside the file"));
}

#[test]
fn a_string_table_outside_the_loaded_segments_is_malformed() {
    let bytes = build_elf(
        elf::EM_X86_64,
        None,
        &[(elf::DT_NEEDED, "a.so")],
        &[(elf::DT_STRTAB, 1 << 40)],
    );
    // the later DT_STRTAB wins, as in the loader's table
    assert!(malformed_detail(&bytes).contains("DT_STRTAB"));
}

#[test]
fn string_offsets_past_the_table_are_malformed() {
    let bytes = build_elf(elf::EM_X86_64, None, &[], &[(elf::DT_NEEDED, 1 << 20)]);
    assert!(malformed_detail(&bytes).contains("past the string table"));
}

#[test]
fn absurd_program_header_counts_are_refused() {
    let mut bytes = build_elf(elf::EM_X86_64, None, &[], &[]);
    bytes[56..58].copy_from_slice(&u16::MAX.to_le_bytes());
    assert!(malformed_detail(&bytes).contains("program headers"));
    let mut bytes = build_elf(elf::EM_X86_64, None, &[], &[]);
    bytes[54..56].copy_from_slice(&32u16.to_le_bytes());
    assert!(malformed_detail(&bytes).contains("program header size"));
}

#[test]
fn this_test_binary_reads_as_the_loader_sees_it() {
    let exe = std::env::current_exe().unwrap();
    let (ident, info) = read_dyn_info(&FileSource::open(&exe).unwrap()).unwrap();
    assert_eq!(ident.class64, cfg!(target_pointer_width = "64"));
    let interp = info.interp.expect("a dynamically linked test binary");
    assert!(interp.starts_with('/'), "{interp}");
    assert!(
        info.needed.iter().any(|n| n.starts_with("libc.so")),
        "{:?}",
        info.needed
    );
}
