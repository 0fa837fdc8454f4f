//! The agent's verifier against the Sigstore project's own: for each case, the same file,
//! Sigstore bundle and trusted root go to `shim_agent::signature::verify` and to the real
//! Python client (`sigstore` 4.5.1 from PyPI, `scripts/sigstore-python`), run offline, and
//! both must give the same verdict (issue 42, item 6). Each refusal must also be for the
//! case's reason on both sides: the agent's reason, a phrase of the client's message.
//!
//! The client runs as `python -m sigstore --trust-config CONFIG verify identity FILE --bundle
//! BUNDLE --cert-identity I --cert-oidc-issuer O --offline`, CONFIG being a client trust
//! config wrapping the trusted root, with the network closed to it (a proxy that is not
//! there). Without `SHIM_AGENT_SIGSTORE_PYTHON` (the venv's python, which scripts/test
//! exports) the test skips, unless `SHIM_AGENT_REQUIRE_SIGSTORE_PYTHON=1`.
//!
//! What the client requires that the agent does not check, so the material carries it in
//! every case (tests/support/sigstore.rs): a signed certificate timestamp embedded in the
//! leaf, by a CT log the trusted root names (`ctlogs`); and in the bundle's log entry an
//! inclusion proof with a checkpoint the log signed, beside the inclusion promise (the
//! signed entry timestamp, which gives the signed time and which both check). Cases with a
//! Rekor v2-shaped entry (inclusion proof only) take their time from an RFC 3161 timestamp of
//! a timestamp authority the root names (`timestampAuthorities`); a token the client cannot
//! verify it skips (then finds no time), where the agent refuses the token itself. The client
//! reads only Sigstore bundles offline, so the cases are v0.3 Sigstore bundles (what cosign
//! 3 and the Sigstore clients write): the cosign 2.x bundle and the `.sig`/`.pem` the agent
//! also reads have no counterpart here.

use std::path::{Path, PathBuf};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::process::Command;

use shim_agent::signature::{TrustedRoot, file_sha256, material, verify};

use crate::support::sigstore::{
    CtLog, Fulcio, GITHUB_ISSUER, Leaf, RUNWASI_IDENTITY, Rekor, SIGNED_AT, Signer, Tsa,
    client_trust_config, runwasi_trust, sigstore_bundle, trusted_root_with_tsa,
    with_inclusion_proof, with_timestamps,
};

const FILE: &str = "containerd-shim-wasmtime-v1";
const SHIM: &[u8] = b"\x7fELF the shim's bytes";
const BUNDLE_V03: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";

/// The venv's python with sigstore, or `None` (skipped, saying why).
fn sigstore_python(test: &str) -> Option<PathBuf> {
    let python = std::env::var_os("SHIM_AGENT_SIGSTORE_PYTHON")
        .map(PathBuf::from)
        .filter(|p| p.is_file());
    if python.is_none() {
        crate::support::skip(
            test,
            "SHIM_AGENT_REQUIRE_SIGSTORE_PYTHON",
            "no sigstore-python: run scripts/test, or set SHIM_AGENT_SIGSTORE_PYTHON=$(scripts/sigstore-python)",
        );
    }
    python
}

/// The instance the cases are signed in: a CA, its CT log, a transparency log, a timestamp
/// authority.
struct World {
    fulcio: Fulcio,
    ct: CtLog,
    rekor: Rekor,
    tsa: Tsa,
}

impl World {
    /// A Sigstore bundle over `signed` by `signer` (its signature over `signed`, unless
    /// `sig` is given), logged by `log` at `at`, with its inclusion proof.
    fn bundle(
        &self,
        signer: &Signer,
        signed: &[u8],
        sig: Option<Vec<u8>>,
        log: &Rekor,
        at: i64,
    ) -> String {
        let sig = sig.unwrap_or_else(|| signer.sign(signed));
        let e = log.entry(signed, &sig, &signer.cert_der, "CERTIFICATE", at);
        let b = sigstore_bundle(BUNDLE_V03, signed, &sig, &signer.cert_der, Some(&e));
        with_inclusion_proof(&b, log.inclusion_proof(&e))
    }

