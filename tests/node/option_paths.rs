//! `runtime.optionPaths` reach the real containerd of the node env: a gVisor-shaped Shim (a
//! tree with its shim and a `runsc.toml`, `optionPaths: {ConfigPath: runsc.toml}`) installed
//! by the transaction engine, then containerd's own view read back: `containerd config dump`
//! in the node gives the handler `ConfigPath` = the absolute path of `runsc.toml` inside the
//! installed content-addressed tree, that path names the file inside the node, and CRI (what
//! `crictl info` shows) serves the handler with the same option.
//!
//! The shim is the node's runc shim under another name, which cannot take gVisor's options:
//! the node's config turns the sandbox check off (`check.sandbox = false`), so the test sees
//! what containerd was given, and that the escape hatch skips the check. Real gVisor passes
//! the check end to end (tests/e2e/run).
//! Skipped with a reason when no node env runs, unless `SHIM_AGENT_REQUIRE_NODE_ENV=1` (CI).

use std::time::Duration;

use shim_agent::settings::Settings;
use shim_agent::txn::Change;

use crate::support::node_env::{NodeEnv, node_env};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, sha256_hex, tar_gz};

const RUNSC_TOML: &[u8] = b"[runsc_config]\nplatform = \"ptrace\"\n";

fn clean_agent_files(env: &NodeEnv) {
    for p in ["var/lib/shim-agent", "opt/shim-agent", "etc/shim-agent"] {
        let _ = std::fs::remove_dir_all(env.root.join(p));
    }
}

/// The `options` of `handler` in containerd's merged config as `containerd config dump` prints
/// it inside the node.
fn dumped_options(env: &NodeEnv, handler: &str) -> toml_edit::Table {
    let dump = env.exec_ok(&["containerd", "config", "dump"]);
    let doc: toml_edit::DocumentMut = dump.parse().expect("config dump is TOML");
    let options = doc
        .get("plugins")
        .and_then(|p| p.get(env.containerd.cri_runtime_plugin()))
        .and_then(|c| c.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(handler))
        .and_then(|h| h.get("options"))
        .and_then(toml_edit::Item::as_table_like)
        .unwrap_or_else(|| panic!("no options of handler {handler} in the dump:\n{dump}"));
    let mut out = toml_edit::Table::new();
    for (k, v) in options.iter() {
        out.insert(k, v.clone());
    }
    out
}

#[tokio::test]
async fn an_option_path_reaches_containerd_as_the_absolute_path_of_the_file_in_the_installed_tree()
{
    let Some(env) = node_env("option_paths").await else {
        return;
    };
    clean_agent_files(&env);
    let tmp = tempfile::tempdir().unwrap();
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2"))
        .expect("runc shim in the rootfs");
    let bytes = tar_gz(&[
        Entry::File("containerd-shim-runsc-v1", shim, 0o755),
        Entry::File("runsc.toml", RUNSC_TOML.to_vec(), 0o644),
    ]);
    let art = tmp.path().join("gvisor.tar.gz");
    std::fs::write(&art, &bytes).unwrap();
    let sha = sha256_hex(&bytes);
    let gvisor = ShimBuilder::new("gvisor")
        .artifact(&format!("file://{}", art.display()), &sha)
        .option("TypeUrl", "io.containerd.runsc.v1.options")
        .option_path("ConfigPath", "runsc.toml")
        .build();
    let root = env.host_root();
    let mut settings = Settings::default();
    settings.check.sandbox = false;

    let report = env
        .node(&root, &settings)
        .apply(vec![Change::Install(Box::new(gvisor))])
        .await
        .unwrap();
    assert_eq!(report.installed, ["gvisor"]);
    let config_path = format!("/opt/shim-agent/shims/gvisor/{sha}/runsc.toml");

    // containerd's own reading of its config (main file and drop-ins merged)
    let options = dumped_options(&env, "gvisor");
    assert_eq!(
        options.get("ConfigPath").and_then(|v| v.as_str()),
        Some(config_path.as_str()),
        "containerd config dump: {options}"
    );
    assert_eq!(
        options.get("TypeUrl").and_then(|v| v.as_str()),
        Some("io.containerd.runsc.v1.options"),
        "containerd config dump: {options}"
    );
    // the path names the file, as containerd's processes see the node
    assert_eq!(
        env.exec_ok(&["cat", &config_path]).as_bytes(),
        RUNSC_TOML,
        "{config_path} inside the node"
    );

    // CRI serves the handler, with the option (`crictl info`: the verbose status's config)
    let raw = env.cri.status_raw(Duration::from_secs(5)).await.unwrap();
    let st = shim_agent::node::cri::status_from_response(&raw).unwrap();
    assert!(
        st.runtime_ready && st.handlers.contains(&"gvisor".to_string()),
        "{st:?}"
    );
    let info: serde_json::Value = serde_json::from_str(&raw.info["config"]).unwrap();
    let cri_options = &info["containerd"]["runtimes"]["gvisor"]["options"];
    assert_eq!(
        cri_options["ConfigPath"].as_str(),
        Some(config_path.as_str()),
        "CRI's verbose status: {cri_options}"
    );
}
