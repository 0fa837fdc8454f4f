//! Benchmark: fetch + verify + unpack of a mostly incompressible artifact over loopback
//! HTTP, against the baseline `curl -s URL | tee >(sha256sum) | tar xz` on the same file in
//! the same run; then the peak RSS of one install in a child process for two artifact
//! sizes, to show memory does not grow with the artifact.
//!
//! Run: `cargo bench --bench fetch` (env `FETCH_BENCH_MB`, default 100; `FETCH_BENCH_RUNS`,
//! default 3).
//!
//! `cargo bench --bench fetch -- formats` instead compares the formats: one tar of the
//! machine's own binaries (`/usr/bin`, `/usr/lib`: compressible like a real shim, unlike the
//! random payload above), compressed as tar.gz (gzip -6), tar.zst (`zstd -3`, the CLI's
//! default) and tar.xz (`xz -6`) by the CLIs (needs `gzip`, `zstd`, `xz`). For each: the
//! decoder alone (into a sink), our whole fetch, the baseline
//! `curl | tee >(sha256sum) | tar x{z,--zstd,J}` in the same run, and the peak RSS of one
//! install.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use shim_agent::artifact::{ArtifactSource, Fetcher, Limits, RetryPolicy, Store};
use support::{Entry, Route, TestServer, real_elf, sha256_hex, tar_bytes, tar_gz};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(&args[2], &args[3]);
        return;
    }
    let mb: usize = env_num("FETCH_BENCH_MB", 100);
    let runs: usize = env_num("FETCH_BENCH_RUNS", 3);
    if args.iter().any(|a| a == "formats") {
        formats(mb, runs);
        return;
    }
    let srv = TestServer::start();
    let big = artifact(mb);
    let small = artifact(10);
    srv.route("/big.tgz", Route::ok(big.clone()));
    srv.route("/small.tgz", Route::ok(small.clone()));
    let url = srv.url("/big.tgz");
    let sha = sha256_hex(&big);
    println!(
        "artifact: {} bytes gzip'd tar ({} MiB random payload + a shim binary)",
        big.len(),
        mb
    );

    let mut base = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..runs {
        base.push(baseline(&url));
        ours.push(in_process(&url, &sha));
    }
    let (b, o) = (median(&mut base), median(&mut ours));
    let rate = |d: Duration| big.len() as f64 / d.as_secs_f64() / (1 << 20) as f64;
    println!(
        "baseline curl|tee >(sha256sum)|tar xz: median {b:?} = {:.0} MiB/s  (runs: {base:?})",
        rate(b)
    );
    println!(
        "shim-agent fetch_into_store:           median {o:?} = {:.0} MiB/s  (runs: {ours:?})",
        rate(o)
    );
    println!(
        "ratio (ours/baseline throughput): {:.2}x",
        b.as_secs_f64() / o.as_secs_f64()
    );

    for (name, bytes) in [("small.tgz", &small), ("big.tgz", &big)] {
        let out = Command::new(std::env::current_exe().expect("current exe"))
            .args(["--child", &srv.url(&format!("/{name}")), &sha256_hex(bytes)])
            .output()
            .expect("run child");
        let text = String::from_utf8_lossy(&out.stdout);
        println!(
            "peak RSS of one install, {} MiB artifact: {}",
            bytes.len() >> 20,
            text.trim()
        );
        if !out.status.success() {
            eprintln!("child failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A .tar.gz holding a shim binary and `mb` MiB of pseudo-random bytes.
fn artifact(mb: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut payload = Vec::with_capacity(mb << 20);
    while payload.len() < mb << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        payload.extend_from_slice(&x.to_le_bytes());
    }
    tar_gz(&[
        Entry::File("containerd-shim-bench-v2", real_elf(), 0o755),
        Entry::File("payload.bin", payload, 0o644),
    ])
}

fn baseline(url: &str) -> Duration {
    baseline_with(url, "xz")
}

/// `curl | tee >(sha256sum) | tar <flags> -C DIR`: `flags` is "xz", "--zstd -x" or "xJ".
fn baseline_with(url: &str, flags: &str) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "curl -s {url} | tee >(sha256sum > {d}/sum) | tar {flags} -C {d}",
        d = dir.path().display()
    );
    let t = Instant::now();
    let st = Command::new("bash")
        .args(["-c", &script])
        .status()
        .expect("bash");
    let d = t.elapsed();
    assert!(st.success(), "baseline failed");
    d
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

fn fetch_once(url: &str, sha: &str) -> Duration {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("store")).expect("store");
    let fetcher = Fetcher::new(Limits::default(), RetryPolicy::default()).expect("fetcher");
    let src = ArtifactSource {
        location: url.to_string(),
        sha256: Some(sha.to_string()),
    };
    let rt = runtime();
    let t = Instant::now();
    rt.block_on(fetcher.fetch_into_store(&src, &store))
        .expect("fetch");
    t.elapsed()
}

fn in_process(url: &str, sha: &str) -> Duration {
    fetch_once(url, sha)
}

