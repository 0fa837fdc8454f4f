//! What a transaction writes down: the handler registered for a Shim, the config-file
//! records kept across upgrades, and the hashes and times in them.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::api::Shim;
use crate::containerd::RuntimeSpec;
use crate::state::{ConfigRecord, InstalledShim};

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The handler to register for `shim`, whose binary is installed at `binary_host`, with
/// `option_paths` (`runtime.optionPaths` made absolute) among its options.
///
/// The installed binary's absolute path is the `runtime_type`, not `runtime_type =
/// "io.containerd.<name>.v<N>"` plus `runtime_path`: containerd 1.6 lists such a handler but
/// ignores `runtime_path` when it starts a shim ("runtime ... binary not installed";
/// containerd#8207, fixed in 1.7 and 2.x), so no pod could run. An absolute `runtime_type`
/// works from 1.6 on.
pub(crate) fn runtime_spec(
    shim: &Shim,
    binary_host: &str,
    option_paths: &BTreeMap<String, String>,
) -> RuntimeSpec {
    let mut rt = RuntimeSpec {
        handler: shim.handler().to_string(),
        runtime_type: binary_host.to_string(),
        runtime_path: None,
        ..RuntimeSpec::default()
    };
    if let Some(r) = &shim.spec.runtime {
        rt.options = r.options.clone().unwrap_or_default();
        rt.pod_annotations = r.pod_annotations.clone().unwrap_or_default();
        rt.privileged_without_host_devices = r.privileged_without_host_devices.unwrap_or(false);
    }
    for (k, v) in option_paths {
        rt.options
            .insert(k.clone(), serde_json::Value::String(v.clone()));
    }
    rt
}

/// Keep the original "before" hash across upgrades: uninstall compares with the bytes
/// from before the *first* install.
pub(crate) fn merge_config_records(
    previous: Option<&InstalledShim>,
    now: Vec<ConfigRecord>,
) -> Vec<ConfigRecord> {
    let Some(prev) = previous else { return now };
    let mut out = prev.config_files.clone();
    for rec in now {
        match out.iter_mut().find(|r| r.path == rec.path) {
            Some(r) => r.sha256_after = rec.sha256_after,
            None => out.push(rec),
        }
    }
    out
}
