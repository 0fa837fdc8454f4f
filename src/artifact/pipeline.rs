//! One pass from a byte stream to an unpacked, verified tree: the async side counts and
//! hashes each chunk and hands it over a bounded channel to a blocking thread that
//! unpacks it. Hashing and decompression run on two cores at once, and memory stays at
//! a few chunks whatever the artifact's size.
//!
//! Error precedence: a transfer error (retryable) wins over what the unpacker made of the
//! cut-off stream; otherwise the unpacker's error; otherwise the digest check.

use std::io::{self, Read};
use std::path::Path;
use std::pin::Pin;

use bytes::{Buf, Bytes};
use futures_util::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::unpack::{UnpackOptions, unpack_stream};
use super::{ArtifactError, Limits};

/// Chunks in flight between the downloader and the unpacker.
const CHANNEL_CHUNKS: usize = 16;

/// A stream of downloaded bytes.
pub(crate) type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, ArtifactError>> + Send>>;

/// An opened download.
pub(crate) struct Download {
    pub stream: ByteStream,
    /// Content length, when the server said.
    pub len: Option<u64>,
}

/// What the pipeline needs to know besides the bytes.
pub(crate) struct PipelineCtx<'a> {
    pub location: &'a str,
    pub bare_name: &'a str,
    pub expected: Option<&'a str>,
    pub limits: &'a Limits,
    pub progress: bool,
}

/// Stream `download` into `dest`, returning the sha256 (hex) of all its bytes.
pub(crate) async fn verify_and_unpack(
    download: Download,
    dest: &Path,
    ctx: &PipelineCtx<'_>,
) -> Result<String, ArtifactError> {
    let Download { mut stream, len } = download;
    if let Some(n) = len.filter(|n| *n > ctx.limits.max_download_bytes) {
        tracing::debug!(len = n, "content length above the download limit");
        return Err(too_large(ctx));
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, ()>>(CHANNEL_CHUNKS);
    let unpacker = spawn_unpacker(rx, dest, ctx);
    let bar = super::progress::bar(ctx.progress, len, ctx.location);
    let fed = feed(&mut stream, &tx, &bar, ctx).await;
    drop(tx);
    let unpacked = unpacker.await;
    bar.finish_and_clear();
    let Fed {
        actual,
        total,
        transfer_error,
    } = fed;
    if let Some(e) = transfer_error {
        // Every byte arrived and the source only then complained (a registry's own
        // digest check): report the mismatch itself, which is not worth a retry.
        if let Some(expected) = ctx.expected.filter(|x| len == Some(total) && *x != actual) {
            return Err(mismatch(ctx, expected, actual));
        }
        return Err(e);
    }
    match unpacked {
        Ok(Ok(summary)) => tracing::debug!(
            location = ctx.location,
            entries = summary.entries,
            bytes = summary.bytes,
            "unpacked"
        ),
        Ok(Err(e)) => return Err(e),
        Err(join) => {
            return Err(ArtifactError::io(
                "unpack into",
                dest,
                io::Error::other(join.to_string()),
            ));
        }
    }
    match ctx.expected {
        Some(expected) if expected != actual => Err(mismatch(ctx, expected, actual)),
        _ => Ok(actual),
    }
}

/// The unpacker, on a blocking thread, reading the chunks `rx` brings.
fn spawn_unpacker(
    rx: mpsc::Receiver<Result<Bytes, ()>>,
    dest: &Path,
    ctx: &PipelineCtx<'_>,
) -> tokio::task::JoinHandle<Result<super::unpack::UnpackSummary, ArtifactError>> {
    let (dest, location, bare) = (
        dest.to_path_buf(),
        ctx.location.to_string(),
        ctx.bare_name.to_string(),
    );
    let limits = ctx.limits.clone();
    tokio::task::spawn_blocking(move || {
        let opts = UnpackOptions {
            location: &location,
            bare_name: &bare,
            limits: &limits,
        };
        let reader = ChannelReader {
            rx,
            cur: Bytes::new(),
        };
        unpack_stream(reader, &dest, &opts)
    })
}

/// What the download gave: the digest of the bytes that arrived, how many, and the transfer's
/// error if it broke off.
struct Fed {
    actual: String,
    total: u64,
    transfer_error: Option<ArtifactError>,
}

/// Count, hash and hand over each chunk until the stream ends, fails, passes the download
/// limit or the unpacker stops (its error then says why).
async fn feed(
    stream: &mut ByteStream,
    tx: &mpsc::Sender<Result<Bytes, ()>>,
    bar: &indicatif::ProgressBar,
    ctx: &PipelineCtx<'_>,
) -> Fed {
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut transfer_error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(chunk) => {
                total += chunk.len() as u64;
                if total > ctx.limits.max_download_bytes {
                    transfer_error = Some(too_large(ctx));
                    let _ = tx.send(Err(())).await;
                    break;
                }
                hasher.update(&chunk);
                bar.inc(chunk.len() as u64);
                if tx.send(Ok(chunk)).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                let _ = tx.send(Err(())).await;
                transfer_error = Some(e);
                break;
            }
        }
    }
    Fed {
        actual: hex::encode(hasher.finalize()),
        total,
        transfer_error,
    }
}

fn mismatch(ctx: &PipelineCtx<'_>, expected: &str, actual: String) -> ArtifactError {
    ArtifactError::DigestMismatch {
        location: ctx.location.to_string(),
        expected: expected.to_string(),
        actual,
    }
}

fn too_large(ctx: &PipelineCtx<'_>) -> ArtifactError {
    ArtifactError::DownloadTooLarge {
        location: ctx.location.to_string(),
        limit: ctx.limits.max_download_bytes,
    }
}

/// The blocking end of the channel as a `Read`.
struct ChannelReader {
    rx: mpsc::Receiver<Result<Bytes, ()>>,
    cur: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(b)) => self.cur = b,
                Some(Err(())) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "download interrupted",
                    ));
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        self.cur.advance(n);
        Ok(n)
    }
}
