//! What an artifact's bytes are, told from their magic numbers, and the tar stream inside
//! a compressed one.
//!
//! Formats: gzip (`1f 8b`), zstd (`28 b5 2f fd`) and xz (`fd 37 7a 58 5a 00`), each of which
//! must hold a tar; a plain tar (`ustar` at offset 257); a bare ELF binary (`7f 45 4c 46`).
//!
//! [`TarStream`] is the one reader the tar walk sees, whatever the format: the download
//! itself for a plain tar, else its decoder's output. Only the first gzip member, zstd frame
//! or xz stream is decoded; the download's bytes after it are left to the caller, who reads
//! them so that the digest covers every byte.
//!
//! # Guarantees
//!
//! - Every byte the stream yields counts on a [`Meter`]: tar headers, file data, padding, and
//!   whatever follows the tar's end. Past the meter's cap (the unpacked limit) the stream
//!   fails, so no format can be decompressed further than that, whatever the ratio.
//! - While the tar walk looks for its next entry the meter allows at most
//!   [`MAX_HEADER_BYTES`]: that covers GNU long names and pax records (the tar crate holds
//!   them in memory) and the data of entries it skips.
//! - Decoder memory is bounded: a zstd window or an xz dictionary of at most
//!   [`MAX_WINDOW_BYTES`] (zstd's own default limit; `xz -9` needs 64 MiB).
//! - A zstd frame's content checksum is checked at its end (gzip and xz check theirs).
//! - Errors carry a [`StreamError`], so the unpacker tells a truncated or corrupt compressed
//!   stream and a cap from a bad tar. Errors of a plain tar's raw reads pass unchanged.

use std::cell::Cell;
use std::error::Error;
use std::fmt;
use std::io::{self, Read};

use ruzstd::decoding::{FrameDecoder, StreamingDecoder, errors::FrameDecoderError};

use super::elf;

/// Largest zstd window or xz dictionary accepted: the memory a decoder may take.
pub(super) const MAX_WINDOW_BYTES: u64 = 128 << 20;
/// Most bytes read while looking for the next tar entry (headers, long names, pax
/// records, skipped data).
pub(super) const MAX_HEADER_BYTES: u64 = 1 << 20;

const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const XZ_MAGIC: &[u8] = &[0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00];

/// What a download is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Format {
    Tar,
    Gzip,
    Zstd,
    Xz,
    Elf,
}

impl Format {
    /// The format whose magic number `head` (the download's first bytes) starts with.
    pub(super) fn detect(head: &[u8]) -> Option<Format> {
        if head.starts_with(GZIP_MAGIC) {
            Some(Format::Gzip)
        } else if head.starts_with(ZSTD_MAGIC) {
            Some(Format::Zstd)
        } else if head.starts_with(XZ_MAGIC) {
            Some(Format::Xz)
        } else if is_tar(head) {
            Some(Format::Tar)
        } else if elf::is_elf(head) {
            Some(Format::Elf)
        } else {
            None
        }
    }

    /// The artifact's kind as a file name would say it: "tar.zst".
    pub(super) fn name(self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::Gzip => "tar.gz",
            Format::Zstd => "tar.zst",
            Format::Xz => "tar.xz",
            Format::Elf => "ELF",
        }
    }

    /// The outer layer: the compression, or the format itself.
    pub(super) fn codec(self) -> &'static str {
        match self {
            Format::Gzip => "gzip",
            Format::Zstd => "zstd",
            Format::Xz => "xz",
            other => other.name(),
        }
    }
}

/// Size of the head read to detect the format (one tar header block).
const HEAD_LEN: usize = 512;

