//! Reading Shim objects from YAML files (`install -f`, static Shims in `shims.d/`).
//!
//! A file may hold several YAML documents. Each must be a `containerd.x-k8s.io/v1alpha1`
//! `Shim`; its fields are checked by serde (types, enums, unknown fields: what
//! `kubectl apply --validate=strict` rejects) and then by the CRD's own CEL rules evaluated
//! client-side, so a file the API server would refuse is refused here with the same message.

use serde::Deserialize;
use thiserror::Error;

use super::names::API_VERSION;
use super::shim::Shim;

/// Why a YAML document is not an acceptable Shim.
#[derive(Debug, Error)]
pub enum ShimFileError {
    #[error("{source_name}: not valid YAML: {message}")]
    Yaml {
        source_name: String,
        message: String,
    },
    #[error(
        "{source_name}: document {doc} is not a Shim (apiVersion {api_version:?}, kind {kind:?}); expected apiVersion {API_VERSION}, kind Shim"
    )]
    NotAShim {
        source_name: String,
        doc: usize,
        api_version: String,
        kind: String,
    },
    #[error("{source_name}: Shim {name:?}: {message}")]
    Schema {
        source_name: String,
        name: String,
        message: String,
    },
    #[error("{source_name}: Shim {name:?} fails the CRD rules: {}", .errors.join("; "))]
    Rules {
        source_name: String,
        name: String,
        errors: Vec<String>,
    },
    #[error("{source_name}: no Shim in the file")]
    Empty { source_name: String },
}

impl ShimFileError {
    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            ShimFileError::Yaml { .. } => "InvalidYaml",
            ShimFileError::NotAShim { .. } => "NotAShim",
            ShimFileError::Schema { .. } => "InvalidShim",
            ShimFileError::Rules { .. } => "InvalidShim",
            ShimFileError::Empty { .. } => "NoShim",
        }
    }
}

/// Parse every Shim in `text`; `source_name` (a file name) goes into error messages.
pub fn parse_shims(text: &str, source_name: &str) -> Result<Vec<Shim>, ShimFileError> {
    let mut shims = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = serde_yaml::Value::deserialize(doc).map_err(|e| ShimFileError::Yaml {
            source_name: source_name.to_string(),
            message: e.to_string(),
        })?;
        if value.is_null() {
            continue; // empty document (e.g. a trailing `---`)
        }
        let field = |k: &str| {
            value
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let (api_version, kind) = (field("apiVersion"), field("kind"));
        if api_version != API_VERSION || kind != "Shim" {
            return Err(ShimFileError::NotAShim {
                source_name: source_name.to_string(),
                doc: i + 1,
                api_version,
                kind,
            });
        }
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .unwrap_or_default()
            .to_string();
        let shim: Shim = serde_yaml::from_value(value).map_err(|e| ShimFileError::Schema {
            source_name: source_name.to_string(),
            name: name.clone(),
            message: e.to_string(),
        })?;
        validate(&shim).map_err(|errors| ShimFileError::Rules {
            source_name: source_name.to_string(),
            name,
            errors,
        })?;
        shims.push(shim);
    }
    if shims.is_empty() {
        return Err(ShimFileError::Empty {
            source_name: source_name.to_string(),
        });
    }
    Ok(shims)
}

/// Evaluate the CRD's rules on a Shim, client-side. Errors are `field: message` lines.
pub fn validate(shim: &Shim) -> Result<(), Vec<String>> {
    let mut errors = Vec::new();
    if shim.metadata.name.as_deref().unwrap_or_default().is_empty() {
        errors.push("metadata.name: is required".to_string());
    }
    if let Err(errs) = shim.validate_cel() {
        errors.extend(errs.iter().map(|e| e.to_string()));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}
