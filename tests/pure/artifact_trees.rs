//! The layouts real projects publish, installed whole into an image root (`install --root`):
//! runwasi's release tarball (`./containerd-shim-wasmtime-v1` with its `.sig` and `.pem`),
//! a gVisor-shaped runtime of several files whose `runsc.toml` the handler's `ConfigPath`
//! names, and a kata-shaped tree (`opt/kata/...`) with the shim deep inside it. Options that
//! name files of the tree get their installed paths; a name the artifact lacks is refused
//! and leaves the image as it was.

use std::os::unix::fs::PermissionsExt;

use shim_agent::cli::image::InstallOutcome;

use crate::support::image_root::{Image, image, run_install, uninstall, write_artifact};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, real_elf, tar_gz};

fn shim(name: &str, url: &str, sha: &str) -> ShimBuilder {
    ShimBuilder::new(name).artifact(url, sha)
}

/// The handler table `name` in the image's (version 2) containerd config.
fn handler(img: &Image, name: &str) -> toml_edit::Item {
    let text =
        std::fs::read_to_string(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap();
    let doc: toml_edit::DocumentMut = text.parse().unwrap();
    doc["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][name].clone()
}

fn installed_binary(out: InstallOutcome) -> String {
    match out {
        InstallOutcome::Installed { binary, .. } => binary,
        other => panic!("not installed: {other:?}"),
    }
}

fn mode(img: &Image, host: &str) -> u32 {
    std::fs::metadata(img.root.resolve(host).unwrap())
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn runwasi_release_tarball_installs_the_shim_with_its_signature_beside_it() {
    let img = image();
    let art = tar_gz(&[
        Entry::File("./containerd-shim-wasmtime-v1", real_elf(), 0o755),
        Entry::File("./containerd-shim-wasmtime-v1.sig", b"sig".to_vec(), 0o644),
        Entry::File("./containerd-shim-wasmtime-v1.pem", b"pem".to_vec(), 0o644),
    ]);
    let (url, sha) = write_artifact(&img, "containerd-shim-wasmtime-x86_64.tar.gz", &art);
    let bin = installed_binary(run_install(&img, &shim("wasmtime", &url, &sha).yaml()).unwrap());
    let dir = format!("/opt/shim-agent/shims/wasmtime/{sha}");
    assert_eq!(bin, format!("{dir}/containerd-shim-wasmtime-v1"));
    assert_eq!(
        handler(&img, "wasmtime")["runtime_type"].as_str(),
        Some(bin.as_str())
    );
    for f in ["sig", "pem"] {
        let p = format!("{dir}/containerd-shim-wasmtime-v1.{f}");
        assert_eq!(
            std::fs::read(img.root.resolve(&p).unwrap()).unwrap(),
            f.as_bytes()
        );
        assert_eq!(mode(&img, &p), 0o644);
    }
    assert_eq!(mode(&img, &bin), 0o755);
    uninstall(&img, "wasmtime").unwrap();
    assert!(
        !img.root.resolve(&dir).unwrap().exists(),
        "the whole tree goes"
    );
}

#[test]
fn a_gvisor_shaped_runtime_installs_whole_and_config_path_names_its_runsc_toml() {
    let img = image();
    let art = tar_gz(&[
        Entry::File("containerd-shim-runsc-v1", real_elf(), 0o755),
        Entry::File("runsc", b"runsc binary".to_vec(), 0o755),
        Entry::File(
            "runsc.toml",
            b"[runsc_config]\nplatform = \"ptrace\"\n".to_vec(),
            0o644,
        ),
    ]);
    let (url, sha) = write_artifact(&img, "gvisor.tar.gz", &art);
    let gvisor = shim("gvisor", &url, &sha)
        .option("TypeUrl", "io.containerd.runsc.v1.options")
        .option_path("ConfigPath", "runsc.toml");
    let bin = installed_binary(run_install(&img, &gvisor.yaml()).unwrap());
    let dir = format!("/opt/shim-agent/shims/gvisor/{sha}");
    assert_eq!(bin, format!("{dir}/containerd-shim-runsc-v1"));
    let h = handler(&img, "gvisor");
    assert_eq!(
        h["options"]["ConfigPath"].as_str(),
        Some(format!("{dir}/runsc.toml").as_str()),
        "the installed path, without the operator knowing the digest"
    );
    assert_eq!(
        h["options"]["TypeUrl"].as_str(),
        Some("io.containerd.runsc.v1.options")
    );
    assert_eq!(mode(&img, &format!("{dir}/runsc")), 0o755);
    assert!(
        img.root
            .resolve(format!("{dir}/runsc.toml"))
            .unwrap()
            .is_file()
    );
}

#[test]
fn a_kata_shaped_tree_keeps_its_layout_and_the_shim_deep_inside_it_is_the_handler() {
    let img = image();
    let art = tar_gz(&[
        Entry::Dir("opt/"),
        Entry::Dir("opt/kata/"),
        Entry::Dir("opt/kata/bin/"),
        Entry::File("opt/kata/bin/containerd-shim-kata-v2", real_elf(), 0o755),
        Entry::Dir("opt/kata/share/"),
        Entry::Dir("opt/kata/share/defaults/"),
        Entry::Dir("opt/kata/share/defaults/kata-containers/"),
        Entry::File(
            "opt/kata/share/defaults/kata-containers/configuration.toml",
            b"[hypervisor.qemu]\n".to_vec(),
            0o644,
        ),
        Entry::Dir("opt/kata/share/kata-containers/"),
        Entry::File(
            "opt/kata/share/kata-containers/vmlinux-6.12.container",
            b"kernel".to_vec(),
            0o644,
        ),
        Entry::Symlink(
            "opt/kata/share/kata-containers/vmlinux.container",
            "vmlinux-6.12.container",
        ),
        Entry::File(
            "opt/kata/share/kata-containers/kata-containers.img",
            b"image".to_vec(),
            0o644,
        ),
    ]);
    let (url, sha) = write_artifact(&img, "kata-static.tar.gz", &art);
    let kata = shim("kata", &url, &sha)
        .binary("opt/kata/bin/containerd-shim-kata-v2")
        .option_path(
            "ConfigPath",
            "opt/kata/share/defaults/kata-containers/configuration.toml",
        );
    let bin = installed_binary(run_install(&img, &kata.yaml()).unwrap());
    let dir = format!("/opt/shim-agent/shims/kata/{sha}");
    assert_eq!(bin, format!("{dir}/opt/kata/bin/containerd-shim-kata-v2"));
    assert_eq!(
        handler(&img, "kata")["runtime_type"].as_str(),
        Some(bin.as_str())
    );
    assert_eq!(
        handler(&img, "kata")["options"]["ConfigPath"].as_str(),
        Some(format!("{dir}/opt/kata/share/defaults/kata-containers/configuration.toml").as_str())
    );
    let link = img
        .root
        .resolve(format!(
            "{dir}/opt/kata/share/kata-containers/vmlinux.container"
        ))
        .unwrap();
    assert_eq!(std::fs::read(&link).unwrap(), b"kernel", "the link is kept");
    assert_eq!(
        std::fs::read_link(
            img.root
                .path()
                .join(&format!("{dir}/opt/kata/share/kata-containers/vmlinux.container")[1..])
        )
        .unwrap(),
        std::path::Path::new("vmlinux-6.12.container")
    );
    uninstall(&img, "kata").unwrap();
    assert_eq!(
        std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap(),
        img.original_config
    );
    assert!(
        !img.root
            .resolve("/opt/shim-agent/shims/kata")
            .unwrap()
            .exists()
    );
}

#[test]
fn an_option_path_the_artifact_lacks_or_options_set_too_is_refused_and_the_image_is_unchanged() {
    let img = image();
    let art = tar_gz(&[
        Entry::File("containerd-shim-runsc-v1", real_elf(), 0o755),
        Entry::File("runsc", b"runsc".to_vec(), 0o755),
    ]);
    let (url, sha) = write_artifact(&img, "gvisor.tar.gz", &art);
    let before = std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap();
    let gvisor = shim("gvisor", &url, &sha);
    for (bad, says) in [
        (
            gvisor.clone().option_path("ConfigPath", "runsc.toml"),
            "runtime.optionPaths.ConfigPath names \"runsc.toml\", which is not a file in the artifact",
        ),
        (
            gvisor.clone().option_path("ConfigPath", "."),
            "runtime.optionPaths.ConfigPath names \".\", which is not a file in the artifact",
        ),
        (
            gvisor
                .option("ConfigPath", "/etc/runsc.toml")
                .option_path("ConfigPath", "runsc"),
            "runtime.optionPaths.ConfigPath and runtime.options.ConfigPath both set the option",
        ),
    ] {
        let e = format!("{:#}", run_install(&img, &bad.yaml()).unwrap_err());
        assert!(e.contains(says) && e.contains("Shim \"gvisor\""), "{e}");
        assert_eq!(
            std::fs::read(img.root.resolve("/etc/containerd/config.toml").unwrap()).unwrap(),
            before
        );
        assert!(
            !img.root
                .resolve("/opt/shim-agent/shims/gvisor")
                .unwrap()
                .exists()
        );
    }
}
