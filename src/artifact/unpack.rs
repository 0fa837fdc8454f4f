//! Safe, streaming extraction of an untrusted artifact into an empty directory.
//!
//! The format is told from magic bytes (`format.rs`): a tar, a tar compressed with gzip,
//! zstd or xz, or a bare ELF binary (stored as one file). A compressed stream that does not
//! hold a tar is refused. Whatever the compression, one tar walk reads the decoded stream:
//! entries are taken one by one — `tar::Archive::unpack` is not used — and each must pass
//! these rules, else the whole artifact is refused with an error naming the entry and the
//! rule:
//! - a relative path without `..`, that does not pass through a symlink, not seen before,
//!   whose components fit in a file name (255 bytes) and whole fits in 4095 (`paths.rs`);
//! - regular files, directories, hard links to an earlier regular file, and symlinks whose
//!   relative target stays inside the tree; no devices, fifos or other types;
//! - no setuid/setgid bits; files become 0755 (any exec bit) or 0644, directories 0755;
//! - at most `max_entries` entries, `max_file_bytes` per file, and `max_unpacked_bytes` for
//!   the whole decoded tar stream (headers, data, padding and anything after the tar's
//!   end), checked from the headers before writing and from the data while reading;
//! - at most [`MAX_HEADER_BYTES`](super::format::MAX_HEADER_BYTES) of headers (long names,
//!   pax records) and skipped data before each entry.
//!
//! Everything left after the archive's end is read so that the caller's digest covers every
//! byte of the download. Names from the archive are shown lossily decoded, escaped and cut
//! (`paths::shown_name`); nothing here slices a name, so no name can make it panic.

use std::cell::Cell;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use super::format::{
    Cap, Format, MAX_HEADER_BYTES, MAX_WINDOW_BYTES, Meter, StreamError, TarStream, is_tar,
    preview, read_head,
};
use super::paths::{check_symlink_target, safe_relative, shown_name};
use super::{ArtifactError, Limits};

/// Copy buffer size.
const COPY_BUF_BYTES: usize = 256 * 1024;
/// What the stream after the tar's end is called in errors.
const AFTER_END: &str = "(data after the end of the archive)";

/// What was unpacked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnpackSummary {
    pub entries: u64,
    /// Bytes of file data written.
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
    let meter = Meter::new(opts.limits.max_unpacked_bytes);
    let mut u = Unpacker {
        dest,
        opts,
        format: Format::Tar,
        meter: &meter,
        summary: UnpackSummary::default(),
    };
    let (head, rest) = read_head(reader).map_err(|e| u.read_error(e, ""))?;
    u.format = Format::detect(&head).ok_or_else(|| u.not_archive(preview(&head)))?;
    let raw = io::Cursor::new(head).chain(rest);
    if u.format == Format::Elf {
        u.unpack_bare(raw)?;
        return Ok(u.summary);
    }
    let stream = TarStream::open(u.format, raw, &meter).map_err(|e| u.read_error(e, ""))?;
    let (inner, stream) = read_head(stream).map_err(|e| u.read_error(e, ""))?;
    if !is_tar(&inner) {
        return Err(u.not_archive(format!(
            "the {} stream does not hold a tar archive: {}",
            u.format.codec(),
            preview(&inner)
        )));
    }
    let mut tail = u.unpack_tar(io::Cursor::new(inner).chain(stream))?;
    // The rest of the tar stream (end blocks, padding): decoded and counted by the meter.
    io::copy(&mut tail, &mut io::sink()).map_err(|e| u.read_error(e, AFTER_END))?;
    // The download after the compressed stream: read so the digest covers it.
    let (_, stream) = tail.into_inner();
    io::copy(&mut stream.into_raw(), &mut io::sink()).map_err(|e| u.read_error(e, AFTER_END))?;
    Ok(u.summary)
}

