//! What a runtime handler should look like ([`RuntimeSpec`]), how it is written as TOML, and
//! how an existing handler table is compared with it.

use serde_json::{Map, Value as Json};
use toml_edit::{Array, InlineTable, Item, Table, Value};

use super::error::ConfigError;

/// The handler to register: one `runtimes.<handler>` table.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuntimeSpec {
    /// CRI handler name (the RuntimeClass `handler`), a DNS-1123 label.
    pub handler: String,
    /// `runtime_type`: `io.containerd.<name>.v<N>` or an absolute path to the shim (≥1.6).
    pub runtime_type: String,
    /// `runtime_path`: absolute path of the shim binary, used with an `io.containerd.*` type.
    pub runtime_path: Option<String>,
    /// Free-form table copied to the handler's `options`.
    pub options: Map<String, Json>,
    /// `pod_annotations` passed through to the shim.
    pub pod_annotations: Vec<String>,
    /// `privileged_without_host_devices`.
    pub privileged_without_host_devices: bool,
}

impl RuntimeSpec {
    /// A spec for a shim binary: `containerd-shim-<name>-v<N>` gives
    /// `runtime_type = "io.containerd.<name>.v<N>"` plus `runtime_path`; any other file name
    /// is used as an absolute-path `runtime_type`.
    pub fn from_binary(handler: &str, binary: &str) -> RuntimeSpec {
        let file = binary.rsplit('/').next().unwrap_or(binary);
        let derived = file.strip_prefix("containerd-shim-").and_then(|rest| {
            let (name, ver) = rest.rsplit_once("-v")?;
            let ok = !name.is_empty()
                && !ver.is_empty()
                && ver.bytes().all(|b| b.is_ascii_digit())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            ok.then(|| format!("io.containerd.{name}.v{ver}"))
        });
        let (runtime_type, runtime_path) = match derived {
            Some(t) => (t, Some(binary.to_string())),
            None => (binary.to_string(), None),
        };
        RuntimeSpec {
            handler: handler.to_string(),
            runtime_type,
            runtime_path,
            ..RuntimeSpec::default()
        }
    }

    /// Check the handler name, runtime type, path and options.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate_handler_name(&self.handler)?;
        let bad = |detail: String| {
            Err(ConfigError::InvalidRuntimeSpec {
                handler: self.handler.clone(),
                detail,
            })
        };
        let t = &self.runtime_type;
        if t.starts_with('/') {
            if self.runtime_path.is_some() {
                return bad(format!(
                    "runtime_type `{t}` is already a path; give runtime_path only with an \
                     `io.containerd.<name>.v<N>` type"
                ));
            }
        } else if !is_shim_type(t) {
            return bad(format!(
                "runtime_type `{t}` must be `io.containerd.<name>.v<N>` or an absolute path"
            ));
        }
        if let Some(p) = &self.runtime_path
            && !p.starts_with('/')
        {
            return bad(format!("runtime_path `{p}` must be an absolute path"));
        }
        if t.contains('\n')
            || self
                .runtime_path
                .as_deref()
                .is_some_and(|p| p.contains('\n'))
        {
            return bad("runtime_type and runtime_path must be one line".into());
        }
        if let Err(k) = check_json(&Json::Object(self.options.clone()), "options") {
            return bad(format!("option `{k}` is null, which TOML cannot hold"));
        }
        Ok(())
    }

    /// The handler table as containerd reads it (for comparison), as JSON.
    pub fn to_json(&self) -> Json {
        let mut m = Map::new();
        m.insert(
            "runtime_type".into(),
            Json::String(self.runtime_type.clone()),
        );
        if let Some(p) = &self.runtime_path {
            m.insert("runtime_path".into(), Json::String(p.clone()));
        }
        if !self.pod_annotations.is_empty() {
            m.insert(
                "pod_annotations".into(),
                Json::Array(
                    self.pod_annotations
                        .iter()
                        .map(|a| Json::String(a.clone()))
                        .collect(),
                ),
            );
        }
        if self.privileged_without_host_devices {
            m.insert("privileged_without_host_devices".into(), Json::Bool(true));
        }
        if !self.options.is_empty() {
            m.insert("options".into(), Json::Object(self.options.clone()));
        }
        Json::Object(m)
    }

    /// The handler table (header form) and its `options` sub-table, without decor.
    pub(crate) fn to_table(&self) -> Table {
        let mut t = Table::new();
        t.insert("runtime_type", toml_edit::value(self.runtime_type.as_str()));
        if let Some(p) = &self.runtime_path {
            t.insert("runtime_path", toml_edit::value(p.as_str()));
        }
        if !self.pod_annotations.is_empty() {
            let a: Array = self.pod_annotations.iter().map(String::as_str).collect();
            t.insert("pod_annotations", toml_edit::value(a));
        }
        if self.privileged_without_host_devices {
            t.insert("privileged_without_host_devices", toml_edit::value(true));
        }
        if !self.options.is_empty() {
            let mut o = Table::new();
            for (k, v) in &self.options {
                if let Some(v) = json_to_toml(v) {
                    o.insert(k, Item::Value(v));
                }
            }
            t.insert("options", Item::Table(o));
        }
        t
    }
}

