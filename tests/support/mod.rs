//! The helpers of every test group (`tests/pure`, `tests/kube`, `tests/node`,
//! `tests/failpoints`), one tree compiled into each:
//!
//! - here: a tiny loopback HTTP server (one thread per connection, scripted responses, hit
//!   counts), archive builders including hostile entries, ELF helpers and a directory snapshot
//!   to prove "nothing changed";
//! - [`live`]: a scripted containerd for the transaction engine; [`image_root`]: image roots
//!   for offline installs; [`containerd`]: the config engine's round-trip checks;
//! - [`kube`]: the real control plane of the kube env; [`agent_rig`]: one agent against it;
//!   [`fleet`]: fleets of agents, [`apiservers`]: its API servers and their replicas;
//!   [`hookserver`], [`hooks_kube`], [`tls`]: test extensions;
//! - [`node_env`]: the real systemd + containerd node of `.ci/node-env/`;
//! - [`shim_builder`]: `Shim` objects and manifests for every test, instead of YAML literals.
#![allow(dead_code)]

pub mod agent_rig;
pub mod apiservers;
pub mod containerd;
pub mod failure_table;
pub mod fleet;
pub mod hooks_kube;
pub mod hookserver;
pub mod image_root;
pub mod kube;
pub mod live;
pub mod node_env;
pub mod option_paths;
pub mod proxy;
pub mod registry;
pub mod runtime_classes;
pub mod shim_builder;
pub mod shim_cases;
pub mod sigstore;
pub mod sigstore_rekor;
pub mod sigstore_tsa;
pub mod tls;

/// The one way a test that needs an env (the kube env, the node env) says it cannot run here:
/// with the variable `require` set to `1` (CI) a panic, else a printed `SKIPPED` line, and the
/// caller returns.
pub fn skip(what: &str, require: &str, reason: &str) {
    if std::env::var(require).as_deref() == Ok("1") {
        panic!("{what}: required ({require}=1) but cannot run: {reason}");
    }
    eprintln!("SKIPPED {what}: {reason}");
}

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::{Digest, Sha256};

/// How a route answers.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// Send the whole response.
    Normal,
    /// Accept, read the request, then say nothing for this long.
    Hang(Duration),
    /// Send headers (with the full Content-Length) and this many body bytes, then close.
    CutAfter(usize),
    /// Send the body without a Content-Length, ending it by closing the connection.
    NoLength,
}

/// One scripted response.
#[derive(Clone, Debug)]
pub struct Route {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Arc<Vec<u8>>,
    pub behavior: Behavior,
    /// When set, requests without exactly this `Authorization` header get a 401.
    pub require_auth: Option<String>,
    /// Extra headers on that 401 (a `WWW-Authenticate` challenge).
    pub challenge: Vec<(String, String)>,
}

impl Route {
    pub fn ok(body: impl Into<Vec<u8>>) -> Route {
        Route::status(200, body)
    }

    pub fn status(status: u16, body: impl Into<Vec<u8>>) -> Route {
        Route {
            status,
            headers: Vec::new(),
            body: Arc::new(body.into()),
            behavior: Behavior::Normal,
            require_auth: None,
            challenge: Vec::new(),
        }
    }

    pub fn header(mut self, k: &str, v: &str) -> Route {
        self.headers.push((k.into(), v.into()));
        self
    }

    pub fn behave(mut self, b: Behavior) -> Route {
        self.behavior = b;
        self
    }

    pub fn auth(mut self, value: &str, challenge: Option<&str>) -> Route {
        self.require_auth = Some(value.into());
        if let Some(c) = challenge {
            self.challenge.push(("WWW-Authenticate".into(), c.into()));
        }
        self
    }
}

#[derive(Default)]
struct State {
    /// path (without query) → responses; the last one repeats.
    routes: HashMap<String, Vec<Route>>,
    hits: HashMap<String, usize>,
    auth_seen: Vec<(String, Option<String>)>,
}

/// A loopback HTTP/1.1 server on its own threads; it lives as long as the test process.
#[derive(Clone)]
pub struct TestServer {
    pub addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &st);
                });
            }
        });
        TestServer { addr, state }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// `host:port`, for OCI references.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    pub fn route(&self, path: &str, r: Route) {
        self.routes(path, vec![r]);
    }

    /// Answer with these in order, the last one for every later request.
    pub fn routes(&self, path: &str, rs: Vec<Route>) {
        self.state.lock().unwrap().routes.insert(path.into(), rs);
    }

    pub fn hits(&self, path: &str) -> usize {
        *self.state.lock().unwrap().hits.get(path).unwrap_or(&0)
    }

    pub fn total_hits(&self) -> usize {
        self.state.lock().unwrap().hits.values().sum()
    }

    /// (path, Authorization header) of every request so far.
    pub fn auth_seen(&self) -> Vec<(String, Option<String>)> {
        self.state.lock().unwrap().auth_seen.clone()
    }
}