struct Unpacker<'a> {
    dest: &'a Path,
    opts: &'a UnpackOptions<'a>,
    format: Format,
    meter: &'a Meter,
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

    /// Map a read error of the archive stream (not of the destination); `entry` says where
    /// in the archive ("" before the first entry).
    fn read_error(&self, e: io::Error, entry: &str) -> ArtifactError {
        let at = at_entry(entry);
        let location = self.location();
        let name = self.format.name();
        match StreamError::of(&e) {
            Some(StreamError::OverCap(cap)) => {
                let entry = if entry.is_empty() { "(the first entry)" } else { entry };
                let detail = match cap {
                    Cap::Total => format!(
                        "more than {} bytes unpacked in all (tar headers, data and padding)",
                        self.meter.cap()
                    ),
                    Cap::Headers => format!(
                        "more than {MAX_HEADER_BYTES} bytes of tar headers (long names, pax records) or skipped data before the next entry"
                    ),
                };
                self.too_large(entry, detail)
            }
            Some(StreamError::Window { codec, needed }) => self.too_large(
                &format!("({codec} stream header)"),
                match needed {
                    Some(n) => format!(
                        "decoding needs a {n}-byte window, above the limit of {MAX_WINDOW_BYTES}; compress with a smaller one (zstd without --long, or --long=27 at most)"
                    ),
                    None => format!(
                        "decoding needs more than {} MiB of memory for its dictionary; compress with a smaller one (xz -9 needs 64 MiB)",
                        MAX_WINDOW_BYTES >> 20
                    ),
                },
            ),
            Some(StreamError::Decode {
                codec, eof: true, ..
            }) => ArtifactError::TruncatedArchive {
                location,
                detail: format!("the {codec} stream ends early{at}"),
            },
            Some(StreamError::Decode { codec, source, .. }) => ArtifactError::CorruptArchive {
                location,
                detail: format!("bad {codec} data{at}: {source}"),
            },
            None if e.kind() == io::ErrorKind::UnexpectedEof => self.ends_early(entry),
            None => ArtifactError::CorruptArchive {
                location,
                detail: format!("bad {name} data{at}: {e}"),
            },
        }
    }

    /// Map an error of the tar walk: one the tar crate raises itself after the stream has
    /// `ended` is a truncation (see [`EndSeen`]), anything else goes to [`Self::read_error`].
    fn tar_error(&self, e: io::Error, entry: &str, ended: bool) -> ArtifactError {
        if ended && tar_own_error(&e) {
            return self.ends_early(entry);
        }
        self.read_error(e, entry)
    }

    /// The archive's data ends before its tar does.
    fn ends_early(&self, entry: &str) -> ArtifactError {
        ArtifactError::TruncatedArchive {
            location: self.location(),
            detail: format!(
                "the {} data ends early{}",
                self.format.name(),
                at_entry(entry)
            ),
        }
    }

    /// Walk the tar entries; returns the reader positioned after the archive's end.
    fn unpack_tar<R: Read>(&mut self, reader: R) -> Result<R, ArtifactError> {
        let ended = Cell::new(false);
        let mut archive = tar::Archive::new(EndSeen {
            inner: reader,
            ended: &ended,
        });
        let mut entries = archive
            .entries()
            .map_err(|e| self.tar_error(e, "", ended.get()))?;
        let mut at = "(the first entry)".to_string();
        loop {
            // headers, long names, pax records and the skipped rest of the last entry
            self.meter.start_headers();
            let next = entries.next();
            self.meter.end_headers();
            let Some(entry) = next else { break };
            let entry = entry.map_err(|e| self.tar_error(e, &at, ended.get()))?;
            at = format!("after {}", shown_name(&entry.path_bytes()));
            self.unpack_entry(entry)?;
        }
        Ok(archive.into_inner().inner)
    }

    fn unpack_entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>) -> Result<(), ArtifactError> {
        let raw_path = entry.path_bytes().into_owned();
        let name = shown_name(&raw_path);
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
                self.check_file_size(&name, size)?;
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
                self.hard_link(&name, &link, &target)
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

    /// A file's size against the per-file limit, and what its data adds to the unpacked total.
    fn check_file_size(&self, name: &str, size: u64) -> Result<(), ArtifactError> {
        let limits = self.opts.limits;
        if size > limits.max_file_bytes {
            return Err(self.too_large(
                name,
                format!(
                    "{size} bytes, above the per-file limit of {}",
                    limits.max_file_bytes
                ),
            ));
        }
        // its data would take the tar stream past the cap
        if self.meter.read().saturating_add(size) > limits.max_unpacked_bytes {
            return Err(self.too_large(
                name,
                format!(
                    "{size} more bytes would exceed the unpacked limit of {}",
                    limits.max_unpacked_bytes
                ),
            ));
        }
        Ok(())
    }

    /// A hard link `target` to `link`: only to a regular file the archive wrote earlier.
    fn hard_link(&self, name: &str, link: &[u8], target: &Path) -> Result<(), ArtifactError> {
        let shown = shown_name(link);
        let to = safe_relative(link)
            .map_err(|rule| self.unsafe_entry(name, format!("hard link to {shown:?}: {rule}")))?
            .ok_or_else(|| self.unsafe_entry(name, "hard link to the root directory"))?;
        self.check_parents(&to, name, false)?;
        let src = self.dest.join(&to);
        match fs::symlink_metadata(&src) {
            Ok(m) if m.is_file() => fs::hard_link(&src, target)
                .map_err(|e| ArtifactError::io("create hard link", target, e)),
            _ => Err(self.unsafe_entry(
                name,
                format!(
                    "hard link to {shown:?}, which is not an earlier regular file in the archive"
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

/// Where in the archive, for an error's detail: "" before the first entry.
fn at_entry(entry: &str) -> String {
    if entry.is_empty() {
        String::new()
    } else {
        format!(" at entry {entry:?}")
    }
}

/// The reader the tar walk reads, noting when the stream has ended (a read of a non-empty
/// buffer gave 0 bytes).
///
/// The tar crate reports a stream that ends inside a header block or inside data it skips
/// with a plain `ErrorKind::Other` error ("failed to read entire block", "unexpected EOF
/// during skip"), no type or kind to tell it from a malformed header. So the truncation is
/// checked directly: an error the tar crate raised after its stream ended is one.
struct EndSeen<'e, R> {
    inner: R,
    ended: &'e Cell<bool>,
}

impl<R: Read> Read for EndSeen<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.ended.set(true);
        }
        Ok(n)
    }
}

/// An error the tar crate made itself (kind `Other`), not one of the stream under it (those
/// carry a [`StreamError`], or the kind of the reader's own error).
fn tar_own_error(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Other && StreamError::of(e).is_none()
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

    /// A plain tar of one file `a` of `size` bytes, then `b`, a file of one byte.
    fn two_files(size: usize) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in [("a", vec![7u8; size]), ("b", vec![1u8])] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, &data[..]).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn unpack(bytes: &[u8]) -> Result<UnpackSummary, ArtifactError> {
        let dest = tempfile::tempdir().unwrap();
        let limits = Limits::default();
        let opts = UnpackOptions {
            location: "test.tar",
            bare_name: "shim",
            limits: &limits,
        };
        unpack_stream(bytes, dest.path(), &opts)
    }

    #[test]
    fn a_tar_cut_inside_a_header_block_ends_early() {
        let tar = two_files(10);
        // a's header and its one data block, then half of b's header
        let e = unpack(&tar[..1024 + 256]).unwrap_err();
        assert_eq!(e.reason(), "TruncatedArchive", "{e}");
        assert!(e.to_string().contains("the tar data ends early"), "{e}");
    }

    #[test]
    fn a_tar_cut_inside_the_padding_it_skips_ends_early() {
        // a's data fills 10 bytes of its block; the cut leaves the rest of that block out,
        // which the tar walk skips on its way to the next header
        let tar = two_files(10);
        let e = unpack(&tar[..512 + 100]).unwrap_err();
        assert_eq!(e.reason(), "TruncatedArchive", "{e}");
    }

    #[test]
    fn a_bad_header_checksum_in_a_whole_stream_is_corrupt_not_truncated() {
        let mut tar = two_files(10);
        tar[1024] ^= 0xff; // first byte of b's name
        let e = unpack(&tar).unwrap_err();
        assert_eq!(e.reason(), "CorruptArchive", "{e}");
    }

    #[test]
    fn only_an_error_the_tar_crate_raises_after_the_stream_ended_is_a_truncation() {
        let limits = Limits::default();
        let opts = UnpackOptions {
            location: "test.tar",
            bare_name: "shim",
            limits: &limits,
        };
        let meter = Meter::new(u64::MAX);
        let u = Unpacker {
            dest: Path::new("/nonexistent"),
            opts: &opts,
            format: Format::Tar,
            meter: &meter,
            summary: UnpackSummary::default(),
        };
        let own = || io::Error::other("failed to read entire block");
        assert_eq!(u.tar_error(own(), "", true).reason(), "TruncatedArchive");
        assert_eq!(u.tar_error(own(), "", false).reason(), "CorruptArchive");
        let aborted = io::Error::new(io::ErrorKind::ConnectionAborted, "download interrupted");
        assert_eq!(u.tar_error(aborted, "", true).reason(), "CorruptArchive");
    }
}