/// Read up to [`HEAD_LEN`] bytes; the reader continues after them.
pub(super) fn read_head<R: Read>(mut r: R) -> io::Result<(Vec<u8>, R)> {
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

/// A printable hint of what the bytes look like.
pub(super) fn preview(head: &[u8]) -> String {
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

/// A tar header block: `ustar` magic at offset 257 (POSIX and GNU).
pub(super) fn is_tar(head: &[u8]) -> bool {
    head.len() >= 262 && &head[257..262] == b"ustar"
}

/// Which cap a stream ran into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cap {
    /// The whole stream's: the unpacked limit.
    Total,
    /// [`MAX_HEADER_BYTES`] between two entries.
    Headers,
}

/// Counts the bytes a [`TarStream`] yields. Shared with the tar walk, which reads the
/// position and narrows the limit while it reads headers.
#[derive(Debug)]
pub(super) struct Meter {
    cap: u64,
    read: Cell<u64>,
    headers_end: Cell<Option<u64>>,
}

impl Meter {
    pub(super) fn new(cap: u64) -> Meter {
        Meter {
            cap,
            read: Cell::new(0),
            headers_end: Cell::new(None),
        }
    }

    /// Bytes yielded so far.
    pub(super) fn read(&self) -> u64 {
        self.read.get()
    }

    /// The cap on the whole stream.
    pub(super) fn cap(&self) -> u64 {
        self.cap
    }

    /// Allow at most [`MAX_HEADER_BYTES`] more until [`Meter::end_headers`].
    pub(super) fn start_headers(&self) {
        self.headers_end
            .set(Some(self.read().saturating_add(MAX_HEADER_BYTES)));
    }

    pub(super) fn end_headers(&self) {
        self.headers_end.set(None);
    }

    /// The position the stream may not pass, and the cap that sets it.
    fn limit(&self) -> (u64, Cap) {
        match self.headers_end.get() {
            Some(end) if end < self.cap => (end, Cap::Headers),
            _ => (self.cap, Cap::Total),
        }
    }
}

/// Why a [`TarStream`] failed; carried inside the `io::Error` it returns.
#[derive(Debug)]
pub(super) enum StreamError {
    /// More bytes than a cap allows: an archive bomb.
    OverCap(Cap),
    /// The stream needs a larger window or dictionary than [`MAX_WINDOW_BYTES`].
    Window {
        codec: &'static str,
        needed: Option<u64>,
    },
    /// The compressed data is corrupt, or ends early (`eof`).
    Decode {
        codec: &'static str,
        eof: bool,
        source: io::Error,
    },
}

impl fmt::Display for StreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamError::OverCap(cap) => write!(f, "over the {cap:?} cap"),
            StreamError::Window { codec, .. } => write!(f, "{codec} window too large"),
            StreamError::Decode { codec, source, .. } => write!(f, "bad {codec} data: {source}"),
        }
    }
}

impl Error for StreamError {}

impl StreamError {
    fn into_io(self) -> io::Error {
        let kind = match &self {
            StreamError::Decode { eof: true, .. } => io::ErrorKind::UnexpectedEof,
            StreamError::Decode { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, self)
    }

    /// The `StreamError` inside `e`, if it came from a [`TarStream`].
    pub(super) fn of(e: &io::Error) -> Option<&StreamError> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }
}

/// A decoder error, truncation told apart.
fn decode_error(codec: &'static str, source: io::Error) -> io::Error {
    StreamError::Decode {
        codec,
        eof: ends_early(&source),
        source,
    }
    .into_io()
}

/// True when an error, or any error under it, is an unexpected end of input.
fn ends_early(e: &io::Error) -> bool {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        return true;
    }
    let mut cur: Option<&(dyn Error + 'static)> = e.get_ref().map(|x| x as _);
    while let Some(c) = cur {
        if c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::UnexpectedEof)
        {
            return true;
        }
        cur = c.source();
    }
    false
}

enum Decoder<R: Read> {
    Plain(R),
    Gzip(flate2::read::GzDecoder<R>),
    /// The flag: the frame's end was reached and its checksum checked.
    Zstd(Box<StreamingDecoder<R, FrameDecoder>>, bool),
    Xz(Box<lzma_rust2::XzReader<R>>),
}

/// The tar stream of a download (see the module's doc).
pub(super) struct TarStream<'m, R: Read> {
    decoder: Decoder<R>,
    meter: &'m Meter,
}

impl<'m, R: Read> TarStream<'m, R> {
    /// Start reading a tar of `format` from `raw`, the whole download. A zstd frame's header
    /// is read here.
    pub(super) fn open(format: Format, raw: R, meter: &'m Meter) -> io::Result<Self> {
        let decoder = match format {
            Format::Gzip => Decoder::Gzip(flate2::read::GzDecoder::new(raw)),
            Format::Zstd => match StreamingDecoder::new_with_max_window_size(raw, MAX_WINDOW_BYTES)
            {
                Ok(d) => Decoder::Zstd(Box::new(d), false),
                Err(FrameDecoderError::WindowSizeTooBig { requested, .. }) => {
                    return Err(StreamError::Window {
                        codec: "zstd",
                        needed: Some(requested),
                    }
                    .into_io());
                }
                Err(e) => return Err(decode_error("zstd", io::Error::other(e))),
            },
            Format::Xz => {
                // in KiB: the dictionary plus the decoder's own buffers
                let limit_kib = u32::try_from((MAX_WINDOW_BYTES >> 10) + 1024).unwrap_or(u32::MAX);
                Decoder::Xz(Box::new(lzma_rust2::XzReader::new_mem_limit(
                    raw, false, limit_kib,
                )))
            }
            Format::Tar | Format::Elf => Decoder::Plain(raw),
        };
        Ok(TarStream { decoder, meter })
    }

