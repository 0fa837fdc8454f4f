//! A tiny ELF header check: is this file an executable (or PIE) for the node's
//! architecture? Reads `e_ident`, `e_type` and `e_machine` only.

use std::io::Read;
use std::path::Path;

use super::ArtifactError;

/// ELF machine numbers (`e_machine`) and word size for Go architecture names.
const MACHINES: &[(&str, u16, u8, u8)] = &[
    // (go arch, e_machine, EI_CLASS (1 = 32-bit, 2 = 64-bit), EI_DATA (1 = LE, 2 = BE))
    ("amd64", 62, 2, 1),
    ("arm64", 183, 2, 1),
    ("386", 3, 1, 1),
    ("arm", 40, 1, 1),
    ("riscv64", 243, 2, 1),
    ("ppc64le", 21, 2, 1),
    ("ppc64", 21, 2, 2),
    ("s390x", 22, 2, 2),
    ("loong64", 258, 2, 1),
    ("mips64le", 8, 2, 1),
];

/// Length of the part of the header we read.
const HEADER_LEN: usize = 20;

/// The e_machine number for a Go architecture name, if known.
pub fn machine_for_arch(arch: &str) -> Option<u16> {
    MACHINES.iter().find(|m| m.0 == arch).map(|m| m.1)
}

/// A readable name for an ELF machine number ("amd64", "arm64", or "e_machine 42").
fn describe_machine(machine: u16, class: u8, data: u8) -> String {
    MACHINES
        .iter()
        .find(|m| m.1 == machine && m.2 == class && m.3 == data)
        .map(|m| m.0.to_string())
        .unwrap_or_else(|| format!("ELF machine {machine} (class {class}, data {data})"))
}

/// True when `head` starts with the ELF magic.
pub fn is_elf(head: &[u8]) -> bool {
    head.starts_with(b"\x7fELF")
}

/// Check that `path` is an ELF executable or shared-object (PIE) file for `arch`.
pub fn check_elf(path: &Path, arch: &str) -> Result<(), ArtifactError> {
    let mut head = [0u8; HEADER_LEN];
    let mut f =
        std::fs::File::open(path).map_err(|e| ArtifactError::io("open shim binary", path, e))?;
    let mut n = 0;
    while n < HEADER_LEN {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ArtifactError::io("read shim binary", path, e)),
        }
    }
    check_elf_header(&head[..n], arch).map_err(|why| match why {
        HeaderProblem::Not(detail) => ArtifactError::NotExecutable {
            path: path.to_path_buf(),
            detail,
        },
        HeaderProblem::Arch(found) => ArtifactError::WrongArchitecture {
            path: path.to_path_buf(),
            found,
            expected: arch.to_string(),
        },
    })
}

/// Why a header was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// Not an executable ELF file at all.
    Not(String),
    /// An ELF executable for another architecture (its description).
    Arch(String),
}

/// Check the first bytes of a file (at least 20) against `arch`.
pub fn check_elf_header(head: &[u8], arch: &str) -> Result<(), HeaderProblem> {
    if !is_elf(head) {
        return Err(HeaderProblem::Not("no ELF magic (is it a script?)".into()));
    }
    if head.len() < HEADER_LEN {
        return Err(HeaderProblem::Not("ELF header is truncated".into()));
    }
    let (class, data) = (head[4], head[5]);
    let read_u16 = |at: usize| {
        let b = [head[at], head[at + 1]];
        if data == 2 {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    };
    if !(class == 1 || class == 2) || !(data == 1 || data == 2) {
        return Err(HeaderProblem::Not(format!(
            "bad ELF class {class} or data encoding {data}"
        )));
    }
    let e_type = read_u16(16);
    if e_type != 2 && e_type != 3 {
        return Err(HeaderProblem::Not(format!(
            "ELF type {e_type} is not an executable (2) or PIE (3)"
        )));
    }
    let machine = read_u16(18);
    let wanted = MACHINES.iter().find(|m| m.0 == arch);
    match wanted {
        Some(w) if w.1 == machine && w.2 == class && w.3 == data => Ok(()),
        Some(_) => Err(HeaderProblem::Arch(describe_machine(machine, class, data))),
        None => Err(HeaderProblem::Arch(format!(
            "{} (this agent does not know the ELF machine for {arch:?})",
            describe_machine(machine, class, data)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: u8, data: u8, e_type: u16, machine: u16) -> Vec<u8> {
        let mut h = vec![0x7f, b'E', b'L', b'F', class, data, 1];
        h.resize(16, 0);
        if data == 2 {
            h.extend(e_type.to_be_bytes());
            h.extend(machine.to_be_bytes());
        } else {
            h.extend(e_type.to_le_bytes());
            h.extend(machine.to_le_bytes());
        }
        h
    }

    #[test]
    fn accepts_the_right_machine_and_refuses_others() {
        assert_eq!(check_elf_header(&header(2, 1, 3, 62), "amd64"), Ok(()));
        assert_eq!(check_elf_header(&header(2, 1, 2, 183), "arm64"), Ok(()));
        assert_eq!(check_elf_header(&header(2, 2, 2, 22), "s390x"), Ok(()));
        assert_eq!(
            check_elf_header(&header(2, 1, 2, 183), "amd64"),
            Err(HeaderProblem::Arch("arm64".into()))
        );
        // right machine number, wrong word size
        assert!(matches!(
            check_elf_header(&header(1, 1, 2, 62), "amd64"),
            Err(HeaderProblem::Arch(_))
        ));
    }

    #[test]
    fn refuses_non_executables() {
        assert!(matches!(
            check_elf_header(b"#!/bin/sh\necho hi\n", "amd64"),
            Err(HeaderProblem::Not(_))
        ));
        // relocatable object (.o)
        assert!(matches!(
            check_elf_header(&header(2, 1, 1, 62), "amd64"),
            Err(HeaderProblem::Not(_))
        ));
        assert!(matches!(
            check_elf_header(b"\x7fELF\x02", "amd64"),
            Err(HeaderProblem::Not(_))
        ));
    }

    #[test]
    fn this_test_binary_matches_the_node_platform() {
        let exe = std::env::current_exe().unwrap();
        let arch = super::super::node_platform().arch;
        check_elf(&exe, &arch).unwrap();
    }
}
