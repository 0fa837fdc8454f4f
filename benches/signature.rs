//! The cost of a signed shim per install (docs/design.md §7): `install --root` of a
//! runwasi-shaped tarball (a shim binary of `SIG_BENCH_MB` MiB, default 32, with its `.sig`,
//! `.pem` and a cosign bundle beside it) into a fresh image root, with and without
//! `spec.signature` (a keyless bundle over the binary, checked against a test trusted root),
//! alternately, `SIG_BENCH_RUNS` times each (default 15); and the verification alone: the
//! binary's SHA-256 streamed from disk, and `signature::verify` of the bundle.
//!
//! Run: `cargo bench --bench signature`.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use shim_agent::api::signature::{MaterialFrom, SignatureSpec, SignerIdentity};
use shim_agent::settings::Settings;
use shim_agent::signature::{Subject, Trust, TrustedIdentity, TrustedRoot, material, verify};
use support::image_root::{self, image, run_install_settings, write_artifact};
use support::shim_builder::ShimBuilder;
use support::sigstore::{
    Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, cosign_bundle, trusted_root,
};
use support::{Entry, real_elf, tar_gz};

const BIN: &str = "containerd-shim-wasmtime-v1";

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// A runnable shim padded to `mb` MiB (trailing bytes an ELF loader ignores).
fn binary(mb: usize) -> Vec<u8> {
    let mut b = real_elf();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while b.len() < mb << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        b.extend_from_slice(&x.to_le_bytes());
    }
    b
}

fn main() {
    let (mb, runs) = (env_num("SIG_BENCH_MB", 32), env_num("SIG_BENCH_RUNS", 15));
    let (fulcio, rekor) = (Fulcio::new("bench"), Rekor::new());
    let signer = fulcio.signer(&Leaf::runwasi());
    let shim = binary(mb);
    let sig = signer.sign(&shim);
    let entry = rekor.entry(&shim, &sig, &signer.cert_der, "CERTIFICATE", SIGNED_AT);
    let bundle = cosign_bundle(&sig, Some(&signer.cert_der), Some(&entry));
    let tarball = tar_gz(&[
        Entry::File(BIN, shim.clone(), 0o755),
        Entry::File(
            "containerd-shim-wasmtime-v1.bundle",
            bundle.clone().into_bytes(),
            0o644,
        ),
    ]);
    let root_json = trusted_root(&[&fulcio], &[&rekor]);
    println!(
        "artifact: {} bytes (a {mb} MiB shim binary and its cosign bundle, gzip'd)",
        tarball.len()
    );
    let spec = SignatureSpec {
        from: MaterialFrom::Artifact,
        signed_file: Some(BIN.into()),
        signature: None,
        certificate: None,
        bundle: Some(format!("{BIN}.bundle")),
        identities: Some(vec![SignerIdentity {
            identity: Some(RUNWASI_IDENTITY.into()),
            identity_reg_exp: None,
            issuer: GITHUB_ISSUER.into(),
        }]),
        keys: None,
        allow_without_signed_time: None,
    };
    let install = |signed: bool| -> Duration {
        let img = image();
        let (url, sha) = write_artifact(&img, "wasmtime.tgz", &tarball);
        let host = img.root.resolve("/etc/shim-agent/root.json").unwrap();
        std::fs::create_dir_all(host.parent().unwrap()).unwrap();
        std::fs::write(&host, &root_json).unwrap();
        let mut st = Settings::default();
        st.signatures.trusted_root = "/etc/shim-agent/root.json".into();
        let mut b = ShimBuilder::new("wasmtime").artifact(&url, &sha);
        if signed {
            b = b.signature(spec.clone());
        }
        let yaml = b.yaml();
        let t = Instant::now();
        run_install_settings(&img, &yaml, &image_root::opts(), &st).unwrap();
        t.elapsed()
    };
    let (mut plain, mut signed) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        plain.push(install(false));
        signed.push(install(true));
    }
    let (p, s) = (median(&mut plain), median(&mut signed));
    println!("install --root, unsigned (baseline): median {p:?}  (runs: {plain:?})");
    println!("install --root, signed:              median {s:?}  (runs: {signed:?})");
    println!(
        "cost of the signature per install: {:?} ({:+.1} %)",
        s.saturating_sub(p),
        (s.as_secs_f64() / p.as_secs_f64() - 1.0) * 100.0
    );

    // the parts: the file's SHA-256 from disk, and the verification of the bundle
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(BIN);
    std::fs::write(&path, &shim).unwrap();
    let root = TrustedRoot::from_json(&root_json, "bench").unwrap();
    let trust = Trust {
        identities: vec![TrustedIdentity {
            subject: Subject::Exact(RUNWASI_IDENTITY.into()),
            issuer: GITHUB_ISSUER.into(),
        }],
        ..Trust::default()
    };
    let m = material::bundle(bundle.as_bytes()).unwrap();
    let (mut hash, mut ver) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let t = Instant::now();
        let sha = shim_agent::signature::file_sha256(&std::fs::read(&path).unwrap());
        hash.push(t.elapsed());
        let t = Instant::now();
        verify(BIN, &sha, &m, &trust, &root).unwrap();
        ver.push(t.elapsed());
    }
    println!(
        "SHA-256 of the {mb} MiB binary from disk: median {:?}",
        median(&mut hash)
    );
    println!(
        "verify (SET, chain, identity, signature): median {:?}",
        median(&mut ver)
    );
}
