//! What containerd's config says about images (pure): the sandbox image and the registry
//! settings, in each config schema. Read from `containerd config dump` (the merged config,
//! defaults included) where containerd can be run, else from the files, later ones winning.

use toml_edit::{DocumentMut, Item, TableLike};

use super::facts::ConfigFacts;

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
pub fn read_into(into: &mut ConfigFacts, path: &str, text: &str) -> Result<(), String> {
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

/// The directories of a `config_path` (`:`-separated, as containerd splits it).
pub fn hosts_dirs(config_path: &str) -> Vec<String> {
    config_path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

/// Why containerd cannot use a `hosts.toml`, if it cannot (pure): it must parse, and every
/// `[host."…"]` must be a table.
pub fn hosts_toml_problem(text: &str) -> Option<String> {
    let doc: DocumentMut = match text.parse() {
        Ok(d) => d,
        Err(e) => {
            return Some(format!(
                "not valid TOML: {}",
                crate::text::clip(&e.to_string(), 512)
            ));
        }
    };
    match doc.get("host") {
        Some(h) if h.as_table_like().is_none() => Some("`host` is not a table of mirrors".into()),
        Some(h) => h
            .as_table_like()
            .and_then(|t| t.iter().find(|(_, v)| v.as_table_like().is_none()))
            .map(|(k, _)| format!("host {k:?} is not a table")),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(files: &[&str]) -> ConfigFacts {
        let mut f = ConfigFacts::default();
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
        let mut f = ConfigFacts::default();
        let e = read_into(&mut f, "/etc/containerd/config.toml", "version = [").unwrap_err();
        assert!(
            e.starts_with("/etc/containerd/config.toml is not valid TOML"),
            "{e}"
        );
        // keys of the wrong type are ignored, not trusted
        read_into(&mut f, "x", "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\nsandbox_image = 3\nregistry = 'x'\n").unwrap();
        assert_eq!(f.sandbox_image, None);
        assert_eq!(
            hosts_toml_problem(
                "server = \"https://r\"\n[host.\"https://m\"]\ncapabilities = [\"pull\"]\n"
            ),
            None
        );
        assert!(
            hosts_toml_problem("[host")
                .unwrap()
                .starts_with("not valid TOML")
        );
        assert_eq!(
            hosts_toml_problem("host = 1").as_deref(),
            Some("`host` is not a table of mirrors")
        );
        assert_eq!(
            hosts_toml_problem("[host]\nx = 1").as_deref(),
            Some("host \"x\" is not a table")
        );
    }
}