    /// A Sigstore bundle over SHIM by `signer` with a Rekor v2-shaped entry (an inclusion
    /// proof, no integrated time, no SET) and these RFC 3161 responses.
    fn v2_bundle(&self, signer: &Signer, stamps: &[Vec<u8>]) -> String {
        let sig = signer.sign(SHIM);
        let e = self.rekor.entry_v2(SHIM, &sig, &signer.cert_der);
        let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &signer.cert_der, Some(&e));
        with_timestamps(
            &with_inclusion_proof(&b, self.rekor.inclusion_proof(&e)),
            stamps,
        )
    }

    fn signer(&self, leaf: &Leaf<'_>) -> Signer {
        self.fulcio.signer_with_sct(leaf, &self.ct)
    }
}

/// One case: the file as the verifier finds it, the bundle beside it, and why each side
/// refuses it (`None`: both accept).
struct Case {
    name: &'static str,
    file: Vec<u8>,
    bundle: String,
    /// The agent's reason, and a phrase of the Python client's message.
    refused: Option<(&'static str, &'static str)>,
}

fn cases(w: &World) -> Vec<Case> {
    let good = w.signer(&Leaf::runwasi());
    let fork =
        "https://github.com/someone/runwasi/.github/workflows/action-build.yml@refs/heads/main";
    let rogue = Fulcio::new("rogue");
    vec![
        Case {
            name: "a good keyless bundle",
            file: SHIM.to_vec(),
            bundle: w.bundle(&good, SHIM, None, &w.rekor, SIGNED_AT),
            refused: None,
        },
        Case {
            name: "another identity",
            file: SHIM.to_vec(),
            bundle: w.bundle(
                &w.signer(&Leaf::of(fork, GITHUB_ISSUER)),
                SHIM,
                None,
                &w.rekor,
                SIGNED_AT,
            ),
            refused: Some(("SignerIdentityMismatch", "SANs do not match")),
        },
        Case {
            name: "the identity from another issuer",
            file: SHIM.to_vec(),
            bundle: w.bundle(
                &w.signer(&Leaf::of(RUNWASI_IDENTITY, "https://accounts.example")),
                SHIM,
                None,
                &w.rekor,
                SIGNED_AT,
            ),
            refused: Some(("SignerIssuerMismatch", "OIDCIssuer does not match")),
        },
        Case {
            // logged an hour after the ten-minute certificate ended
            name: "a certificate expired at the log's time",
            file: SHIM.to_vec(),
            bundle: w.bundle(&good, SHIM, None, &w.rekor, SIGNED_AT + 3600),
            refused: Some(("CertificateExpired", "cert is not valid at validation time")),
        },
        Case {
            name: "a tampered file",
            file: b"\x7fELF tampered".to_vec(),
            bundle: w.bundle(&good, SHIM, None, &w.rekor, SIGNED_AT),
            refused: Some(("SignatureMismatch", "Bundle message digest mismatch")),
        },
        Case {
            // the bundle's digest and log entry name this file; its signature is over another
            name: "a signature over another file",
            file: SHIM.to_vec(),
            bundle: w.bundle(
                &good,
                SHIM,
                Some(good.sign(b"another file")),
                &w.rekor,
                SIGNED_AT,
            ),
            refused: Some(("SignatureMismatch", "Signature is invalid for input")),
        },
        Case {
            // with an SCT from the trusted CT log: only the chain is wrong
            name: "a certificate from a CA the root does not name",
            file: SHIM.to_vec(),
            bundle: w.bundle(
                &rogue.signer_with_sct(&Leaf::runwasi(), &w.ct),
                SHIM,
                None,
                &w.rekor,
                SIGNED_AT,
            ),
            refused: Some((
                "CertificateUntrusted",
                "failed to build timestamp certificate chain",
            )),
        },
        Case {
            // its signed entry timestamp and its checkpoint both by that log
            name: "a log entry by a log the root does not name",
            file: SHIM.to_vec(),
            bundle: w.bundle(&good, SHIM, None, &Rekor::new(), SIGNED_AT),
            refused: Some((
                "LogEntryInvalid",
                "invalid log entry: checkpoint: invalid signature",
            )),
        },
        Case {
            // integratedTime is outside the tree: without the SET, no signed time
            name: "a Rekor v1 entry with only its inclusion proof",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let mut e = w
                    .rekor
                    .entry(SHIM, &sig, &good.cert_der, "CERTIFICATE", SIGNED_AT);
                let proof = w.rekor.inclusion_proof(&e);
                e.set.clear();
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_inclusion_proof(&b, proof)
            },
            refused: Some((
                "NoSignedTime",
                "bundle must contain an inclusion promise or signed timestamp(s)",
            )),
        },
        Case {
            name: "a Rekor v1 entry whose audit path leads to another root",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let e = w
                    .rekor
                    .entry(SHIM, &sig, &good.cert_der, "CERTIFICATE", SIGNED_AT);
                let mut proof = w.rekor.inclusion_proof(&e);
                proof["hashes"][0] = STANDARD.encode([0u8; 32]).into();
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_inclusion_proof(&b, proof)
            },
            refused: Some((
                "LogEntryInvalid",
                "invalid log entry: inclusion proof contains invalid root hash",
            )),
        },
        Case {
            // signed by the log, for another tree than the proof's
            name: "a Rekor v1 entry whose checkpoint is of another root",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let e = w
                    .rekor
                    .entry(SHIM, &sig, &good.cert_der, "CERTIFICATE", SIGNED_AT);
                let mut proof = w.rekor.inclusion_proof(&e);
                proof["checkpoint"]["envelope"] = w.rekor.checkpoint(3, &[7u8; 32]).into();
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_inclusion_proof(&b, proof)
            },
            refused: Some((
                "LogEntryInvalid",
                "Inclusion proof contains invalid root hash signature",
            )),
        },
        Case {
            name: "a Rekor v2 entry with a timestamp",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let e = w.rekor.entry_v2(SHIM, &sig, &good.cert_der);
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_timestamps(
                    &with_inclusion_proof(&b, w.rekor.inclusion_proof(&e)),
                    &[w.tsa.stamp(&sig, SIGNED_AT)],
                )
            },
            refused: None,
        },
        Case {
            name: "a Rekor v2 entry without a timestamp",
            file: SHIM.to_vec(),
            bundle: w.v2_bundle(&good, &[]),
            // the client refuses it on reading: no promise and no timestamp to give it a time
            refused: Some((
                "NoSignedTime",
                "bundle must contain an inclusion promise or signed timestamp(s)",
            )),
        },
        Case {
            // the client skips a token it cannot verify; the agent refuses it
            name: "a Rekor v2 entry with a timestamp by an authority the root does not name",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let e = w.rekor.entry_v2(SHIM, &sig, &good.cert_der);
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_timestamps(
                    &with_inclusion_proof(&b, w.rekor.inclusion_proof(&e)),
                    &[Tsa::new("rogue-tsa").stamp(&sig, SIGNED_AT)],
                )
            },
            refused: Some(("TimestampInvalid", "not enough sources of verified time")),
        },
        Case {
            name: "a Rekor v2 entry with a timestamp over another signature",
            file: SHIM.to_vec(),
            bundle: {
                let sig = good.sign(SHIM);
                let e = w.rekor.entry_v2(SHIM, &sig, &good.cert_der);
                let b = sigstore_bundle(BUNDLE_V03, SHIM, &sig, &good.cert_der, Some(&e));
                with_timestamps(
                    &with_inclusion_proof(&b, w.rekor.inclusion_proof(&e)),
                    &[w.tsa.stamp(&good.sign(b"another file"), SIGNED_AT)],
                )
            },
            refused: Some(("TimestampInvalid", "not enough sources of verified time")),
        },
    ]
}