fn serve(conn: TcpStream, state: &Mutex<State>) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let path = target.split('?').next().unwrap_or("/").to_string();
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("authorization")
        {
            auth = Some(v.trim().to_string());
        }
    }
    let route = {
        let mut st = state.lock().unwrap();
        let n = {
            let c = st.hits.entry(path.clone()).or_insert(0);
            *c += 1;
            *c
        };
        st.auth_seen.push((path.clone(), auth.clone()));
        st.routes
            .get(&path)
            .map(|rs| rs[(n - 1).min(rs.len() - 1)].clone())
    };
    let mut conn = conn;
    let Some(route) = route else {
        return respond(&mut conn, 404, &[], b"not found\n", None);
    };
    if let Some(want) = &route.require_auth
        && auth.as_deref() != Some(want.as_str())
    {
        return respond(&mut conn, 401, &route.challenge, b"unauthorized\n", None);
    }
    match route.behavior {
        Behavior::Normal => respond(&mut conn, route.status, &route.headers, &route.body, None),
        Behavior::Hang(d) => {
            std::thread::sleep(d);
            Ok(())
        }
        Behavior::CutAfter(n) => respond(
            &mut conn,
            route.status,
            &route.headers,
            &route.body,
            Some(n),
        ),
        Behavior::NoLength => {
            conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")?;
            conn.write_all(&route.body)
        }
    }
}

fn respond(
    conn: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
    cut: Option<usize>,
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    let n = cut.unwrap_or(body.len()).min(body.len());
    conn.write_all(&body[..n])?;
    conn.flush()?;
    if cut.is_some() {
        // Reset rather than a clean close, like a dropped connection.
        let _ = conn.shutdown(std::net::Shutdown::Both);
    }
    Ok(())
}

// ---- archives ----

pub fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// The bytes of a small real ELF executable for this machine: a static x86-64 program (no
/// interpreter, no libraries, so it runs in any root, as the preflight runs a shim) that
/// answers as a shim answers `-v` and exits 0.
pub fn real_elf() -> Vec<u8> {
    static_elf(TEST_SHIM_ANSWER)
}

/// What [`real_elf`] prints.
pub const TEST_SHIM_ANSWER: &str = "containerd-shim-test-v1:\n  Version: 1.0.0\n";

/// A minimal static x86-64 ELF executable that writes `message` to stdout and exits 0: one
/// `PT_LOAD` segment holding the headers, 33 bytes of code (`write`, `exit`) and the message.
pub fn static_elf(message: &str) -> Vec<u8> {
    assert_eq!(
        std::env::consts::ARCH,
        "x86_64",
        "the test shim is x86-64 code"
    );
    const BASE: u64 = 0x40_0000;
    const CODE_AT: u64 = 64 + 56;
    let msg = message.as_bytes();
    let len = u32::try_from(msg.len()).expect("a short message");
    let mut code = vec![0xb8, 1, 0, 0, 0, 0xbf, 1, 0, 0, 0]; // mov eax, 1 (write); mov edi, 1
    code.extend([0x48, 0x8d, 0x35, 16, 0, 0, 0]); // lea rsi, [rip + 16]: the message
    code.push(0xba); // mov edx, len
    code.extend(len.to_le_bytes());
    code.extend([0x0f, 0x05, 0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]); // syscall; exit(0)
    let total = CODE_AT + code.len() as u64 + msg.len() as u64;
    let mut elf = vec![0x7f, b'E', b'L', b'F', 2, 1, 1, 0];
    elf.resize(16, 0);
    elf.extend(2u16.to_le_bytes()); // ET_EXEC
    elf.extend(62u16.to_le_bytes()); // EM_X86_64
    elf.extend(1u32.to_le_bytes());
    elf.extend((BASE + CODE_AT).to_le_bytes()); // entry
    elf.extend(64u64.to_le_bytes()); // program headers
    elf.extend(0u64.to_le_bytes()); // no section headers
    elf.extend(0u32.to_le_bytes());
    for v in [64u16, 56, 1, 64, 0, 0] {
        elf.extend(v.to_le_bytes());
    }
    elf.extend(1u32.to_le_bytes()); // PT_LOAD
    elf.extend(5u32.to_le_bytes()); // R + X
    for v in [0, BASE, BASE, total, total, 0x1000] {
        elf.extend(v.to_le_bytes());
    }
    elf.extend(code);
    elf.extend(msg);
    // then 32 KiB that no segment loads, incompressible, so that the artifact weighs what a
    // small real binary weighs (the download caps of the fetch tests count on it)
    let mut x: u32 = 0x2545_f491;
    elf.extend((0..32 * 1024).map(|_| {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x.to_le_bytes()[0]
    }));
    elf
}

