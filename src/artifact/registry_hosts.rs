//! containerd's registry hosts (`config_path`, `<dir>/<registry>/hosts.toml`, else
//! `<dir>/_default/hosts.toml`), read as containerd reads them, for `oci` artifacts: the
//! mirrors in file order with the capabilities they declare, then the upstream (`server`, else
//! the registry itself), each with its CA files and `skip_verify`. The parser is pure; [`load`]
//! reads the files at each fetch, so a change in the directory needs no restart. The digest
//! pin decides what is accepted, whichever host serves it.

use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item};

/// One host to pull from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `host[:port]` as a registry name.
    pub registry: String,
    /// Plain HTTP (an `http://` host).
    pub http: bool,
    /// CA files to trust for it (absolute, or relative to its hosts.toml's directory).
    pub ca: Vec<PathBuf>,
    /// `skip_verify`: its certificate is not verified (reported as insecure).
    pub skip_verify: bool,
    /// A mirror from hosts.toml, not the upstream.
    pub mirror: bool,
    /// `https://host[:port]`, for messages.
    pub shown: String,
}

/// A parsed `hosts.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostsFile {
    /// `server`: the upstream, when it is not the registry itself.
    pub server: Option<Endpoint>,
    /// `[host."…"]` tables in file order, with whether each may `pull`.
    pub hosts: Vec<(Endpoint, bool)>,
}

/// `scheme://host[:port][/path]` as an endpoint; `None` for what is not one.
fn endpoint(url: &str, mirror: bool) -> Option<Endpoint> {
    let (scheme, rest) = url.split_once("://")?;
    let http = match scheme {
        "http" => true,
        "https" => false,
        _ => return None,
    };
    let host = rest
        .split('/')
        .next()
        .filter(|h| !h.is_empty() && !h.contains('@'))?;
    Some(Endpoint {
        registry: host.to_string(),
        http,
        ca: vec![],
        skip_verify: false,
        mirror,
        shown: crate::text::clip(&format!("{scheme}://{host}"), 256),
    })
}

/// The CA files of a host table (`ca = "path"` or a list), relative to `dir`.
fn ca_files(t: &dyn toml_edit::TableLike, dir: &Path) -> Vec<PathBuf> {
    let list: Vec<String> = match t.get("ca") {
        Some(i) if i.is_str() => i.as_str().map(str::to_string).into_iter().collect(),
        Some(i) => i
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default(),
        None => vec![],
    };
    list.into_iter().map(|p| dir.join(p)).collect()
}

/// Parse a `hosts.toml` (pure); `dir` is its directory (CA paths are relative to it). `Err`:
/// why containerd could not use it.
pub fn parse(text: &str, dir: &Path) -> Result<HostsFile, String> {
    let doc: DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| {
        format!("not valid TOML: {}", crate::text::clip(&e.to_string(), 512))
    })?;
    let server = match doc.get("server").map(|s| s.as_str()) {
        None => None,
        Some(Some(s)) => Some(endpoint(s, false).ok_or_else(|| {
            format!(
                "server {:?} is not an http(s) URL",
                crate::text::clip(s, 128)
            )
        })?),
        Some(None) => return Err("`server` is not a string".into()),
    };
    let mut hosts = vec![];
    match doc.get("host") {
        None => {}
        Some(h) => {
            let table = h
                .as_table_like()
                .ok_or("`host` is not a table of mirrors")?;
            for (url, item) in table.iter() {
                let t = item.as_table_like().ok_or_else(|| {
                    format!("host {:?} is not a table", crate::text::clip(url, 128))
                })?;
                let mut e = endpoint(url, true).ok_or_else(|| {
                    format!(
                        "host {:?} is not an http(s) URL",
                        crate::text::clip(url, 128)
                    )
                })?;
                e.ca = ca_files(t, dir);
                e.skip_verify = t
                    .get("skip_verify")
                    .and_then(Item::as_bool)
                    .unwrap_or(false);
                // containerd's default: every capability
                let pull = match t.get("capabilities").and_then(Item::as_array) {
                    Some(caps) => caps.iter().any(|c| c.as_str() == Some("pull")),
                    None => true,
                };
                // a mirror whose API root is not /v2 cannot be reached through oci-client
                let override_path = t
                    .get("override_path")
                    .and_then(Item::as_bool)
                    .unwrap_or(false);
                hosts.push((e, pull && !override_path));
            }
        }
    }
    Ok(HostsFile { server, hosts })
}

/// The hosts to try for `registry`, in order (pure): the mirrors that may pull, then the
/// upstream. Without a hosts file: the registry itself (`http` as the Shim asks).
pub fn endpoints(registry: &str, file: Option<&HostsFile>, insecure_http: bool) -> Vec<Endpoint> {
    let own = || {
        let scheme = if insecure_http { "http" } else { "https" };
        endpoint(&format!("{scheme}://{registry}"), false)
    };
    let Some(file) = file else {
        return own().into_iter().collect();
    };
    let mut out: Vec<Endpoint> = file
        .hosts
        .iter()
        .filter(|(_, pull)| *pull)
        .map(|(e, _)| e.clone())
        .collect();
    out.extend(file.server.clone().or_else(own));
    out
}

