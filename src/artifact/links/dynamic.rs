//! Reading what the dynamic loader reads from one ELF object: its class, byte order, machine
//! and type; `PT_INTERP`; and from `PT_DYNAMIC` the `DT_NEEDED`, `DT_RPATH`, `DT_RUNPATH`,
//! `DT_SONAME` and `DT_FLAGS_1` entries, with their strings.
//!
//! Guarantees: only the header, the program headers, the dynamic segment and the strings it
//! names are read, from any [`ByteSource`], in bounded pieces (at most [`MAX_BYTES_READ`] per
//! object, whatever the file says); every offset is checked against the file's size; nothing
//! here panics on any input. The module uses nothing of the crate (the `elf_links` fuzz target
//! compiles it on its own).

use std::io;

use object::elf;
use object::read::elf::{Dyn, FileHeader, ProgramHeader};
use object::{Endianness, ReadRef};

/// At most this many program headers (the kernel's cap: 64 KiB of them).
const MAX_PHDR_BYTES: u64 = 64 * 1024;
/// At most this much of `PT_DYNAMIC` (65 536 entries of a 64-bit object).
const MAX_DYNAMIC_BYTES: u64 = 1024 * 1024;
/// At most this many `DT_NEEDED` entries in one object.
const MAX_NEEDED: usize = 4096;
/// The longest string read (`PATH_MAX`), `PT_INTERP` included.
const MAX_STRING_BYTES: u64 = 4096;
/// What one object may cost in reads, all pieces together.
pub const MAX_BYTES_READ: u64 = 64 * 1024 * 1024;

/// Bytes read at an offset: a file, or a slice in tests and the fuzz target.
pub trait ByteSource {
    /// The size in bytes.
    fn size(&self) -> u64;
    /// Read at `offset` into `buf`; fewer bytes than asked only at the end.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize>;
}

impl ByteSource for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let start = usize::try_from(offset)
            .unwrap_or(usize::MAX)
            .min(self.len());
        let tail = self.get(start..).unwrap_or_default();
        let n = tail.len().min(buf.len());
        buf[..n].copy_from_slice(&tail[..n]);
        Ok(n)
    }
}

/// An open file and the size it had when opened.
pub struct FileSource {
    file: std::fs::File,
    size: u64,
}

impl FileSource {
    /// Open `path` for reading.
    pub fn open(path: &std::path::Path) -> io::Result<Self> {
        let file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        Ok(FileSource { file, size })
    }
}

impl ByteSource for FileSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.file, buf, offset)
    }
}

/// Why an object could not be read.
#[derive(Debug)]
pub enum ElfProblem {
    /// No ELF magic: not an ELF file at all.
    NotElf,
    /// ELF, but malformed (the detail says where).
    Malformed(String),
    /// The file could not be read.
    Io(io::Error),
}

/// The first bytes of an ELF header: enough to tell whether an object can be loaded beside
/// another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ident {
    pub class64: bool,
    pub big_endian: bool,
    pub machine: u16,
    pub e_type: u16,
}

/// What the loader reads from one object to map its dependencies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DynInfo {
    /// `PT_INTERP`, without its NUL.
    pub interp: Option<String>,
    /// `DT_NEEDED`, in order.
    pub needed: Vec<String>,
    /// `DT_RPATH`; `None` when the object has a `DT_RUNPATH` (glibc ignores it then).
    pub rpath: Option<String>,
    /// `DT_RUNPATH`.
    pub runpath: Option<String>,
    /// `DT_SONAME`.
    pub soname: Option<String>,
    /// `DF_1_NODEFLIB` in `DT_FLAGS_1`: no ld.so.cache and no default directories.
    pub nodeflib: bool,
}

/// Read the ELF identification and `e_type`/`e_machine`; `Err(NotElf)` without the magic.
pub fn read_ident<S: ByteSource + ?Sized>(src: &S) -> Result<Ident, ElfProblem> {
    let mut budget = MAX_BYTES_READ;
    let head = read_piece(src, &mut budget, 0, 20u64.min(src.size()), "ELF header")?;
    if !head.starts_with(&elf::ELFMAG) {
        return Err(ElfProblem::NotElf);
    }
    if head.len() < 20 {
        return Err(ElfProblem::Malformed("the ELF header is truncated".into()));
    }
    let (class, data) = (head[4], head[5]);
    if !(class == elf::ELFCLASS32 || class == elf::ELFCLASS64) {
        return Err(ElfProblem::Malformed(format!("bad ELF class {class}")));
    }
    if !(data == elf::ELFDATA2LSB || data == elf::ELFDATA2MSB) {
        return Err(ElfProblem::Malformed(format!(
            "bad ELF data encoding {data}"
        )));
    }
    let big_endian = data == elf::ELFDATA2MSB;
    let half = |at: usize| {
        let b = [head[at], head[at + 1]];
        if big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    };
    Ok(Ident {
        class64: class == elf::ELFCLASS64,
        big_endian,
        machine: half(18),
        e_type: half(16),
    })
}