/// Child mode: one install, then print this process's peak RSS.
fn child(url: &str, sha: &str) {
    fetch_once(url, sha);
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM"))
        .unwrap_or("VmHWM: ?");
    println!(
        "{}",
        hwm.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    );
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// The formats comparison (see the header).
fn formats(mb: usize, runs: usize) {
    let (tar, files) = binaries_tar(mb);
    println!(
        "tar: {} bytes ({files} files from /usr/bin and /usr/lib, concatenated into 10 entries, + a shim binary)",
        tar.len()
    );
    let srv = TestServer::start();
    let rate = |n: usize, d: Duration| n as f64 / d.as_secs_f64() / (1 << 20) as f64;
    for (ext, cmd, flags) in [
        ("tar.gz", "gzip -6 -c", "xz"),
        ("tar.zst", "zstd -3 -q -c", "--zstd -x"),
        ("tar.xz", "xz -6 -T1 -c", "xJ"),
    ] {
        let t = Instant::now();
        let art = compress_with(cmd, &tar);
        let took = t.elapsed();
        let path = format!("/art.{ext}");
        srv.route(&path, Route::ok(art.clone()));
        let (url, sha) = (srv.url(&path), sha256_hex(&art));
        let (mut dec, mut base, mut ours) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..runs {
            dec.push(decode_only(ext, &art));
            base.push(baseline_with(&url, flags));
            ours.push(in_process(&url, &sha));
        }
        let (d, b, o) = (median(&mut dec), median(&mut base), median(&mut ours));
        println!(
            "{ext}: {} bytes ({:.1} % of the tar; `{cmd}` took {took:.1?})",
            art.len(),
            100.0 * art.len() as f64 / tar.len() as f64
        );
        println!(
            "  decoder alone:     median {d:.3?} = {:.0} MiB/s of tar, {:.0} MiB/s compressed  (runs: {dec:.3?})",
            rate(tar.len(), d),
            rate(art.len(), d)
        );
        println!(
            "  baseline curl|tar: median {b:.3?} = {:.0} MiB/s of tar  (runs: {base:.3?})",
            rate(tar.len(), b)
        );
        println!(
            "  shim-agent fetch:  median {o:.3?} = {:.0} MiB/s of tar, {:.0} MiB/s compressed  (runs: {ours:.3?})",
            rate(tar.len(), o),
            rate(art.len(), o)
        );
        let out = Command::new(std::env::current_exe().expect("current exe"))
            .args(["--child", &url, &sha])
            .output()
            .expect("run child");
        println!(
            "  peak RSS of one install: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
}

/// A tar of about `mb` MiB of the machine's binaries, in 10 entries, and how many files
/// went into it.
fn binaries_tar(mb: usize) -> (Vec<u8>, usize) {
    let want = mb << 20;
    let mut payload = Vec::with_capacity(want);
    let mut files = 0;
    let mut todo = vec![
        std::path::PathBuf::from("/usr/lib"),
        std::path::PathBuf::from("/usr/bin"),
    ];
    while let Some(dir) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries.into_iter().rev() {
            let Ok(m) = std::fs::symlink_metadata(&p) else {
                continue;
            };
            if m.is_dir() {
                todo.push(p);
            } else if m.is_file()
                && m.len() < 30 << 20
                && payload.len() < want
                && let Ok(b) = std::fs::read(&p)
            {
                payload.extend_from_slice(&b);
                files += 1;
            }
        }
    }
    payload.truncate(want);
    let mut entries = vec![Entry::File("containerd-shim-bench-v2", real_elf(), 0o755)];
    let names = ["p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7", "p8", "p9"];
    for (i, chunk) in payload.chunks(want.div_ceil(10)).enumerate() {
        entries.push(Entry::File(names[i], chunk.to_vec(), 0o644));
    }
    (tar_bytes(&entries), files)
}

/// `data` through a compressor's command line (stdin to stdout).
fn compress_with(cmd: &str, data: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut parts = cmd.split_whitespace();
    let mut child = Command::new(parts.next().expect("command"))
        .args(parts)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd}: {e} (install it to run this benchmark)"));
    let mut stdin = child.stdin.take().expect("stdin");
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("compressor output");
    writer.join().expect("writer").expect("write to compressor");
    assert!(out.status.success(), "{cmd} failed");
    out.stdout
}

/// The decoder the unpacker uses, alone, into a sink.
fn decode_only(ext: &str, art: &[u8]) -> Duration {
    let t = Instant::now();
    let n = match ext {
        "tar.gz" => std::io::copy(&mut flate2::read::GzDecoder::new(art), &mut std::io::sink()),
        "tar.zst" => std::io::copy(
            &mut ruzstd::decoding::StreamingDecoder::new(art).expect("zstd frame"),
            &mut std::io::sink(),
        ),
        _ => std::io::copy(
            &mut lzma_rust2::XzReader::new(art, false),
            &mut std::io::sink(),
        ),
    }
    .expect("decode");
    assert!(n > 0);
    t.elapsed()
}
