//! Safe, streaming extraction of an untrusted artifact into an empty directory.
//!
//! The format is found from magic bytes: gzip (`1f 8b`, must hold a tar), tar (`ustar` at
//! offset 257) or a bare ELF binary (stored as one file). Entries are walked one by one —
//! `tar::Archive::unpack` is not used — and each must pass these rules, else the whole
//! artifact is refused with an error naming the entry and the rule:
//! - a relative path without `..`, that does not pass through a symlink, not seen before;
//! - regular files, directories, hard links to an earlier regular file, and symlinks whose
//!   relative target stays inside the tree; no devices, fifos or other types;
//! - no setuid/setgid bits; files become 0755 (any exec bit) or 0644, directories 0755;
//! - at most `max_entries` entries, `max_file_bytes` per file and `max_unpacked_bytes` in
//!   all, counted from the headers before writing and from the data while writing.
//!
//! Everything left after the archive's end is read (and counted) so that the caller's
//! digest covers every byte of the download.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::{ArtifactError, Limits, elf};

/// Size of the head read to detect the format (one tar header block).
const HEAD_LEN: usize = 512;
/// Copy buffer size.
const COPY_BUF_BYTES: usize = 256 * 1024;

/// What was unpacked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackSummary {
    pub entries: u64,
    pub bytes: u64,
}

/// Where the bytes come from and what to call a bare binary.
#[derive(Debug, Clone)]
pub struct UnpackOptions<'a> {
    /// Shown in errors (URL or OCI reference).
    pub location: &'a str,
    /// File name for a download that is itself an ELF binary.
    pub bare_name: &'a str,
    pub limits: &'a Limits,
}

/// Unpack `reader` into `dest` (an existing, empty directory), applying the module's rules.
pub fn unpack_stream<R: Read>(
    reader: R,
    dest: &Path,
    opts: &UnpackOptions<'_>,
) -> Result<UnpackSummary, ArtifactError> {
    let mut u = Unpacker {
        dest,
        opts,
        summary: UnpackSummary::default(),
    };
    let (head, rest) = read_head(reader).map_err(|e| u.read_error(e, ""))?;
    if head.starts_with(&[0x1f, 0x8b]) {
        let gz = flate2::read::GzDecoder::new(io::Cursor::new(head).chain(rest));
        let (inner, gz) = read_head(gz).map_err(|e| u.read_error(e, ""))?;
        if !is_tar(&inner) {
            return Err(u.not_archive(format!(
                "a gzip stream that does not hold a tar archive: {}",
                preview(&inner)
            )));
        }
        let mut tail = u.unpack_tar(io::Cursor::new(inner).chain(gz))?;
        u.drain(&mut tail)?;
        // Bytes after the gzip member: read them so the digest covers the whole download.
        let (_, decoder) = tail.into_inner();
        let (_, mut raw) = decoder.into_inner().into_inner();
        drain_raw(&mut raw).map_err(|e| u.read_error(e, ""))?;
    } else if is_tar(&head) {
        let mut rest = u.unpack_tar(io::Cursor::new(head).chain(rest))?;
        drain_raw(&mut rest).map_err(|e| u.read_error(e, ""))?;
    } else if elf::is_elf(&head) {
        u.unpack_bare(io::Cursor::new(head).chain(rest))?;
    } else {
        return Err(u.not_archive(preview(&head)));
    }
    Ok(u.summary)
}

/// Read up to [`HEAD_LEN`] bytes; the reader continues after them.
fn read_head<R: Read>(mut r: R) -> io::Result<(Vec<u8>, R)> {
    let mut head = vec![0u8; HEAD_LEN];
    let mut n = 0;
    while n < HEAD_LEN {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(n);
    Ok((head, r))
}

fn is_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// A printable hint of what the bytes look like.
fn preview(head: &[u8]) -> String {
    if head.is_empty() {
        return "it is empty".into();
    }
    let text: String = head
        .iter()
        .take(40)
        .map(|&b| {
            if b.is_ascii_graphic() || b == b' ' {
                b as char
            } else {
                '.'
            }
        })
        .collect();
    let lower = text.to_ascii_lowercase();
    let kind = if lower.contains("<html") || lower.contains("<!doctype") {
        "it looks like an HTML page, "
    } else {
        ""
    };
    format!("{kind}it starts with {text:?}")
}

/// Read the rest of the raw download so that its digest covers every byte.
fn drain_raw<R: Read>(r: &mut R) -> io::Result<()> {
    io::copy(r, &mut io::sink()).map(|_| ())
}

struct Unpacker<'a> {
    dest: &'a Path,
    opts: &'a UnpackOptions<'a>,
    summary: UnpackSummary,
}