/// Read the identification and the dynamic-linking information of one object.
pub fn read_dyn_info<S: ByteSource + ?Sized>(src: &S) -> Result<(Ident, DynInfo), ElfProblem> {
    let ident = read_ident(src)?;
    let info = if ident.class64 {
        read_as::<elf::FileHeader64<Endianness>, S>(src)?
    } else {
        read_as::<elf::FileHeader32<Endianness>, S>(src)?
    };
    Ok((ident, info))
}

/// The raw dynamic entries one object's strings are found with.
#[derive(Default)]
struct DynTags {
    strtab: Option<u64>,
    strsz: Option<u64>,
    needed: Vec<u64>,
    rpath: Option<u64>,
    runpath: Option<u64>,
    soname: Option<u64>,
    flags_1: u64,
}

fn read_as<Elf, S>(src: &S) -> Result<DynInfo, ElfProblem>
where
    Elf: FileHeader<Endian = Endianness>,
    S: ByteSource + ?Sized,
{
    let mut budget = MAX_BYTES_READ;
    let size = std::mem::size_of::<Elf>() as u64;
    let head = read_piece(src, &mut budget, 0, size, "ELF header")?;
    let header = Elf::parse(head.as_slice()).map_err(|e| malformed("ELF header", e))?;
    let endian = header.endian().map_err(|e| malformed("ELF header", e))?;
    let phnum = u64::from(header.e_phnum(endian));
    let entsize = std::mem::size_of::<Elf::ProgramHeader>() as u64;
    if phnum > 0 && u64::from(header.e_phentsize(endian)) != entsize {
        return Err(ElfProblem::Malformed(format!(
            "program header size {} is not {entsize}",
            header.e_phentsize(endian)
        )));
    }
    if phnum * entsize > MAX_PHDR_BYTES {
        return Err(ElfProblem::Malformed(format!("{phnum} program headers")));
    }
    let phoff: u64 = header.e_phoff(endian).into();
    let table = read_piece(src, &mut budget, phoff, phnum * entsize, "program headers")?;
    let phdrs: &[Elf::ProgramHeader] = table
        .as_slice()
        .read_slice_at(0, phnum as usize)
        .map_err(|()| ElfProblem::Malformed("program headers are misplaced".into()))?;
    let mut info = DynInfo::default();
    if let Some(ph) = phdrs.iter().find(|p| p.p_type(endian) == elf::PT_INTERP) {
        let (off, len) = ph.file_range(endian);
        if len > MAX_STRING_BYTES {
            return Err(ElfProblem::Malformed(format!("PT_INTERP of {len} bytes")));
        }
        let bytes = read_piece(src, &mut budget, off, len, "PT_INTERP")?;
        let path = bytes.split(|&b| b == 0).next().unwrap_or_default();
        if path.is_empty() {
            return Err(ElfProblem::Malformed("PT_INTERP is empty".into()));
        }
        info.interp = Some(String::from_utf8_lossy(path).into_owned());
    }
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type(endian) == elf::PT_DYNAMIC) else {
        return Ok(info);
    };
    let tags = read_tags::<Elf, S>(src, &mut budget, endian, dynamic)?;
    resolve_strings::<Elf, S>(src, &mut budget, endian, phdrs, &tags, &mut info)?;
    Ok(info)
}

/// The entries of `PT_DYNAMIC` up to `DT_NULL`.
fn read_tags<Elf, S>(
    src: &S,
    budget: &mut u64,
    endian: Endianness,
    dynamic: &Elf::ProgramHeader,
) -> Result<DynTags, ElfProblem>
where
    Elf: FileHeader<Endian = Endianness>,
    S: ByteSource + ?Sized,
{
    let (off, len) = dynamic.file_range(endian);
    let len = len.min(MAX_DYNAMIC_BYTES);
    let bytes = read_piece(src, budget, off, len, "PT_DYNAMIC")?;
    let count = bytes.len() / std::mem::size_of::<Elf::Dyn>();
    let entries: &[Elf::Dyn] = bytes
        .as_slice()
        .read_slice_at(0, count)
        .map_err(|()| ElfProblem::Malformed("PT_DYNAMIC is misplaced".into()))?;
    let mut tags = DynTags::default();
    for d in entries {
        let val = d.val(endian);
        match d.tag(endian) {
            elf::DT_NULL => break,
            elf::DT_NEEDED if tags.needed.len() >= MAX_NEEDED => {
                return Err(ElfProblem::Malformed(format!(
                    "more than {MAX_NEEDED} DT_NEEDED"
                )));
            }
            elf::DT_NEEDED => tags.needed.push(val),
            elf::DT_STRTAB => tags.strtab = Some(val),
            elf::DT_STRSZ => tags.strsz = Some(val),
            elf::DT_RPATH => tags.rpath = Some(val),
            elf::DT_RUNPATH => tags.runpath = Some(val),
            elf::DT_SONAME => tags.soname = Some(val),
            elf::DT_FLAGS_1 => tags.flags_1 = val,
            _ => {}
        }
    }
    Ok(tags)
}

