//! A log entry's inclusion proof: the RFC 6962 (RFC 9162 §2.1.3) Merkle audit path from the
//! entry's leaf to the root of a tree of `treeSize` entries, and the checkpoint the log
//! signed for that tree (a signed note: origin, size, base64 root hash, then signature lines
//! `— <name> <base64(key hint ‖ signature)>`, the key hint being the first four bytes of the
//! log's key id, as the Sigstore clients read it). It proves the log holds the entry; it
//! signs no time (the entry's `integratedTime` is outside the tree).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest, Sha256};

use super::keys::PublicKey;
use super::trusted_root::TransparencyLog;

/// An inclusion proof as a Sigstore bundle carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct InclusionProof {
    pub log_index: i64,
    pub tree_size: i64,
    pub root_hash: Vec<u8>,
    /// The audit path, leaf side first.
    pub hashes: Vec<Vec<u8>>,
    /// The signed note of the tree (`checkpoint.envelope`).
    pub checkpoint: String,
}

/// Check that `body` is a leaf of the tree the proof names, and that `log` signed that tree.
pub fn verify(proof: &InclusionProof, body: &[u8], log: &TransparencyLog) -> Result<(), String> {
    let mut leaf = vec![0u8];
    leaf.extend_from_slice(body);
    let leaf_hash: [u8; 32] = Sha256::digest(&leaf).into();
    let root = root_from_path(proof, leaf_hash)?;
    if root.as_slice() != proof.root_hash {
        return Err(format!(
            "its inclusion proof does not verify: the audit path leads to root {}, not {}",
            hex::encode(root),
            hex::encode(&proof.root_hash)
        ));
    }
    verify_checkpoint(proof, log)
}

/// The root the audit path leads to from `leaf` at `log_index` in a tree of `tree_size`.
fn root_from_path(proof: &InclusionProof, leaf: [u8; 32]) -> Result<[u8; 32], String> {
    let (index, size) = match (
        u64::try_from(proof.log_index),
        u64::try_from(proof.tree_size),
    ) {
        (Ok(i), Ok(s)) if i < s => (i, s),
        _ => {
            return Err(format!(
                "its inclusion proof names index {} in a tree of {}",
                proof.log_index, proof.tree_size
            ));
        }
    };
    let (mut f, mut s, mut r) = (index, size - 1, leaf);
    for p in &proof.hashes {
        if s == 0 {
            return Err("its inclusion proof has more hashes than the tree has levels".into());
        }
        let p: [u8; 32] = p
            .as_slice()
            .try_into()
            .map_err(|_| "its inclusion proof has a hash that is not 32 bytes".to_string())?;
        if f & 1 == 1 || f == s {
            r = node(&p, &r);
            while f & 1 == 0 && f != 0 {
                f >>= 1;
                s >>= 1;
            }
        } else {
            r = node(&r, &p);
        }
        f >>= 1;
        s >>= 1;
    }
    if s != 0 {
        return Err("its inclusion proof has fewer hashes than the tree has levels".into());
    }
    Ok(r)
}