/// The hosts file for `registry` in the first of `dirs` that has one (its own, else
/// `_default`), parsed; `Ok(None)`: none. Read at each call.
pub fn load(dirs: &[PathBuf], registry: &str) -> Result<Option<HostsFile>, String> {
    for dir in dirs {
        for name in [registry, "_default"] {
            if name.contains('/') || name == ".." {
                continue;
            }
            let host_dir = dir.join(name);
            let path = host_dir.join("hosts.toml");
            match std::fs::read(&path) {
                Ok(bytes) => {
                    let text = String::from_utf8(bytes)
                        .map_err(|_| format!("{}: not UTF-8", path.display()))?;
                    return parse(&text, &host_dir)
                        .map(Some)
                        .map_err(|e| format!("{}: {e}", path.display()));
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("{}: {e}", path.display())),
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIRRORS: &str = r#"server = "https://upstream.example:5000"

[host."http://down.example:5001"]
  capabilities = ["pull", "resolve"]

[host."https://push-only.example"]
  capabilities = ["push"]

[host."https://mirror.example:5443"]
  capabilities = ["pull"]
  ca = "ca.pem"
  skip_verify = true

[host."https://path.example/v2/x"]
  override_path = true
"#;

    #[test]
    fn mirrors_that_may_pull_come_first_in_file_order_then_the_upstream() {
        let f = parse(MIRRORS, Path::new("/etc/containerd/certs.d/r.example")).unwrap();
        let e = endpoints("r.example", Some(&f), false);
        let names: Vec<&str> = e.iter().map(|e| e.shown.as_str()).collect();
        assert_eq!(
            names,
            [
                "http://down.example:5001",
                "https://mirror.example:5443",
                "https://upstream.example:5000"
            ]
        );
        assert!(e[0].http && e[0].mirror && !e[2].mirror);
        assert_eq!(
            e[1].ca,
            vec![PathBuf::from("/etc/containerd/certs.d/r.example/ca.pem")]
        );
        assert!(e[1].skip_verify && !e[0].skip_verify);
        assert_eq!(e[1].registry, "mirror.example:5443");
    }

    #[test]
    fn without_a_server_the_upstream_is_the_registry_and_without_a_file_only_it() {
        let f = parse("[host.\"https://m.example\"]\n", Path::new("/d")).unwrap();
        let e = endpoints("r.example:5000", Some(&f), false);
        assert_eq!(
            e.iter().map(|e| e.shown.as_str()).collect::<Vec<_>>(),
            ["https://m.example", "https://r.example:5000"]
        );
        let e = endpoints("r.example", None, true);
        assert_eq!(e.len(), 1);
        assert!(e[0].http && !e[0].mirror);
    }

    #[test]
    fn files_containerd_could_not_use_are_refused_saying_why() {
        for (text, why) in [
            ("[host", "not valid TOML"),
            ("host = 1", "`host` is not a table of mirrors"),
            ("[host]\nx = 1", "host \"x\" is not a table"),
            (
                "server = \"ftp://x\"",
                "server \"ftp://x\" is not an http(s) URL",
            ),
            ("server = 3", "`server` is not a string"),
            (
                "[host.\"mirror.example\"]",
                "host \"mirror.example\" is not an http(s) URL",
            ),
            (
                "[host.\"https://u:p@m\"]",
                "host \"https://u:p@m\" is not an http(s) URL",
            ),
        ] {
            let e = parse(text, Path::new("/d")).unwrap_err();
            assert!(e.starts_with(why), "{text}: {e}");
        }
    }

    #[test]
    fn the_registrys_own_file_wins_over_default_and_the_first_directory_over_the_next() {
        let d = tempfile::tempdir().unwrap();
        let (a, b) = (d.path().join("a"), d.path().join("b"));
        for (dir, name, server) in [
            (&a, "_default", "https://a-default"),
            (&b, "r.example", "https://b-own"),
        ] {
            std::fs::create_dir_all(dir.join(name)).unwrap();
            std::fs::write(
                dir.join(name).join("hosts.toml"),
                format!("server = \"{server}\"\n"),
            )
            .unwrap();
        }
        let f = load(&[a.clone(), b.clone()], "r.example").unwrap().unwrap();
        assert_eq!(f.server.unwrap().shown, "https://a-default");
        let f = load(&[b, a], "r.example").unwrap().unwrap();
        assert_eq!(f.server.unwrap().shown, "https://b-own");
        assert_eq!(load(&[d.path().join("none")], "r.example").unwrap(), None);
        assert_eq!(load(&[d.path().to_path_buf()], "../x").unwrap(), None);
    }
}