/// An ELF header for an architecture other than this node's.
pub fn foreign_elf() -> Vec<u8> {
    let machine: u16 = if std::env::consts::ARCH == "aarch64" {
        62
    } else {
        183
    };
    let mut h = vec![0x7f, b'E', b'L', b'F', 2, 1, 1];
    h.resize(16, 0);
    h.extend(2u16.to_le_bytes()); // ET_EXEC
    h.extend(machine.to_le_bytes());
    h.resize(4096, 0);
    h
}

/// A tar entry for [`tar_bytes`]; hostile names are written raw into the header.
pub enum Entry {
    File(&'static str, Vec<u8>, u32),
    Dir(&'static str),
    Symlink(&'static str, &'static str),
    Hardlink(&'static str, &'static str),
    CharDevice(&'static str),
    Fifo(&'static str),
    /// A file whose name is any bytes, up to 100 (the header's name field).
    RawName(Vec<u8>, Vec<u8>, u32),
    /// A file with a name of any length, through a GNU long-name entry.
    LongName(Vec<u8>, Vec<u8>),
    /// A GNU long-name entry of this many bytes (name bytes `a`), then a small file.
    HugeLongName(usize),
    /// A directory whose header claims this many bytes of data, all there (zeros).
    DirWithData(&'static str, usize),
}

fn raw_header(name: &str, kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    raw_header_bytes(name.as_bytes(), kind, size, mode)
}

fn raw_header_bytes(name: &[u8], kind: tar::EntryType, size: u64, mode: u32) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(mode);
    h.set_mtime(0);
    h
}

fn set_link(h: &mut tar::Header, target: &str) {
    let b = target.as_bytes();
    h.as_old_mut().linkname[..b.len()].copy_from_slice(b);
}

/// A tar archive of these entries.
pub fn tar_bytes(entries: &[Entry]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let (mut h, data): (tar::Header, &[u8]) = match e {
            Entry::File(n, d, m) => (
                raw_header(n, tar::EntryType::Regular, d.len() as u64, *m),
                d,
            ),
            Entry::Dir(n) => (raw_header(n, tar::EntryType::Directory, 0, 0o755), &[]),
            Entry::Symlink(n, t) => {
                let mut h = raw_header(n, tar::EntryType::Symlink, 0, 0o777);
                set_link(&mut h, t);
                (h, &[])
            }
            Entry::Hardlink(n, t) => {
                let mut h = raw_header(n, tar::EntryType::Link, 0, 0o644);
                set_link(&mut h, t);
                (h, &[])
            }
            Entry::CharDevice(n) => {
                let mut h = raw_header(n, tar::EntryType::Char, 0, 0o600);
                h.set_device_major(1).unwrap();
                h.set_device_minor(3).unwrap();
                (h, &[])
            }
            Entry::Fifo(n) => (raw_header(n, tar::EntryType::Fifo, 0, 0o600), &[]),
            Entry::RawName(n, d, m) => (
                raw_header_bytes(n, tar::EntryType::Regular, d.len() as u64, *m),
                d,
            ),
            Entry::LongName(n, d) => {
                append_long_name(&mut b, n);
                (
                    raw_header("long-name", tar::EntryType::Regular, d.len() as u64, 0o644),
                    d,
                )
            }
            Entry::HugeLongName(len) => {
                append_long_name(&mut b, &vec![b'a'; *len]);
                (raw_header("x", tar::EntryType::Regular, 0, 0o644), &[])
            }
            Entry::DirWithData(n, len) => {
                let mut h = raw_header(n, tar::EntryType::Directory, *len as u64, 0o755);
                h.set_cksum();
                b.append(&h, std::io::repeat(0).take(*len as u64)).unwrap();
                continue;
            }
        };
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A GNU long-name entry (`L`) holding `name` as it is: it names the next entry.
fn append_long_name(b: &mut tar::Builder<Vec<u8>>, name: &[u8]) {
    let mut h = raw_header(
        "././@LongLink",
        tar::EntryType::GNULongName,
        name.len() as u64,
        0o644,
    );
    h.set_cksum();
    b.append(&h, name).unwrap();
}

/// `n` pseudo-random (incompressible) bytes, the same every time.
pub fn noise(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut v = Vec::with_capacity(n + 8);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// The archive formats the unpacker reads, for tests run once per format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Tar,
    Gz,
    Zst,
    Xz,
}

impl Format {
    pub const ALL: [Format; 4] = [Format::Tar, Format::Gz, Format::Zst, Format::Xz];
    /// The compressed ones.
    pub const COMPRESSED: [Format; 3] = [Format::Gz, Format::Zst, Format::Xz];

    /// As a file name would end.
    pub fn ext(self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::Gz => "tar.gz",
            Format::Zst => "tar.zst",
            Format::Xz => "tar.xz",
        }
    }

    /// The outer layer as the unpacker's messages name it.
    pub fn codec(self) -> &'static str {
        match self {
            Format::Tar => "tar",
            Format::Gz => "gzip",
            Format::Zst => "zstd",
            Format::Xz => "xz",
        }
    }

    /// `tar` (any bytes) in this format: compressed, or as it is for [`Format::Tar`].
    pub fn compress(self, tar: &[u8]) -> Vec<u8> {
        match self {
            Format::Tar => tar.to_vec(),
            Format::Gz => gzip(tar),
            Format::Zst => zstd(tar),
            Format::Xz => xz(tar),
        }
    }

    /// Like [`Format::compress`] but storing the bytes as they are where the format can
    /// (gzip level 0, zstd raw blocks, xz preset 0), so that a flipped byte of the stream is a
    /// flipped byte of the data, caught only by the format's checksum.
    pub fn store(self, tar: &[u8]) -> Vec<u8> {
        match self {
            Format::Gz => {
                let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
                e.write_all(tar).unwrap();
                e.finish().unwrap()
            }
            Format::Zst => ruzstd::encoding::compress_to_vec(
                tar,
                ruzstd::encoding::CompressionLevel::Uncompressed,
            ),
            Format::Xz => xz_preset(tar, 0),
            Format::Tar => tar.to_vec(),
        }
    }

    /// A tar of these entries in this format.
    pub fn archive(self, entries: &[Entry]) -> Vec<u8> {
        self.compress(&tar_bytes(entries))
    }
}

pub fn zstd(data: &[u8]) -> Vec<u8> {
    ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
}

pub fn xz(data: &[u8]) -> Vec<u8> {
    xz_preset(data, 1)
}

fn xz_preset(data: &[u8], preset: u32) -> Vec<u8> {
    let mut w =
        lzma_rust2::XzWriter::new(Vec::new(), lzma_rust2::XzOptions::with_preset(preset)).unwrap();
    w.write_all(data).unwrap();
    w.finish().unwrap()
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// A `.tar.gz` of these entries.
pub fn tar_gz(entries: &[Entry]) -> Vec<u8> {
    gzip(&tar_bytes(entries))
}

/// The usual good artifact: one real shim binary and a README.
pub fn good_shim_tgz() -> Vec<u8> {
    tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-demo-v2", real_elf(), 0o755),
        Entry::File("README.md", b"demo shim\n".to_vec(), 0o644),
    ])
}

/// A tar whose one entry claims `claimed` bytes; only `written` zero bytes follow
/// (a bomb's header, without materialising the bomb).
pub fn bomb_tar(claimed: u64, written: usize) -> Vec<u8> {
    let mut h = raw_header(
        "containerd-shim-bomb-v2",
        tar::EntryType::Regular,
        claimed,
        0o755,
    );
    h.set_cksum();
    let mut tar = h.as_bytes().to_vec();
    tar.resize(512 + written, 0);
    tar
}

/// [`bomb_tar`], gzip'd.
pub fn bomb_tgz(claimed: u64, written: usize) -> Vec<u8> {
    gzip(&bomb_tar(claimed, written))
}

// ---- file system ----

/// Every path under `dir` (relative, sorted), to compare before and after.
pub fn snapshot(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Write `bytes` to `dir/name` and return a `file://` URL for it.
pub fn file_url(dir: &Path, name: &str, bytes: &[u8]) -> (String, PathBuf) {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    (format!("file://{}", p.display()), p)
}

/// Read everything from a reader (test helper).
pub fn read_all(mut r: impl Read) -> Vec<u8> {
    let mut v = Vec::new();
    r.read_to_end(&mut v).unwrap();
    v
}

/// A free loopback port (closed again: nothing listens on it yet).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Start `cmd` (a test's server: its output dropped) and wait until it listens on loopback
/// `port`, at most `secs`.
pub fn spawn_listening(
    mut cmd: std::process::Command,
    port: u16,
    what: &str,
    secs: u64,
) -> std::process::Child {
    use std::process::Stdio;
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(secs),
            "{what} did not listen on {port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child
}

/// An anonymous `oci` fetch of `reference` over https.
pub fn oci_spec(reference: &str) -> shim_agent::artifact::FetchSpec {
    shim_agent::artifact::FetchSpec {
        strategy: "oci".into(),
        oci: Some(shim_agent::artifact::OciSource {
            reference: reference.into(),
            auth: shim_agent::artifact::OciAuth::Anonymous,
            layer: None,
            insecure_http: false,
        }),
        ..shim_agent::artifact::FetchSpec::default()
    }
}
