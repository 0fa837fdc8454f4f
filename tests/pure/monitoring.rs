//! The alert rules and the dashboard in `deploy/monitoring/` name only metrics the agent
//! exposes: every metric in a rule's `expr` (the plain rules file and the PrometheusRule) and
//! in a dashboard query is registered in [`shim_agent::telemetry::metrics`], counters with
//! their `_total`, histograms with `_bucket`, `_count` or `_sum`. The names come from the
//! exposition's `# TYPE` lines; prometheus-client leaves out a family no series was made in
//! yet (`# TYPE` and all), so the test first makes one in each, through the pub fns the agent
//! records with. scripts/check-monitoring tests the rules themselves (promtool).

use std::collections::BTreeMap;

fn read(file: &str) -> String {
    let path = format!("{}/deploy/monitoring/{file}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The exposed metrics: name (as a `# TYPE` line gives it) → type. The union of three
/// expositions, each after a touch of every metric: another test's `retained` (which clears
/// the family, then fills it) may catch one between the two.
fn exposed() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for _ in 0..3 {
        shim_agent::cli::reference::touch_every_metric();
        let text = shim_agent::telemetry::metrics().encode();
        for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
            let (name, kind) = l.split_once(' ').unwrap();
            out.insert(name.to_string(), kind.to_string());
        }
    }
    out
}

/// Whether a query may name `metric` (a sample name, as PromQL sees it).
fn is_exposed(exposed: &BTreeMap<String, String>, metric: &str) -> bool {
    let is = |name: &str, kind: &str| exposed.get(name).is_some_and(|k| k == kind);
    is(metric, "gauge")
        || metric
            .strip_suffix("_total")
            .is_some_and(|m| is(m, "counter"))
        || ["_bucket", "_count", "_sum"]
            .iter()
            .any(|s| metric.strip_suffix(s).is_some_and(|m| is(m, "histogram")))
}

/// `text` without its quoted strings and the insides of `{…}` and `[…]` (label matchers,
/// ranges).
fn without_literals(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                while let Some(d) = chars.next() {
                    if d == '\\' {
                        chars.next();
                    } else if d == c {
                        break;
                    }
                }
                out.push_str("\"\"");
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                chars.by_ref().find(|d| *d == close);
                out.push(' ');
            }
            c => out.push(c),
        }
    }
    out
}

/// The metric names a PromQL expression uses: the identifiers that are no function, no
/// keyword, no label of a `by (…)`/`on (…)` list and no Grafana `$variable`.
fn metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 7] = ["and", "or", "unless", "bool", "offset", "inf", "nan"];
    const LABEL_LISTS: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let text = without_literals(expr);
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut names = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'$' || c.is_ascii_digit() {
            // a Grafana variable, a number or a duration
            i += 1;
            while i < b.len() && (ident(b[i]) || b[i] == b'.') {
                i += 1;
            }
            continue;
        }
        if !(c.is_ascii_alphabetic() || c == b'_' || c == b':') {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && ident(b[i]) {
            i += 1;
        }
        let word = &text[start..i];
        let rest = text[i..].trim_start();
        // an aggregation with its labels first: `sum by (le) (…)`
        let aggregation = ["by", "without"].iter().any(|k| {
            rest.strip_prefix(k)
                .is_some_and(|r| r.trim_start().starts_with('('))
        });
        if aggregation {
            continue;
        }
        if rest.starts_with('(') {
            if LABEL_LISTS.contains(&word) {
                i = text.len() - rest.len() + rest.find(')').unwrap() + 1;
            }
            continue;
        }
        if !KEYWORDS.contains(&word) && !LABEL_LISTS.contains(&word) {
            names.push(word.to_string());
        }
    }
    names
}

/// Every `expr` of the rules in `groups` (a rules file's, or a PrometheusRule's spec).
fn rule_exprs(groups: &serde_yaml::Value) -> Vec<String> {
    groups
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .map(|r| r["expr"].as_str().expect("a rule's expr").to_string())
        .collect()
}

/// The dashboard's queries: each panel target's `expr`, each variable's `label_values(metric,
/// label)` as the metric.
fn dashboard_exprs(dash: &serde_json::Value) -> Vec<String> {
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v.as_str()) {
                        ("expr", Some(e)) => out.push(e.to_string()),
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dash["panels"], &mut out);
    for var in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = var["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .expect("label_values(metric, label)");
            out.push(inner.split(',').next().unwrap().trim().to_string());
        }
    }
    out
}

/// The metrics `exprs` name that the agent does not expose, each with its expression.
fn unknown(exprs: &[String], exposed: &BTreeMap<String, String>) -> Vec<String> {
    exprs
        .iter()
        .flat_map(|e| metric_names(e).into_iter().map(move |m| (m, e)))
        .filter(|(m, _)| !is_exposed(exposed, m))
        .map(|(m, e)| format!("{m} (in `{e}`)"))
        .collect()
}

#[test]
fn metric_names_are_found_in_promql() {
    let e = r#"sum by (instance, job) (rate(a_total{x="y",state=~"$s"}[$__rate_interval])
        or rate(b_total[5m])) * 60 > 1 and on (shim) max by (shim) (c == bool 1) unless d offset 1h"#;
    assert_eq!(metric_names(e), ["a_total", "b_total", "c", "d"]);
    assert_eq!(
        metric_names("histogram_quantile(0.95, sum by (le) (rate(h_bucket[1m])))"),
        ["h_bucket"]
    );
}

#[test]
fn every_metric_the_alert_rules_name_is_exposed() {
    let exposed = exposed();
    let rules: serde_yaml::Value = serde_yaml::from_str(&read("shim-agent.rules.yaml")).unwrap();
    let exprs = rule_exprs(&rules["groups"]);
    let crd: serde_yaml::Value = serde_yaml::from_str(&read("prometheusrule.yaml")).unwrap();
    assert_eq!(crd["kind"], "PrometheusRule");
    let crd_exprs = rule_exprs(&crd["spec"]["groups"]);
    assert_eq!(
        crd_exprs, exprs,
        "the PrometheusRule has the rules file's rules"
    );
    let named: Vec<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    for want in [
        "shim_agent_rollout_halted",
        "shim_agent_shim_nodes",
        "shim_agent_shims_set_aside",
        "shim_agent_retained_versions",
        "shim_agent_coordinator_errors_total",
        "shim_agent_watch_restarts_total",
        "shim_agent_rollbacks_total",
    ] {
        assert!(named.iter().any(|n| n == want), "no rule names {want}");
    }
    let bad = unknown(&exprs, &exposed);
    assert!(
        bad.is_empty(),
        "the rules name metrics the agent does not expose: {bad:#?}\nexposed: {exposed:#?}"
    );
}

#[test]
fn every_metric_the_dashboard_queries_is_exposed() {
    let exposed = exposed();
    let dash: serde_json::Value = serde_json::from_str(&read("dashboard.json")).unwrap();
    assert!(dash["schemaVersion"].as_u64().unwrap() >= 36);
    let exprs = dashboard_exprs(&dash);
    assert!(exprs.len() >= 12, "the panels' queries: {exprs:?}");
    let bad = unknown(&exprs, &exposed);
    assert!(
        bad.is_empty(),
        "the dashboard queries metrics the agent does not expose: {bad:#?}\nexposed: {exposed:#?}"
    );
}