impl Unpacker<'_> {
    fn location(&self) -> String {
        self.opts.location.to_string()
    }

    fn not_archive(&self, found: String) -> ArtifactError {
        ArtifactError::NotAnArchive {
            location: self.location(),
            found,
        }
    }

    fn unsafe_entry(&self, entry: &str, rule: impl Into<String>) -> ArtifactError {
        ArtifactError::UnsafeArchiveEntry {
            location: self.location(),
            entry: entry.to_string(),
            rule: rule.into(),
        }
    }

    fn too_large(&self, entry: &str, detail: String) -> ArtifactError {
        ArtifactError::ArchiveTooLarge {
            location: self.location(),
            entry: entry.to_string(),
            detail,
        }
    }

    /// Map a read error of the archive stream (not of the destination).
    fn read_error(&self, e: io::Error, entry: &str) -> ArtifactError {
        let at = if entry.is_empty() {
            String::new()
        } else {
            format!(" at entry {entry:?}")
        };
        if e.kind() == io::ErrorKind::UnexpectedEof {
            ArtifactError::TruncatedArchive {
                location: self.location(),
                detail: format!("unexpected end of data{at}"),
            }
        } else {
            ArtifactError::CorruptArchive {
                location: self.location(),
                detail: format!("{e}{at}"),
            }
        }
    }

    /// Walk the tar entries; returns the reader positioned after the archive's end.
    fn unpack_tar<R: Read>(&mut self, reader: R) -> Result<R, ArtifactError> {
        let mut archive = tar::Archive::new(reader);
        let entries = archive.entries().map_err(|e| self.read_error(e, ""))?;
        let mut last = String::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.read_error(e, &format!("after {last}")))?;
            last = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
            self.unpack_entry(entry)?;
        }
        Ok(archive.into_inner())
    }

    /// Count the rest of a decompressed stream (trailing tar blocks) against the cap.
    fn drain<R: Read>(&mut self, r: &mut R) -> Result<(), ArtifactError> {
        let mut buf = vec![0u8; COPY_BUF_BYTES];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n as u64,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.read_error(e, "")),
            };
            self.summary.bytes += n;
            if self.summary.bytes > self.opts.limits.max_unpacked_bytes {
                return Err(self.too_large(
                    "(data after the end of the archive)",
                    format!(
                        "more than {} bytes unpacked in all",
                        self.opts.limits.max_unpacked_bytes
                    ),
                ));
            }
        }
    }

    fn unpack_entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ArtifactError> {
        let raw_path = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw_path).into_owned();
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            return Ok(());
        }
        self.summary.entries += 1;
        let limits = self.opts.limits;
        if self.summary.entries > limits.max_entries {
            return Err(self.too_large(&name, format!("more than {} entries", limits.max_entries)));
        }
        let rel = safe_relative(&raw_path).map_err(|rule| self.unsafe_entry(&name, rule))?;
        let mode = entry
            .header()
            .mode()
            .map_err(|e| self.read_error(e, &name))?;
        if mode & 0o6000 != 0 {
            return Err(self.unsafe_entry(&name, format!("setuid/setgid bits in mode {mode:o}")));
        }
        let Some(rel) = rel else {
            return Ok(()); // "./": the root itself
        };
        self.check_parents(&rel, &name, true)?;
        let target = self.dest.join(&rel);
        let exists = fs::symlink_metadata(&target).ok();
        match kind {
            tar::EntryType::Directory => {
                match exists {
                    Some(m) if m.is_dir() => {}
                    Some(_) => return Err(self.unsafe_entry(&name, "duplicate entry")),
                    None => make_dir(&target)?,
                }
                return Ok(());
            }
            _ if exists.is_some() => return Err(self.unsafe_entry(&name, "duplicate entry")),
            _ => {}
        }
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let size = entry.size();
                if size > limits.max_file_bytes {
                    return Err(self.too_large(
                        &name,
                        format!(
                            "{size} bytes, above the per-file limit of {}",
                            limits.max_file_bytes
                        ),
                    ));
                }
                if self.summary.bytes.saturating_add(size) > limits.max_unpacked_bytes {
                    return Err(self.too_large(
                        &name,
                        format!(
                            "{size} more bytes would exceed the unpacked limit of {}",
                            limits.max_unpacked_bytes
                        ),
                    ));
                }
                let file_mode = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
                self.write_file(&mut entry, &target, &name, size, file_mode)
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "symlink without a target"))?;
                check_symlink_target(&rel, &link).map_err(|rule| self.unsafe_entry(&name, rule))?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&link), &target)
                    .map_err(|e| ArtifactError::io("create symlink", &target, e))
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| self.unsafe_entry(&name, "hard link without a target"))?;
                let shown = String::from_utf8_lossy(&link).into_owned();
                let to = safe_relative(&link)
                    .map_err(|rule| {
                        self.unsafe_entry(&name, format!("hard link to {shown:?}: {rule}"))
                    })?
                    .ok_or_else(|| self.unsafe_entry(&name, "hard link to the root directory"))?;
                self.check_parents(&to, &name, false)?;
                let src = self.dest.join(&to);
                match fs::symlink_metadata(&src) {
                    Ok(m) if m.is_file() => fs::hard_link(&src, &target)
                        .map_err(|e| ArtifactError::io("create hard link", &target, e)),
                    _ => Err(self.unsafe_entry(
                        &name,
                        format!("hard link to {shown:?}, which is not an earlier regular file in the archive"),
                    )),
                }
            }
            other => Err(self.unsafe_entry(
                &name,
                format!(
                    "entry type {} is not allowed (only files, directories and links)",
                    describe_type(other)
                ),
            )),
        }
    }

    /// Every ancestor of `rel` must be a real directory (created when `create` is set).
    fn check_parents(&self, rel: &Path, name: &str, create: bool) -> Result<(), ArtifactError> {
        let mut here = self.dest.to_path_buf();
        let parents: Vec<_> = rel
            .parent()
            .map(|p| p.components().collect())
            .unwrap_or_default();
        for c in parents {
            here.push(c);
            match fs::symlink_metadata(&here) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.unsafe_entry(name, "path passes through a symlink"));
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(self.unsafe_entry(name, "a parent is not a directory")),
                Err(_) if create => make_dir(&here)?,
                Err(_) => {
                    return Err(self.unsafe_entry(name, "link target's directory does not exist"));
                }
            }
        }
        Ok(())
    }

    fn write_file<R: Read>(
        &mut self,
        entry: &mut R,
        target: &Path,
        name: &str,
        size: u64,
        mode: u32,
    ) -> Result<(), ArtifactError> {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(target)
            .map_err(|e| ArtifactError::io("create file", target, e))?;
        let written = self.copy_counted(entry, &mut f, name, target)?;
        if written != size {
            return Err(ArtifactError::TruncatedArchive {
                location: self.location(),
                detail: format!("entry {name:?} has {written} of its {size} bytes"),
            });
        }
        finish_file(f, target, mode)
    }

    /// Copy while counting against the unpacked-total cap.
    fn copy_counted<R: Read>(
        &mut self,
        from: &mut R,
        to: &mut File,
        name: &str,
        target: &Path,
    ) -> Result<u64, ArtifactError> {
        let mut buf = vec![0u8; COPY_BUF_BYTES];
        let mut written = 0u64;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => return Ok(written),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.read_error(e, name)),
            };
            written += n as u64;
            self.summary.bytes += n as u64;
            let limits = self.opts.limits;
            if written > limits.max_file_bytes || self.summary.bytes > limits.max_unpacked_bytes {
                return Err(self.too_large(
                    name,
                    format!(
                        "over the limits of {} bytes per file, {} in all",
                        limits.max_file_bytes, limits.max_unpacked_bytes
                    ),
                ));
            }
            to.write_all(&buf[..n])
                .map_err(|e| ArtifactError::io("write file", target, e))?;
        }
    }

    /// A download that is itself the binary.
    fn unpack_bare<R: Read>(&mut self, mut reader: R) -> Result<(), ArtifactError> {
        let name = self.opts.bare_name.to_string();
        if safe_relative(name.as_bytes())
            .ok()
            .flatten()
            .map(|p| p.components().count())
            != Some(1)
        {
            return Err(self.unsafe_entry(&name, "a bare binary needs a plain file name"));
        }
        let target = self.dest.join(&name);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&target)
            .map_err(|e| ArtifactError::io("create file", &target, e))?;
        self.summary.entries = 1;
        self.copy_counted(&mut reader, &mut f, &name, &target)?;
        finish_file(f, &target, 0o755)
    }
}

