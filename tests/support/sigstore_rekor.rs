//! A transparency log made in the test, playing Rekor: its key signs entries' timestamps
//! (SETs) of Rekor v1 entries, and the checkpoints of trees that inclusion proofs put
//! entries in; Rekor v2-shaped entries carry only such a proof.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use rcgen::{KeyPair, SigningKey};
use sha2::{Digest, Sha256};
use shim_agent::signature::{LogEntry, canonical_payload, key_id};

use super::sigstore::hashedrekord;

/// A transparency log: its key signs entries' timestamps.
pub struct Rekor {
    key: KeyPair,
}

impl Default for Rekor {
    fn default() -> Self {
        Rekor::new()
    }
}

impl Rekor {
    pub fn new() -> Rekor {
        Rekor {
            key: KeyPair::generate().expect("key"),
        }
    }

    pub fn spki(&self) -> Vec<u8> {
        rcgen::PublicKeyData::subject_public_key_info(&self.key)
    }

    pub fn log_id(&self) -> Vec<u8> {
        key_id(&self.spki())
    }

    /// An entry for `sig` over `file` by the signer whose certificate (or key) is `signer_der`
    /// (`pem_tag`: CERTIFICATE or PUBLIC KEY), integrated at `at`, with its signed timestamp.
    pub fn entry(
        &self,
        file: &[u8],
        sig: &[u8],
        signer_der: &[u8],
        pem_tag: &str,
        at: i64,
    ) -> LogEntry {
        let body = hashedrekord(file, sig, signer_der, pem_tag);
        let mut e = LogEntry {
            log_id: self.log_id(),
            log_index: 4242,
            integrated_time: at,
            body: body.into_bytes(),
            ..LogEntry::default()
        };
        e.set = self.key.sign(&canonical_payload(&e)).expect("sign");
        e
    }

    /// A Rekor v2-shaped entry: a `hashedrekord` 0.0.2 body for `sig` over `file` by the
    /// certificate `cert_der`, no integrated time, no SET (its proof: [`Rekor::inclusion_proof`]).
    pub fn entry_v2(&self, file: &[u8], sig: &[u8], cert_der: &[u8]) -> LogEntry {
        let body = serde_json::json!({
            "apiVersion": "0.0.2",
            "kind": "hashedrekord",
            "spec": {"hashedRekordV002": {
                "data": {"algorithm": "SHA2_256", "digest": STANDARD.encode(Sha256::digest(file))},
                "signature": {
                    "content": STANDARD.encode(sig),
                    "verifier": {
                        "x509Certificate": {"rawBytes": STANDARD.encode(cert_der)},
                        "keyDetails": "PKIX_ECDSA_P256_SHA_256"
                    }
                }
            }}
        });
        LogEntry {
            log_id: self.log_id(),
            log_index: 2,
            integrated_time: 0,
            body: body.to_string().into_bytes(),
            ..LogEntry::default()
        }
    }

    /// The inclusion proof of `e` (protobuf JSON, as a Sigstore bundle carries it) as the
    /// third leaf of a tree of three (the first two are other entries), with the checkpoint
    /// this log signed for the tree: a signed note (origin, size, root hash; then `— name
    /// base64(key id[..4] ‖ signature)`).
    pub fn inclusion_proof(&self, e: &LogEntry) -> serde_json::Value {
        // RFC 6962 §2.1: a leaf's hash is SHA-256(0x00 ‖ entry), a node's SHA-256(0x01 ‖ l ‖ r)
        let leaf = |data: &[u8]| Sha256::digest([&[0u8][..], data].concat()).to_vec();
        let node = |l: &[u8], r: &[u8]| Sha256::digest([&[1u8][..], l, r].concat()).to_vec();
        let left = node(&leaf(b"entry 0"), &leaf(b"entry 1"));
        let root = node(&left, &leaf(&e.body));
        serde_json::json!({
            "logIndex": "2",
            "rootHash": STANDARD.encode(&root),
            "treeSize": "3",
            "hashes": [STANDARD.encode(&left)],
            "checkpoint": {"envelope": self.checkpoint(3, &root)}
        })
    }

    /// The checkpoint this log signs for a tree of `size` with `root`.
    pub fn checkpoint(&self, size: u64, root: &[u8]) -> String {
        let note = format!("rekor.test - 4242\n{size}\n{}\n", STANDARD.encode(root));
        let mut signature = self.log_id()[..4].to_vec();
        signature.extend(self.key.sign(note.as_bytes()).expect("sign"));
        format!(
            "{note}\n\u{2014} rekor.test {}\n",
            STANDARD.encode(signature)
        )
    }
}