/// `io.containerd.<name>.v<N>`.
fn is_shim_type(t: &str) -> bool {
    let Some(rest) = t.strip_prefix("io.containerd.") else {
        return false;
    };
    let Some((name, ver)) = rest.rsplit_once(".v") else {
        return false;
    };
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !ver.is_empty()
        && ver.bytes().all(|b| b.is_ascii_digit())
}

/// A RuntimeClass handler must be a DNS-1123 label.
pub fn validate_handler_name(name: &str) -> Result<(), ConfigError> {
    let b = name.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-';
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidHandlerName {
            name: name.to_string(),
        })
    }
}

fn check_json(v: &Json, at: &str) -> Result<(), String> {
    match v {
        Json::Null => Err(at.to_string()),
        Json::Array(a) => a.iter().try_for_each(|x| check_json(x, at)),
        Json::Object(m) => m
            .iter()
            .try_for_each(|(k, x)| check_json(x, &format!("{at}.{k}"))),
        _ => Ok(()),
    }
}

fn json_to_toml(v: &Json) -> Option<Value> {
    Some(match v {
        Json::Null => return None,
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i),
            None => Value::from(n.as_f64()?),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => Value::Array(a.iter().filter_map(json_to_toml).collect()),
        Json::Object(m) => {
            let mut t = InlineTable::new();
            for (k, x) in m {
                if let Some(x) = json_to_toml(x) {
                    t.insert(k, x);
                }
            }
            Value::InlineTable(t)
        }
    })
}

/// A TOML item as plain JSON (tables of any form become objects; datetimes become strings).
pub fn item_to_json(item: &Item) -> Json {
    match item {
        Item::None => Json::Null,
        Item::Value(v) => value_to_json(v),
        Item::Table(t) => Json::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), item_to_json(v)))
                .collect(),
        ),
        Item::ArrayOfTables(a) => Json::Array(
            a.iter()
                .map(|t| item_to_json(&Item::Table(t.clone())))
                .collect(),
        ),
    }
}

fn value_to_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::String(s.value().clone()),
        Value::Integer(i) => Json::from(*i.value()),
        Value::Float(f) => serde_json::Number::from_f64(*f.value())
            .map(Json::Number)
            .unwrap_or_else(|| Json::String(f.value().to_string())),
        Value::Boolean(b) => Json::Bool(*b.value()),
        Value::Datetime(d) => Json::String(d.value().to_string()),
        Value::Array(a) => Json::Array(a.iter().map(value_to_json).collect()),
        Value::InlineTable(t) => Json::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), value_to_json(v)))
                .collect(),
        ),
    }
}

