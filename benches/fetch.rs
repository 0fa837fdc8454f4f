//! Benchmark: fetch + verify + unpack of a mostly incompressible artifact over loopback
//! HTTP, against the baseline `curl -s URL | tee >(sha256sum) | tar xz` on the same file in
//! the same run; then the peak RSS of one install in a child process for two artifact
//! sizes, to show memory does not grow with the artifact.
//!
//! Run: `cargo bench --bench fetch` (env `FETCH_BENCH_MB`, default 100; `FETCH_BENCH_RUNS`,
//! default 3).

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use shim_agent::artifact::{ArtifactSource, Fetcher, Limits, RetryPolicy, Store};
use support::{Entry, Route, TestServer, real_elf, sha256_hex, tar_gz};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        child(&args[2], &args[3]);
        return;
    }
    let mb: usize = env_num("FETCH_BENCH_MB", 100);
    let runs: usize = env_num("FETCH_BENCH_RUNS", 3);
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
    let dir = tempfile::tempdir().expect("tempdir");
    let script = format!(
        "curl -s {url} | tee >(sha256sum > {d}/sum) | tar xz -C {d}",
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
