//! What containerd's config says about images (pure): the sandbox image and the registry
//! settings, in each config schema, read from its files (later ones winning) or from
//! `containerd config dump`. The fetcher takes the registry hosts directories from here, and
//! `doctor` reports all of it.

use toml_edit::{DocumentMut, Item, TableLike};

/// What the config files say about images.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ImageSettings {
    /// The files read: the main file, then its drop-ins.
    pub files: Vec<String>,
    /// The config's `version` (1 when missing).
    pub schema_version: i64,
    /// The CRI registry `config_path`, when one is set.
    pub registry_config_path: Option<String>,
    /// Registries with deprecated `registry.mirrors` entries.
    pub legacy_mirrors: Vec<String>,
    /// Registries with deprecated `registry.configs` entries (auth, TLS).
    pub legacy_configs: Vec<String>,
    /// The sandbox image the config sets, when it sets one.
    pub sandbox_image: Option<String>,
}

/// Where the CRI image settings live, by config `version`.
fn images_plugin(version: i64) -> &'static [&'static str] {
    match version {
        ..=1 => &["plugins", "cri"],
        2 => &["plugins", "io.containerd.grpc.v1.cri"],
        _ => &["plugins", "io.containerd.cri.v1.images"],
    }
}

fn get<'a>(root: &'a dyn TableLike, path: &[&str]) -> Option<&'a Item> {
    let (first, rest) = path.split_first()?;
    let item = root.get(first)?;
    match rest {
        [] => Some(item),
        _ => get(item.as_table_like()?, rest),
    }
}

fn keys_of(item: Option<&Item>) -> Vec<String> {
    item.and_then(Item::as_table_like)
        .map(|t| t.iter().map(|(k, _)| crate::text::clip(k, 256)).collect())
        .unwrap_or_default()
}

/// Fold one config file (or a dump) into `into`: what it sets replaces what came before.
pub fn read_into(into: &mut ImageSettings, path: &str, text: &str) -> Result<(), String> {
    let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        format!(
            "{path} is not valid TOML: {}",
            crate::text::clip(&e.to_string(), 512)
        )
    })?;
    let root = doc.as_table();
    let version = root.get("version").and_then(Item::as_integer);
    if let Some(v) = version {
        into.schema_version = v;
    }
    let version = version.unwrap_or(into.schema_version.max(1));
    into.schema_version = version;
    let plugin = images_plugin(version);
    fn at(plugin: &[&'static str], rest: &[&'static str]) -> Vec<&'static str> {
        plugin.iter().chain(rest).copied().collect()
    }
    let sandbox = if version >= 3 {
        get(root, &at(plugin, &["pinned_images", "sandbox"]))
    } else {
        get(root, &at(plugin, &["sandbox_image"]))
    };
    if let Some(s) = sandbox.and_then(Item::as_str).filter(|s| !s.is_empty()) {
        into.sandbox_image = Some(crate::text::clip(s, 256));
    }
    if let Some(p) = get(root, &at(plugin, &["registry", "config_path"])).and_then(Item::as_str) {
        into.registry_config_path = (!p.is_empty()).then(|| crate::text::clip(p, 1024));
    }
    let mirrors = keys_of(get(root, &at(plugin, &["registry", "mirrors"])));
    if !mirrors.is_empty() {
        into.legacy_mirrors = mirrors;
    }
    let configs = keys_of(get(root, &at(plugin, &["registry", "configs"])));
    if !configs.is_empty() {
        into.legacy_configs = configs;
    }
    into.files.push(path.to_string());
    Ok(())
}

/// What a layout's files (read by [`super::Layout::load`]) say about images.
pub fn read_current(current: &super::Current) -> Result<ImageSettings, String> {
    let files = match current {
        super::Current::Files(set) => std::iter::once(&set.main)
            .chain(&set.dropins)
            .collect::<Vec<_>>(),
        super::Current::GoTemplate(t) => {
            let mut v = vec![&t.rendered];
            v.extend(t.dropins.iter().flat_map(|d| d.files.iter()));
            v
        }
    };
    let mut out = ImageSettings::default();
    for f in files {
        let path = f.host_path.display().to_string();
        let text = std::str::from_utf8(&f.bytes).map_err(|_| format!("{path} is not UTF-8"))?;
        read_into(&mut out, &path, text)?;
    }
    Ok(out)
}

/// The directories of a `config_path` (`:`-separated, as containerd splits it).
pub fn hosts_dirs(config_path: &str) -> Vec<String> {
    config_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(files: &[&str]) -> ImageSettings {
        let mut f = ImageSettings::default();
        for (i, t) in files.iter().enumerate() {
            read_into(&mut f, &format!("f{i}"), t).unwrap();
        }
        f
    }

    #[test]
    fn each_schema_names_its_sandbox_image_and_registry_in_its_own_place() {
        let v2 = read(&[r#"version = 2
[plugins."io.containerd.grpc.v1.cri"]
sandbox_image = "registry.k8s.io/pause:3.6"
[plugins."io.containerd.grpc.v1.cri".registry]
config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
endpoint = ["https://mirror"]
"#]);
        assert_eq!(
            v2.sandbox_image.as_deref(),
            Some("registry.k8s.io/pause:3.6")
        );
        assert_eq!(
            v2.registry_config_path.as_deref(),
            Some("/etc/containerd/certs.d")
        );
        assert_eq!(v2.legacy_mirrors, vec!["docker.io"]);
        let v3 = read(&[r#"version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
sandbox = 'registry.k8s.io/pause:3.10.2'
[plugins.'io.containerd.cri.v1.images'.registry]
config_path = ''
"#]);
        assert_eq!(
            v3.sandbox_image.as_deref(),
            Some("registry.k8s.io/pause:3.10.2")
        );
        assert_eq!(v3.registry_config_path, None);
        let v1 = read(&["[plugins.cri]\nsandbox_image = \"k8s.gcr.io/pause:3.2\"\n"]);
        assert_eq!(v1.sandbox_image.as_deref(), Some("k8s.gcr.io/pause:3.2"));
        assert_eq!(v1.schema_version, 1); // no `version` key: containerd reads it as 1
    }

    #[test]
    fn a_later_drop_in_overrides_the_main_file() {
        let f = read(&[
            "version = 3\n",
            "[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/etc/containerd/certs.d:/etc/docker/certs.d'\n",
        ]);
        assert_eq!(
            hosts_dirs(f.registry_config_path.as_deref().unwrap()),
            vec!["/etc/containerd/certs.d", "/etc/docker/certs.d"]
        );
        assert_eq!(f.files, vec!["f0", "f1"]);
    }

    #[test]
    fn broken_files_are_told_by_path_and_never_panic() {
        let mut f = ImageSettings::default();
        let e = read_into(&mut f, "/etc/containerd/config.toml", "version = [").unwrap_err();
        assert!(
            e.starts_with("/etc/containerd/config.toml is not valid TOML"),
            "{e}"
        );
        // keys of the wrong type are ignored, not trusted
        read_into(&mut f, "x", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = 3\nregistry = 'x'\n").unwrap();
        assert_eq!(f.sandbox_image, None);
    }
}