/// Read the strings the dynamic entries name, from the string table `DT_STRTAB` points at
/// (an address: mapped to the file through the `PT_LOAD` segment holding it).
fn resolve_strings<Elf, S>(
    src: &S,
    budget: &mut u64,
    endian: Endianness,
    phdrs: &[Elf::ProgramHeader],
    tags: &DynTags,
    info: &mut DynInfo,
) -> Result<(), ElfProblem>
where
    Elf: FileHeader<Endian = Endianness>,
    S: ByteSource + ?Sized,
{
    info.nodeflib = tags.flags_1 & u64::from(elf::DF_1_NODEFLIB) != 0;
    let named = [tags.rpath, tags.runpath, tags.soname];
    if tags.needed.is_empty() && named.iter().all(Option::is_none) {
        return Ok(());
    }
    let Some(addr) = tags.strtab else {
        return Err(ElfProblem::Malformed("DT_NEEDED without DT_STRTAB".into()));
    };
    let start = phdrs
        .iter()
        .filter(|p| p.p_type(endian) == elf::PT_LOAD)
        .find_map(|p| {
            let (vaddr, filesz): (u64, u64) = (p.p_vaddr(endian).into(), p.p_filesz(endian).into());
            let offset: u64 = p.p_offset(endian).into();
            let inside = addr >= vaddr && addr - vaddr < filesz;
            inside.then(|| offset.checked_add(addr - vaddr))
        })
        .flatten()
        .filter(|&start| start < src.size())
        .ok_or_else(|| {
            ElfProblem::Malformed(format!(
                "DT_STRTAB {addr:#x} lies outside the file's loaded segments"
            ))
        })?;
    let table = StrTab {
        start,
        size: tags.strsz.unwrap_or(u64::MAX).min(src.size() - start),
    };
    for &off in &tags.needed {
        info.needed.push(table.read(src, budget, off)?);
    }
    if let Some(off) = tags.runpath {
        info.runpath = Some(table.read(src, budget, off)?);
    } else if let Some(off) = tags.rpath {
        info.rpath = Some(table.read(src, budget, off)?);
    }
    if let Some(off) = tags.soname {
        info.soname = Some(table.read(src, budget, off)?);
    }
    Ok(())
}

/// The dynamic string table's place in the file.
struct StrTab {
    start: u64,
    size: u64,
}

impl StrTab {
    /// The NUL-terminated string at `off`.
    fn read<S: ByteSource + ?Sized>(
        &self,
        src: &S,
        budget: &mut u64,
        off: u64,
    ) -> Result<String, ElfProblem> {
        if off >= self.size {
            return Err(ElfProblem::Malformed(format!(
                "string offset {off} is past the string table ({} bytes)",
                self.size
            )));
        }
        let len = (self.size - off).min(MAX_STRING_BYTES);
        let bytes = read_piece(src, budget, self.start + off, len, "dynamic string")?;
        match bytes.iter().position(|&b| b == 0) {
            Some(end) => Ok(String::from_utf8_lossy(&bytes[..end]).into_owned()),
            None => Err(ElfProblem::Malformed(format!(
                "unterminated string at offset {off} of the string table"
            ))),
        }
    }
}

/// Read exactly `len` bytes at `off`, charged to `budget`.
fn read_piece<S: ByteSource + ?Sized>(
    src: &S,
    budget: &mut u64,
    off: u64,
    len: u64,
    what: &str,
) -> Result<Vec<u8>, ElfProblem> {
    let end = off.checked_add(len).filter(|&end| end <= src.size());
    if end.is_none() {
        return Err(ElfProblem::Malformed(format!(
            "{what} ({len} bytes at offset {off}) lies outside the file ({} bytes)",
            src.size()
        )));
    }
    if len > *budget {
        return Err(ElfProblem::Malformed(format!(
            "reading {what} would pass {MAX_BYTES_READ} bytes"
        )));
    }
    *budget -= len;
    let mut buf = vec![0u8; len as usize];
    let mut done = 0;
    while done < buf.len() {
        match src.read_at(off + done as u64, &mut buf[done..]) {
            Ok(0) => {
                return Err(ElfProblem::Malformed(format!(
                    "the file ends inside {what}"
                )));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ElfProblem::Io(e)),
        }
    }
    Ok(buf)
}

fn malformed(what: &str, e: object::read::Error) -> ElfProblem {
    ElfProblem::Malformed(format!("{what}: {e}"))
}

#[cfg(test)]
#[path = "dynamic_tests.rs"]
pub(crate) mod tests;