/// Set the exact mode (the umask filtered the one given to open) and fsync.
fn finish_file(f: File, target: &Path, mode: u32) -> Result<(), ArtifactError> {
    f.set_permissions(fs::Permissions::from_mode(mode))
        .map_err(|e| ArtifactError::io("set mode of", target, e))?;
    f.sync_all()
        .map_err(|e| ArtifactError::io("sync file", target, e))
}

fn make_dir(p: &Path) -> Result<(), ArtifactError> {
    fs::create_dir(p).map_err(|e| ArtifactError::io("create directory", p, e))?;
    fs::set_permissions(p, fs::Permissions::from_mode(0o755))
        .map_err(|e| ArtifactError::io("set mode of", p, e))
}

/// A path from the archive as a clean relative path; `None` for the root itself (`./`).
fn safe_relative(raw: &[u8]) -> Result<Option<PathBuf>, String> {
    if raw.is_empty() {
        return Err("empty path".into());
    }
    if raw.contains(&0) {
        return Err("NUL byte in path".into());
    }
    let p = Path::new(OsStr::from_bytes(raw));
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir => return Err("path contains \"..\"".into()),
            Component::RootDir | Component::Prefix(_) => return Err("absolute path".into()),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// A symlink at `rel` may point to `target` only if the target is relative, its `..`
/// components all come first and do not climb above the tree's root. (With `..` only in
/// front, resolution climbs real directories and then only descends, so no chain of such
/// links can leave the tree.)
fn check_symlink_target(rel: &Path, target: &[u8]) -> Result<(), String> {
    let shown = String::from_utf8_lossy(target);
    let t = Path::new(OsStr::from_bytes(target));
    if target.is_empty() {
        return Err("symlink with an empty target".into());
    }
    if t.is_absolute() {
        return Err(format!("symlink to absolute path {shown:?}"));
    }
    let depth = rel.components().count().saturating_sub(1);
    let mut ups = 0usize;
    let mut descended = false;
    for c in t.components() {
        match c {
            Component::ParentDir if descended => {
                return Err(format!("symlink target {shown:?} has \"..\" after a name"));
            }
            Component::ParentDir => ups += 1,
            Component::Normal(_) => descended = true,
            _ => {}
        }
    }
    if ups > depth {
        return Err(format!("symlink to {shown:?} points outside the archive"));
    }
    Ok(())
}

fn describe_type(t: tar::EntryType) -> &'static str {
    match t {
        tar::EntryType::Char => "character device",
        tar::EntryType::Block => "block device",
        tar::EntryType::Fifo => "fifo",
        tar::EntryType::GNUSparse => "GNU sparse file",
        _ => "(unsupported)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_cleaned_and_escapes_refused() {
        assert_eq!(safe_relative(b"./a/b").unwrap(), Some(PathBuf::from("a/b")));
        assert_eq!(safe_relative(b"./").unwrap(), None);
        assert!(
            safe_relative(b"/etc/passwd")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(safe_relative(b"a/../../x").unwrap_err().contains(".."));
        assert!(safe_relative(b"").is_err());
    }

    #[test]
    fn symlink_targets_must_stay_inside() {
        let at = |p: &str, t: &str| check_symlink_target(Path::new(p), t.as_bytes());
        assert!(at("bin/shim", "../lib/shim").is_ok());
        assert!(at("shim", "bin/shim").is_ok());
        assert!(at("shim", "../x").is_err());
        assert!(at("a/l", "/etc").is_err());
        // "d/s/.." would be safe lexically but not through a symlink d/s: refused
        assert!(at("t", "d/s/..").is_err());
    }
}