/// Fields (dotted paths) where an existing handler differs from the wanted one. Defaults are
/// normalised (absent `options`, `pod_annotations`, `privileged_without_host_devices` equal
/// empty/false), so a hand-written equivalent handler counts as identical.
pub fn differing_fields(existing: &Json, wanted: &Json) -> Vec<String> {
    let norm = |j: &Json| -> Map<String, Json> {
        let mut m = j.as_object().cloned().unwrap_or_default();
        m.retain(|k, v| match k.as_str() {
            "options" => v.as_object().is_none_or(|o| !o.is_empty()),
            "pod_annotations" => v.as_array().is_none_or(|a| !a.is_empty()),
            "privileged_without_host_devices" => v != &Json::Bool(false),
            _ => true,
        });
        m
    };
    let (e, w) = (norm(existing), norm(wanted));
    let mut out = Vec::new();
    diff_maps(&e, &w, "", &mut out);
    out
}

fn diff_maps(e: &Map<String, Json>, w: &Map<String, Json>, prefix: &str, out: &mut Vec<String>) {
    let mut keys: Vec<&String> = e.keys().chain(w.keys()).collect();
    keys.sort();
    keys.dedup();
    for k in keys {
        let name = format!("{prefix}{k}");
        let empty = Map::new();
        match (e.get(k), w.get(k)) {
            (Some(Json::Object(a)), Some(Json::Object(b))) => {
                diff_maps(a, b, &format!("{name}."), out)
            }
            (Some(Json::Object(a)), None) => diff_maps(a, &empty, &format!("{name}."), out),
            (None, Some(Json::Object(b))) => diff_maps(&empty, b, &format!("{name}."), out),
            (a, b) if a != b => out.push(name),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_binaries_give_a_runtime_type_and_path() {
        let s = RuntimeSpec::from_binary("spin", "/opt/shims/containerd-shim-spin-v2");
        assert_eq!(s.runtime_type, "io.containerd.spin.v2");
        assert_eq!(
            s.runtime_path.as_deref(),
            Some("/opt/shims/containerd-shim-spin-v2")
        );
        let s = RuntimeSpec::from_binary("x", "/opt/bin/myshim");
        assert_eq!(s.runtime_type, "/opt/bin/myshim");
        assert_eq!(s.runtime_path, None);
    }

    #[test]
    fn handler_names_must_be_dns_labels() {
        for ok in ["spin", "test-handler", "a", "wasm-2"] {
            assert!(validate_handler_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "Spin", "-a", "a-", "a.b", "a_b", &"x".repeat(64), "a b"] {
            assert_eq!(
                validate_handler_name(bad).unwrap_err().reason(),
                "InvalidHandlerName",
                "{bad}"
            );
        }
    }

    #[test]
    fn runtime_types_are_checked() {
        let mut s = RuntimeSpec::from_binary("spin", "/x/containerd-shim-spin-v2");
        assert!(s.validate().is_ok());
        s.runtime_type = "spin".into();
        assert_eq!(s.validate().unwrap_err().reason(), "InvalidRuntimeSpec");
        s.runtime_type = "/abs/shim".into();
        assert_eq!(s.validate().unwrap_err().reason(), "InvalidRuntimeSpec");
        s.runtime_path = None;
        assert!(s.validate().is_ok());
        s.options.insert("x".into(), Json::Null);
        assert_eq!(s.validate().unwrap_err().reason(), "InvalidRuntimeSpec");
    }

    #[test]
    fn default_valued_fields_do_not_count_as_differences() {
        let e: Json = serde_json::json!({"runtime_type": "t", "options": {}, "pod_annotations": [],
            "privileged_without_host_devices": false});
        let w: Json = serde_json::json!({"runtime_type": "t"});
        assert!(differing_fields(&e, &w).is_empty());
        let e: Json = serde_json::json!({"runtime_type": "t", "options": {"A": 1, "B": 2}});
        let w: Json = serde_json::json!({"runtime_type": "u", "options": {"A": 1}});
        assert_eq!(differing_fields(&e, &w), vec!["options.B", "runtime_type"]);
    }
}
