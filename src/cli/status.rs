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
        [
            "NAME", "HANDLER", "STATE", "ORIGIN", "VERSION", "DIGEST", "BINARY",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for s in state.shims.values() {
        rows.push(vec![
            s.name.clone(),
            s.handler.clone(),
            s.state.to_string(),
            format!("{:?}", s.origin).to_lowercase(),
            s.shim_version.clone().unwrap_or_else(|| "-".into()),
            crate::text::prefix_chars(&s.artifact_sha256, 12),
            s.binary.clone(),
        ]);
    }
    let mut out = table(&rows);
    if state.shims.is_empty() {
        out.push_str("(no shims installed)\n");
    }
    for s in state.shims.values() {
        if let Some(sig) = &s.signature {
            out.push_str(&format!("signed: {} {}\n", s.name, sig.describe()));
        }
        if let Some(host) = &s.insecure_source {
            out.push_str(&format!(
                "insecure: {} was fetched from {host} without verifying its certificate (skip_verify in containerd's hosts.toml); its digest was checked\n",
                s.name
            ));
        }
    }
    if !state.retained.is_empty() {
        out.push_str("\nreplaced versions kept while containerd tasks run through them:\n");
        out.push_str(&retained_rows(state));
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

/// The retained versions, one row each, with why they are kept.
fn retained_rows(state: &NodeState) -> String {
    let mut rows = vec![
        ["NAME", "DIGEST", "SINCE", "WHY"]
            .map(String::from)
            .to_vec(),
    ];
    for r in &state.retained {
        let since = i64::try_from(r.since)
            .ok()
            .and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
            .map(|t| t.to_string())
            .unwrap_or_else(|| r.since.to_string());
        let why = match r.task_count {
            0 if r.tasks.is_empty() => "not checked yet".to_string(),
            0 => r.tasks.join(", "),
            n => format!(
                "{n} task{} run through it: {}{}",
                if n == 1 { "" } else { "s" },
                r.tasks.join(", "),
                if n > r.tasks.len() { ", ..." } else { "" }
            ),
        };
        rows.push(vec![
            r.name.clone(),
            crate::text::prefix_chars(&r.digest, 12),
            since,
            why,
        ]);
    }
    table(&rows)
}

/// Rows as aligned columns.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}