/// An interior node: SHA-256(0x01 ‖ left ‖ right).
fn node(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

/// The checkpoint names this tree (size and root) and `log`'s key signed it.
fn verify_checkpoint(proof: &InclusionProof, log: &TransparencyLog) -> Result<(), String> {
    let text = &proof.checkpoint;
    let (body, signatures) = text
        .split_once("\n\n")
        .ok_or("its checkpoint is not a signed note (no blank line before its signatures)")?;
    let note = format!("{body}\n");
    let mut lines = note.lines();
    let (_origin, size, root) = (lines.next(), lines.next(), lines.next());
    if size != Some(proof.tree_size.to_string().as_str()) {
        return Err(format!(
            "its checkpoint is of another tree size than its inclusion proof ({})",
            proof.tree_size
        ));
    }
    let root = root.map(|r| STANDARD.decode(r)).and_then(Result::ok);
    if root.as_deref() != Some(proof.root_hash.as_slice()) {
        return Err("its checkpoint names another root hash than its inclusion proof".into());
    }
    let key = PublicKey::from_spki(&log.spki).map_err(|e| format!("the log's key: {e}"))?;
    let hint = log.key_id.get(..4).unwrap_or_default();
    for line in signatures.lines() {
        let Some(sig) = line
            .strip_prefix("\u{2014} ")
            .and_then(|rest| rest.split_once(' '))
            .and_then(|(_name, b64)| STANDARD.decode(b64.trim()).ok())
        else {
            continue;
        };
        let Some((line_hint, sig)) = sig.split_at_checked(4) else {
            continue;
        };
        if line_hint == hint {
            if key.verifies(note.as_bytes(), sig) {
                return Ok(());
            }
            return Err(format!(
                "its checkpoint's signature does not verify with the key of {}",
                log.base_url
            ));
        }
    }
    Err(format!(
        "its checkpoint is not signed by {} (no signature with its key hint {})",
        log.base_url,
        hex::encode(hint)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf(i: u8) -> [u8; 32] {
        Sha256::digest([0u8, i]).into()
    }

    #[test]
    fn audit_paths_of_a_five_leaf_tree_lead_to_its_root() {
        // RFC 9162 §2.1.1: the tree of five is ((01)(23))(4)
        let l: Vec<[u8; 32]> = (0..5).map(leaf).collect();
        let n01 = node(&l[0], &l[1]);
        let n23 = node(&l[2], &l[3]);
        let n03 = node(&n01, &n23);
        let root = node(&n03, &l[4]);
        let proof = |index: i64, hashes: Vec<[u8; 32]>| InclusionProof {
            log_index: index,
            tree_size: 5,
            root_hash: root.to_vec(),
            hashes: hashes.into_iter().map(|h| h.to_vec()).collect(),
            checkpoint: String::new(),
        };
        assert_eq!(root_from_path(&proof(4, vec![n03]), l[4]), Ok(root));
        assert_eq!(
            root_from_path(&proof(2, vec![l[3], n01, l[4]]), l[2]),
            Ok(root)
        );
        assert_eq!(
            root_from_path(&proof(1, vec![l[0], n23, l[4]]), l[1]),
            Ok(root)
        );
        assert_ne!(
            root_from_path(&proof(1, vec![l[0], n23, l[4]]), l[2]),
            Ok(root)
        );
        assert!(root_from_path(&proof(5, vec![]), l[4]).is_err());
        assert!(root_from_path(&proof(4, vec![n03, n03]), l[4]).is_err());
        assert!(root_from_path(&proof(4, vec![]), l[4]).is_err());
    }

    /// RFC 6962 §2.1: the tree head of `leaves` and the audit path of leaf `m`, by the
    /// recursive definitions (the largest power of two below n splits the tree).
    fn reference(leaves: &[[u8; 32]], m: usize) -> ([u8; 32], Vec<[u8; 32]>) {
        if leaves.len() == 1 {
            return (leaves[0], vec![]);
        }
        let k = leaves.len().next_power_of_two() / 2;
        let (left, right) = leaves.split_at(k);
        let (l, r) = (
            reference(left, m.min(k - 1)).0,
            reference(right, m.saturating_sub(k)).0,
        );
        let mut path = if m < k {
            reference(left, m).1
        } else {
            reference(right, m - k).1
        };
        path.push(if m < k { r } else { l });
        (node(&l, &r), path)
    }

    #[test]
    fn every_leaf_of_trees_up_to_33_verifies_and_no_other_leaf_does() {
        let all: Vec<[u8; 32]> = (0..33).map(leaf).collect();
        for size in 1..=all.len() {
            for m in 0..size {
                let (root, path) = reference(&all[..size], m);
                let proof = InclusionProof {
                    log_index: i64::try_from(m).unwrap(),
                    tree_size: i64::try_from(size).unwrap(),
                    root_hash: root.to_vec(),
                    hashes: path.iter().map(|h| h.to_vec()).collect(),
                    checkpoint: String::new(),
                };
                assert_eq!(root_from_path(&proof, all[m]), Ok(root), "{m} of {size}");
                let other = all[(m + 1) % size];
                if size > 1 {
                    assert_ne!(root_from_path(&proof, other), Ok(root), "{m} of {size}");
                }
            }
        }
    }
}
