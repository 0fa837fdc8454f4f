//! The CRDs page: every field of each custom resource, from its OpenAPI v3 schema.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::Context;
use serde::Deserialize;
use serde_json::Value;

use super::page::*;

pub(super) fn crd_page() -> anyhow::Result<String> {
    // the CRDs `shim-agent crd` prints, in its order
    let mut crds = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&crate::api::manifests::crd_yaml()?) {
        crds.push(serde_json::to_value(serde_yaml::Value::deserialize(doc)?)?);
    }
    let mut out = header(
        "Custom resources",
        "the CRDs' OpenAPI v3 schemas (`shim-agent crd`, the types in `src/api/`)",
    );
    out.push_str(
        "\nEvery field of the custom resources shim-agent defines, one table per object. A \
         field's *Details* give its enum values, default, format and limits; the CEL rules \
         (`x-kubernetes-validations`) the API server checks follow each table, with the \
         message a rejected object gets. `metadata` is a Kubernetes ObjectMeta.\n",
    );
    out.push('\n');
    for crd in &crds {
        let kind = crd["spec"]["names"]["kind"]
            .as_str()
            .context("CRD without a kind")?;
        let _ = writeln!(out, "- [{kind}](#{})", slug(kind));
    }
    for crd in &crds {
        crd_section(&mut out, crd)?;
    }
    Ok(out)
}

fn crd_section(out: &mut String, crd: &Value) -> anyhow::Result<()> {
    let spec = &crd["spec"];
    let kind = spec["names"]["kind"]
        .as_str()
        .context("CRD without a kind")?;
    let group = spec["group"].as_str().unwrap_or_default();
    let _ = writeln!(out, "\n## {kind}\n");
    let _ = writeln!(out, "| | |\n|---|---|");
    let _ = writeln!(
        out,
        "| CRD | {} |",
        code(crd["metadata"]["name"].as_str().unwrap_or_default(), true)
    );
    let _ = writeln!(out, "| Group | {} |", code(group, true));
    let _ = writeln!(
        out,
        "| Scope | {} |",
        spec["scope"].as_str().unwrap_or_default()
    );
    for (label, key) in [("Plural", "plural"), ("Singular", "singular")] {
        if let Some(v) = spec["names"][key].as_str() {
            let _ = writeln!(out, "| {label} | {} |", code(v, true));
        }
    }
    if let Some(short) = spec["names"]["shortNames"].as_array() {
        let list: Vec<String> = short
            .iter()
            .filter_map(Value::as_str)
            .map(|s| code(s, true))
            .collect();
        let _ = writeln!(out, "| Short names | {} |", list.join(", "));
    }
    let versions = spec["versions"]
        .as_array()
        .context("CRD without versions")?;
    for version in versions {
        let name = version["name"].as_str().unwrap_or_default();
        let _ = writeln!(
            out,
            "| Version | {} (`apiVersion: {group}/{name}`){}{} |",
            code(name, true),
            if version["served"] == Value::Bool(true) {
                ", served"
            } else {
                ""
            },
            if version["storage"] == Value::Bool(true) {
                ", stored"
            } else {
                ""
            },
        );
    }
    for version in versions {
        let schema = &version["schema"]["openAPIV3Schema"];
        if versions.len() > 1 {
            let _ = writeln!(
                out,
                "\n### {kind} {}",
                version["name"].as_str().unwrap_or("")
            );
        }
        if let Some(d) = schema["description"].as_str() {
            let _ = writeln!(out, "\n{}", prose(d, false));
        }
        let mut objects = Vec::new();
        collect_objects(kind, schema, &mut objects);
        for (path, object) in objects {
            // the root's table goes under the kind's own heading
            object_table(out, (path != kind).then_some(path.as_str()), &path, object);
        }
    }
    Ok(())
}

/// Every object with properties under `schema` (itself included), depth first, as (path from
/// the kind, schema): `Shim`, `Shim.spec`, `Shim.spec.fetchStrategy.platforms[]`, ...
fn collect_objects<'a>(path: &str, schema: &'a Value, out: &mut Vec<(String, &'a Value)>) {
    if let Some(props) = schema["properties"].as_object() {
        out.push((path.to_string(), schema));
        for (name, prop) in props {
            collect_objects(&format!("{path}.{name}"), prop, out);
        }
    } else if schema["items"].is_object() {
        collect_objects(&format!("{path}[]"), &schema["items"], out);
    } else if schema["additionalProperties"].is_object() {
        collect_objects(&format!("{path}.*"), &schema["additionalProperties"], out);
    }
}

/// The path of the object table a field's type links to, when it has one.
fn object_below(path: &str, schema: &Value) -> Option<String> {
    if schema["properties"].is_object() {
        Some(path.to_string())
    } else if schema["items"].is_object() {
        object_below(&format!("{path}[]"), &schema["items"])
    } else if schema["additionalProperties"].is_object() {
        object_below(&format!("{path}.*"), &schema["additionalProperties"])
    } else {
        None
    }
}

