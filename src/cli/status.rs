//! `status`: the node's state document, read without taking the lock, as JSON or as a
//! table a person reads.

use anyhow::Context;

use crate::hostroot::HostRoot;
use crate::settings::Settings;
use crate::state::NodeState;

/// The state document under `root`, read without taking the lock (for `status`).
pub fn read_state(root: &HostRoot, settings: &Settings) -> anyhow::Result<NodeState> {
    let path = root
        .resolve(&settings.paths.state_dir)?
        .join(crate::state::STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => crate::state::decode_document(&bytes)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(NodeState::default()),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// `status` as a table a person reads.
pub fn format_status_table(state: &NodeState) -> String {
    let mut rows = vec![
        ["NAME", "HANDLER", "STATE", "ORIGIN", "DIGEST", "BINARY"]
            .map(String::from)
            .to_vec(),
    ];
    for s in state.shims.values() {
        rows.push(vec![
            s.name.clone(),
            s.handler.clone(),
            s.state.to_string(),
            format!("{:?}", s.origin).to_lowercase(),
            s.artifact_sha256.chars().take(12).collect(),
            s.binary.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if state.shims.is_empty() {
        out.push_str("(no shims installed)\n");
    }
    if let Some(j) = &state.journal {
        out.push_str(&format!(
            "unfinished transaction {} ({:?} of {}) at phase {:?}\n",
            j.id,
            j.kind,
            j.shims.join(", "),
            j.phase
        ));
    }
    out
}