    /// The download after the compressed stream (all of it for a plain tar: nothing left).
    pub(super) fn into_raw(self) -> R {
        match self.decoder {
            Decoder::Plain(r) => r,
            Decoder::Gzip(d) => d.into_inner(),
            Decoder::Zstd(d, _) => d.into_inner(),
            Decoder::Xz(d) => d.into_inner(),
        }
    }

    fn read_decoded(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.decoder {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(d) => d.read(buf).map_err(|e| decode_error("gzip", e)),
            Decoder::Zstd(d, checked) => {
                let n = d.read(buf).map_err(|e| decode_error("zstd", e))?;
                if n == 0 && !buf.is_empty() && !*checked {
                    *checked = true;
                    check_zstd_checksum(&d.decoder)?;
                }
                Ok(n)
            }
            Decoder::Xz(d) => d.read(buf).map_err(|e| {
                if e.kind() == io::ErrorKind::OutOfMemory {
                    StreamError::Window {
                        codec: "xz",
                        needed: None,
                    }
                    .into_io()
                } else {
                    decode_error("xz", e)
                }
            }),
        }
    }
}

fn check_zstd_checksum(frame: &FrameDecoder) -> io::Result<()> {
    match (
        frame.get_checksum_from_data(),
        frame.get_calculated_checksum(),
    ) {
        (Some(stored), Some(computed)) if stored != computed => Err(StreamError::Decode {
            codec: "zstd",
            eof: false,
            source: io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "content checksum mismatch (frame says {stored:08x}, data gives {computed:08x})"
                ),
            ),
        }
        .into_io()),
        _ => Ok(()),
    }
}

impl<R: Read> Read for TarStream<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let (limit, cap) = self.meter.limit();
        let read = self.meter.read();
        // one byte past the room left: enough to see that the stream goes on
        let room =
            usize::try_from(limit.saturating_sub(read).saturating_add(1)).unwrap_or(usize::MAX);
        let want = buf.len().min(room);
        let n = self.read_decoded(&mut buf[..want])?;
        let read = read + n as u64;
        self.meter.read.set(read);
        if read > limit {
            return Err(StreamError::OverCap(cap).into_io());
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_by_their_magic_numbers() {
        let mut tar = vec![0u8; 512];
        tar[257..262].copy_from_slice(b"ustar");
        assert_eq!(Format::detect(&[0x1f, 0x8b, 8, 0]), Some(Format::Gzip));
        assert_eq!(
            Format::detect(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Some(Format::Zstd)
        );
        assert_eq!(
            Format::detect(&[0xfd, b'7', b'z', b'X', b'Z', 0, 0]),
            Some(Format::Xz)
        );
        assert_eq!(Format::detect(&tar), Some(Format::Tar));
        assert_eq!(Format::detect(b"\x7fELF\x02\x01\x01"), Some(Format::Elf));
        assert_eq!(Format::detect(b"<html>"), None);
        assert_eq!(Format::detect(&[0xfd, b'7', b'z', b'X', b'Z']), None);
        assert_eq!(Format::detect(&[]), None);
    }

    #[test]
    fn the_meter_stops_a_stream_one_byte_past_its_cap() {
        let meter = Meter::new(10);
        let data = [7u8; 10];
        let mut s = TarStream::open(Format::Tar, &data[..], &meter).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), 10, "exactly the cap is allowed");

        let data = [7u8; 11];
        let meter = Meter::new(10);
        let mut s = TarStream::open(Format::Tar, &data[..], &meter).unwrap();
        let e = s.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(matches!(
            StreamError::of(&e),
            Some(StreamError::OverCap(Cap::Total))
        ));
    }

    #[test]
    fn the_header_window_is_narrower_than_the_cap() {
        let meter = Meter::new(u64::MAX);
        let data = vec![0u8; (MAX_HEADER_BYTES + 1) as usize];
        let mut s = TarStream::open(Format::Tar, &data[..], &meter).unwrap();
        meter.start_headers();
        let e = s.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(matches!(
            StreamError::of(&e),
            Some(StreamError::OverCap(Cap::Headers))
        ));
        meter.end_headers();
        assert_eq!(meter.limit(), (u64::MAX, Cap::Total));
    }
}