fn type_name(schema: &Value) -> String {
    if schema["x-kubernetes-int-or-string"] == Value::Bool(true) {
        return "integer or string".into();
    }
    match schema["type"].as_str() {
        Some("array") => format!("array of {}", type_name(&schema["items"])),
        Some("object") if schema["additionalProperties"].is_object() => {
            format!(
                "map of string to {}",
                type_name(&schema["additionalProperties"])
            )
        }
        Some("object") if schema["properties"].is_object() => "object".into(),
        Some("object") => "object (free-form)".into(),
        Some(t) => match schema["format"].as_str() {
            Some(f) => format!("{t} ({f})"),
            None => t.to_string(),
        },
        None => "any".into(),
    }
}

fn compact(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Enum values, default and limits of a field, for its Details cell.
fn details(schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(values) = schema["enum"].as_array() {
        let list: Vec<String> = values.iter().map(|v| code(&compact(v), true)).collect();
        out.push(format!("one of {}", list.join(", ")));
    }
    if let Some(d) = schema.get("default") {
        out.push(format!("default {}", code(&d.to_string(), true)));
    }
    for (key, label) in [
        ("minLength", "min length"),
        ("maxLength", "max length"),
        ("minItems", "min items"),
        ("maxItems", "max items"),
        ("minProperties", "min entries"),
        ("maxProperties", "max entries"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
    ] {
        if let Some(v) = schema.get(key) {
            out.push(format!("{label} {}", compact(v)));
        }
    }
    if let Some(p) = schema["pattern"].as_str() {
        out.push(format!("pattern {}", code(p, true)));
    }
    if schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true) {
        out.push("unknown fields kept".into());
    }
    // what an array's items or a map's values are limited to
    for (key, label) in [
        ("items", "each item"),
        ("additionalProperties", "each value"),
    ] {
        if schema[key].is_object() && !schema[key]["properties"].is_object() {
            let inner = details(&schema[key]);
            if !inner.is_empty() {
                out.push(format!("{label}: {}", inner.join(", ")));
            }
        }
    }
    out
}

/// The table of one object's fields, then the CEL rules of the object and of its fields.
fn object_table(out: &mut String, heading: Option<&str>, path: &str, object: &Value) {
    if let Some(heading) = heading {
        let _ = writeln!(out, "\n### {heading}\n");
        if let Some(d) = object["description"].as_str() {
            let _ = writeln!(out, "{}\n", prose(d, false));
        }
    } else {
        out.push('\n');
    }
    let required: BTreeSet<&str> = object["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let _ = writeln!(out, "| Field | Type | Required | Description | Details |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    let mut rules = Vec::new();
    push_rules(&mut rules, "(the object)", object);
    let props = object["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for (name, prop) in &props {
        let field_path = format!("{path}.{name}");
        let mut ty = type_name(prop);
        if let Some(target) = object_below(&field_path, prop) {
            ty = format!("[{ty}](#{})", slug(&target));
        }
        let description = prop["description"]
            .as_str()
            .map(|d| prose(d, true))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {} | {ty} | {} | {description} | {} |",
            code(name, true),
            if required.contains(name.as_str()) {
                "yes"
            } else {
                ""
            },
            details(prop).join("; "),
        );
        // an object's own rules are listed under its own table
        if !prop["properties"].is_object() {
            push_rules(&mut rules, name, prop);
        }
        // the rules on an array's items or a map's values, when they are not an object's
        for (key, suffix) in [("items", "[]"), ("additionalProperties", ".*")] {
            if prop[key].is_object() && !prop[key]["properties"].is_object() {
                push_rules(&mut rules, &format!("{name}{suffix}"), &prop[key]);
            }
        }
    }
    if !rules.is_empty() {
        let _ = writeln!(out, "\nValidation rules:\n");
        for r in rules {
            let _ = writeln!(out, "{r}");
        }
    }
}

fn push_rules(out: &mut Vec<String>, field: &str, schema: &Value) {
    let Some(rules) = schema["x-kubernetes-validations"].as_array() else {
        return;
    };
    for rule in rules {
        let text = rule["rule"].as_str().unwrap_or_default();
        let mut line = if field == "(the object)" {
            format!("- the object: {}", code(text, false))
        } else {
            format!("- {}: {}", code(field, false), code(text, false))
        };
        if let Some(fp) = rule["fieldPath"].as_str() {
            let _ = write!(line, " (reported at {})", code(fp, false));
        }
        if let Some(m) = rule["message"].as_str() {
            let _ = write!(line, "<br>message: {}", prose(m, false));
        }
        if let Some(r) = rule["reason"].as_str() {
            let _ = write!(line, "<br>reason: {}", code(r, false));
        }
        out.push(line);
    }
}

// ---------------------------------------------------------------------------------------------
// cli.md
