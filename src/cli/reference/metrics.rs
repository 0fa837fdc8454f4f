//! The metrics page: every metric with its type, labels and help, from the exposition.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use anyhow::bail;

use super::page::*;

/// A series in every metric, through the functions the agent records with: prometheus-client
/// leaves a family without series out of the exposition, `# HELP` and all. A new metric needs
/// a line here (the test compares the count with `src/telemetry.rs`'s registrations). In the
/// generator's own process these series go nowhere; in a test's, they are as harmless as any
/// other test's (tests/pure/monitoring.rs touches them the same way).
pub fn touch_every_metric() {
    use crate::telemetry as t;
    use std::time::Duration;
    t::transaction_ended("install", "committed");
    t::containerd_restarted(true);
    t::phase_took("restarted", Duration::from_millis(1));
    t::slot_waited(Duration::from_millis(1));
    t::watch_restarted("shims");
    t::retained(&[("reference-docs".to_string(), 1)]);
    t::coordinator_error("status", "Conflict");
    t::hook_called("beforeInstall", "Success", Duration::from_millis(1));
    t::runtime_checked("");
    t::signature_checked("");
    t::runtime_check_took("total", Duration::from_millis(1));
    t::set_aside(0);
    t::shim_statuses([t::ShimRollout {
        shim: "reference-docs".into(),
        ..t::ShimRollout::default()
    }]);
}

#[derive(Default)]
struct Metric {
    kind: String,
    help: String,
    labels: BTreeSet<String>,
}

/// The metrics of the exposition: family name → type, help and label names. The union of
/// three expositions, each after a touch of every metric (in a test process another test's
/// `retained`, which clears its family before it fills it, may catch one between the two).
fn exposed_metrics() -> BTreeMap<String, Metric> {
    let mut out: BTreeMap<String, Metric> = BTreeMap::new();
    for _ in 0..3 {
        touch_every_metric();
        let text = crate::telemetry::metrics().encode();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    out.entry(name.to_string()).or_default().kind = kind.to_string();
                }
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                if let Some((name, help)) = rest.split_once(' ') {
                    out.entry(name.to_string()).or_default().help = help.to_string();
                }
            } else if !line.starts_with('#')
                && let Some((sample, labels)) = line.split_once('{')
            {
                let family = ["_total", "_bucket", "_count", "_sum"]
                    .iter()
                    .find_map(|s| sample.strip_suffix(s).filter(|f| out.contains_key(*f)))
                    .unwrap_or(sample);
                if let Some(m) = out.get_mut(family) {
                    m.labels
                        .extend(label_names(labels).into_iter().filter(|l| l != "le"));
                }
            }
        }
    }
    out
}

/// The label names of a sample's `a="x",b="y"} 1` (after its `{`).
fn label_names(mut s: &str) -> Vec<String> {
    let mut names = Vec::new();
    while let Some((name, rest)) = s.split_once("=\"") {
        names.push(name.trim_start_matches(',').to_string());
        // the value's end: a quote not escaped
        let mut escaped = false;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    end = i;
                    break;
                }
                _ => escaped = false,
            }
        }
        s = rest.get(end + 1..).unwrap_or("");
        if s.starts_with('}') {
            break;
        }
    }
    names
}

pub(super) fn metrics_page() -> anyhow::Result<String> {
    let metrics = exposed_metrics();
    if metrics.is_empty() {
        bail!("the metrics exposition lists no metric");
    }
    let mut out = header(
        "Metrics",
        "the metrics registry (`src/telemetry.rs`): its `# HELP` and `# TYPE` lines",
    );
    out.push_str(
        "\nEvery metric the agent serves on `GET /metrics` (the `metrics` settings, \
         `coordinate --listen`), in the Prometheus text format. A counter's samples are named \
         with `_total`; a histogram's are `_bucket` (label `le`), `_sum` and `_count`. \
         Alert rules and a dashboard: [monitoring.md](../monitoring.md).\n\n\
         | Metric | Type | Labels | Help |\n|---|---|---|---|\n",
    );
    for (name, m) in &metrics {
        let labels: Vec<String> = m.labels.iter().map(|l| code(l, true)).collect();
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            code(name, true),
            m.kind,
            labels.join(", "),
            prose(&m.help, true)
        );
    }
    Ok(out)
}

/// The number of metrics on the metrics page, for the test that compares it with the
/// registrations in `src/telemetry.rs`.
pub fn metric_count() -> usize {
    exposed_metrics().len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_names_of_a_sample() {
        assert_eq!(
            label_names("kind=\"a,\\\"b\",result=\"c\"} 1"),
            ["kind", "result"]
        );
    }
}