/// The agent's verdict: `Ok(())` or the refusal's reason and message.
fn agent_verdict(case: &Case, root: &TrustedRoot) -> Result<(), (String, String)> {
    let m = material::bundle(case.bundle.as_bytes()).map_err(|e| ("unreadable".to_string(), e))?;
    verify(FILE, &file_sha256(&case.file), &m, &runwasi_trust(), root)
        .map(|_| ())
        .map_err(|e| (e.reason().to_string(), e.to_string()))
}

/// The Python client's verdict on the files in `dir`: `Ok(())` or its output.
fn python_verdict(python: &Path, dir: &Path) -> Result<(), String> {
    let out = Command::new(python)
        .args(["-m", "sigstore", "--trust-config"])
        .arg(dir.join("trust_config.json"))
        .args(["verify", "identity"])
        .arg(dir.join(FILE))
        .arg("--bundle")
        .arg(dir.join("bundle.sigstore.json"))
        .args(["--cert-identity", RUNWASI_IDENTITY])
        .args(["--cert-oidc-issuer", GITHUB_ISSUER, "--offline"])
        // offline: nothing to reach, and no cache of its own to read
        .env("HOME", dir)
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("COLUMNS", "400") // its messages unwrapped
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .expect("run sigstore-python");
    // its log lines, padded to the terminal's width, with their whitespace collapsed
    let said = format!(
        "{}: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .split_whitespace()
    .collect::<Vec<_>>()
    .join(" ");
    if out.status.success() {
        Ok(())
    } else {
        Err(said)
    }
}

#[test]
fn the_sigstore_python_client_agrees_with_the_agent_case_by_case() {
    let test = "signature_python::the_sigstore_python_client_agrees_with_the_agent_case_by_case";
    let Some(python) = sigstore_python(test) else {
        return;
    };
    let w = World {
        fulcio: Fulcio::new("test-fulcio"),
        ct: CtLog::new(),
        rekor: Rekor::new(),
        tsa: Tsa::new("test-tsa"),
    };
    let root_json = trusted_root_with_tsa(&[&w.fulcio], &[&w.rekor], &[&w.ct], &[&w.tsa]);
    let root = TrustedRoot::from_json(&root_json, "test root").unwrap();
    let mut failures = Vec::new();
    for case in cases(&w) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), &case.file).unwrap();
        std::fs::write(dir.path().join("bundle.sigstore.json"), &case.bundle).unwrap();
        std::fs::write(
            dir.path().join("trust_config.json"),
            client_trust_config(&root_json),
        )
        .unwrap();
        let agent = agent_verdict(&case, &root);
        let python = python_verdict(&python, dir.path());
        eprintln!(
            "{}: agent {}, sigstore-python {}",
            case.name,
            agent
                .as_ref()
                .map_or_else(|(r, _)| format!("refuses ({r})"), |()| "accepts".into()),
            python
                .as_ref()
                .map_or_else(|e| format!("refuses ({e})"), |()| "accepts".into())
        );
        let agreed = match (&case.refused, &agent, &python) {
            (None, Ok(()), Ok(())) => true,
            // a verification that failed (or a bundle refused on reading), not a client that
            // could not start
            (Some((reason, phrase)), Err((r, _)), Err(said)) => {
                r == reason
                    && (said.contains("FAIL: ")
                        || said.contains("The provided bundle is malformed"))
                    && said.contains(phrase)
            }
            _ => false,
        };
        if !agreed {
            failures.push(format!(
                "{}: expected {}\n  agent: {agent:?}\n  sigstore-python: {}",
                case.name,
                case.refused
                    .map_or("both to accept".into(), |(r, p)| format!(
                        "agent {r}, sigstore-python {p:?}"
                    )),
                python.err().unwrap_or_else(|| "accepts".into())
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
