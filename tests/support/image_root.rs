//! An image root for offline installs (`install --root`): a root with a real containerd
//! config from the corpus, artifacts beside it, and the library's install and uninstall.
#![allow(dead_code)]

use std::path::Path;

use shim_agent::api::load::parse_shims;
use shim_agent::artifact::node_platform;
use shim_agent::cli::image::{self, InstallOptions, InstallOutcome};
use shim_agent::hostroot::HostRoot;
use shim_agent::settings::Settings;

use super::sha256_hex;

/// Debian's containerd 1.6.20 config, from the shared corpus.
pub const DEBIAN_CONFIG: &str =
    "../shared/containerd-configs/debian12-containerd-1.6.20-etc-config.toml";

pub struct Image {
    pub _tmp: tempfile::TempDir,
    pub root: HostRoot,
    pub artifacts: std::path::PathBuf,
    pub original_config: Vec<u8>,
}

pub fn image() -> Image {
    let tmp = tempfile::tempdir().unwrap();
    let rootdir = tmp.path().join("root");
    std::fs::create_dir_all(rootdir.join("etc/containerd")).unwrap();
    let cfg = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(DEBIAN_CONFIG))
        .expect("shared corpus next to the repo");
    std::fs::write(rootdir.join("etc/containerd/config.toml"), &cfg).unwrap();
    let artifacts = tmp.path().join("artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    Image {
        root: HostRoot::new(&rootdir).unwrap(),
        artifacts,
        original_config: cfg,
        _tmp: tmp,
    }
}

pub fn write_artifact(img: &Image, file: &str, bytes: &[u8]) -> (String, String) {
    let p = img.artifacts.join(file);
    std::fs::write(&p, bytes).unwrap();
    (format!("file://{}", p.display()), sha256_hex(bytes))
}

pub fn opts() -> InstallOptions {
    InstallOptions {
        platform: node_platform(),
        containerd_version: None,
        progress: false,
    }
}

pub fn run_install(img: &Image, yaml: &str) -> anyhow::Result<InstallOutcome> {
    run_install_with(img, yaml, &opts())
}

/// [`run_install`] with these options (`--platform`, `--containerd-version`).
pub fn run_install_with(
    img: &Image,
    yaml: &str,
    opts: &InstallOptions,
) -> anyhow::Result<InstallOutcome> {
    run_install_settings(img, yaml, opts, &Settings::default())
}

/// [`run_install`] with these options and the agent's settings.
pub fn run_install_settings(
    img: &Image,
    yaml: &str,
    opts: &InstallOptions,
    settings: &Settings,
) -> anyhow::Result<InstallOutcome> {
    let shim = parse_shims(yaml, "shim.yaml").unwrap().remove(0);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(image::install_offline(&img.root, settings, &shim, opts))
}

pub fn uninstall(img: &Image, name: &str) -> anyhow::Result<image::UninstallOutcome> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(image::uninstall_offline(
        &img.root,
        &Settings::default(),
        name,
    ))
}

/// Every file and directory under `dir` with its mode and content: "exactly as it was".
pub fn deep_snapshot(dir: &Path) -> std::collections::BTreeMap<String, (u32, Option<Vec<u8>>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            if m.is_dir() {
                todo.push(p.clone());
                out.insert(rel, (m.permissions().mode(), None));
            } else {
                out.insert(
                    rel,
                    (m.permissions().mode(), Some(std::fs::read(&p).unwrap())),
                );
            }
        }
    }
    out
}
