//! The agent's own configuration: `/etc/shim-agent/config.toml` plus
//! `/etc/shim-agent/config.d/*.toml` drop-ins.
//!
//! Layering: the main file first (absent = all defaults, unless its path was given
//! explicitly with `--config`), then every `config.d/*.toml` beside it in lexical order;
//! a later file overrides the keys it sets, tables merge key by key. Every setting is
//! optional. Each file is checked on its own, so an unknown key or a wrong type is reported
//! with the file that holds it; the merged result is then validated once more.

use std::path::{Path, PathBuf};

use thiserror::Error;

mod sections;
mod signatures;
mod validate;

pub use sections::{
    CheckSettings, ContainerdSettings, FetchSettings, KubernetesSettings, LogSettings,
    MetricsSettings, NodeSettings, PathSettings, Settings,
};
pub use signatures::{IdentitySetting, SignatureSettings};

/// Default location of the main file.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/shim-agent/config.toml";

/// What can go wrong loading the settings.
#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: PathBuf, message: String },
}

impl SettingsError {
    /// Stable machine-readable reason.
    pub fn reason(&self) -> &'static str {
        match self {
            SettingsError::Read { .. } => "SettingsUnreadable",
            SettingsError::Invalid { .. } => "SettingsInvalid",
        }
    }
}

/// The files that make up the settings, in the order they apply.
pub fn config_files(main: &Path) -> Result<Vec<PathBuf>, SettingsError> {
    let mut files = Vec::new();
    if main.exists() {
        files.push(main.to_path_buf());
    }
    let dir = main.parent().unwrap_or(Path::new("/")).join("config.d");
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            let mut dropins: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
                .collect();
            dropins.sort();
            files.extend(dropins);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(SettingsError::Read {
                path: dir,
                source: e,
            });
        }
    }
    Ok(files)
}

/// Load the settings. `explicit` is true when the path came from `--config`: then the main
/// file must exist.
pub fn load(main: &Path, explicit: bool) -> Result<Settings, SettingsError> {
    if explicit && !main.exists() {
        return Err(SettingsError::Read {
            path: main.to_path_buf(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        });
    }
    let mut merged = toml_edit::DocumentMut::new();
    for path in config_files(main)? {
        let text = std::fs::read_to_string(&path).map_err(|e| SettingsError::Read {
            path: path.clone(),
            source: e,
        })?;
        let doc: toml_edit::DocumentMut =
            text.parse()
                .map_err(|e: toml_edit::TomlError| SettingsError::Invalid {
                    path: path.clone(),
                    message: one_line(&e.to_string()),
                })?;
        // Check this file alone, so the error names it.
        toml_edit::de::from_document::<Settings>(doc.clone()).map_err(|e| {
            SettingsError::Invalid {
                path: path.clone(),
                message: one_line(&e.to_string()),
            }
        })?;
        merge_tables(merged.as_table_mut(), doc.as_table());
    }
    let settings: Settings =
        toml_edit::de::from_document(merged).map_err(|e| SettingsError::Invalid {
            path: main.to_path_buf(),
            message: one_line(&e.to_string()),
        })?;
    settings
        .validate()
        .map_err(|message| SettingsError::Invalid {
            path: main.to_path_buf(),
            message,
        })?;
    Ok(settings)
}

/// toml_edit's messages span several lines (a source excerpt); keep them readable in one log line.
fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

fn merge_tables(into: &mut toml_edit::Table, from: &toml_edit::Table) {
    for (key, item) in from.iter() {
        match (into.get_mut(key), item.as_table_like()) {
            (Some(existing), Some(from_table)) if existing.is_table_like() => {
                let mut t = toml_edit::Table::new();
                for (k, v) in from_table.iter() {
                    t.insert(k, v.clone());
                }
                if let Some(existing_table) = existing.as_table_mut() {
                    merge_tables(existing_table, &t);
                } else if let Some(inline) = existing.as_inline_table_mut() {
                    let mut as_table = inline.clone().into_table();
                    merge_tables(&mut as_table, &t);
                    *existing = toml_edit::Item::Table(as_table);
                }
            }
            _ => {
                into.insert(key, item.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The commented config the packages ship says "these are the defaults": with its `#`
    /// taken off every key and table line, it is every setting, at its default.
    #[test]
    fn the_shipped_config_names_every_setting_at_its_default() {
        let shipped = include_str!("../../packaging/config.toml");
        let uncommented: String = shipped
            .lines()
            .filter_map(|l| l.strip_prefix('#'))
            .filter(|l| {
                l.starts_with('[') || l.split_once(" = ").is_some_and(|(k, _)| !k.contains(' '))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let parsed: serde_json::Value = toml_edit::de::from_str(&uncommented).unwrap();
        let defaults = serde_json::to_value(Settings::default()).unwrap();
        assert_eq!(parsed, defaults, "packaging/config.toml:\n{uncommented}");
    }

    fn write(dir: &Path, rel: &str, text: &str) -> PathBuf {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn no_files_gives_the_defaults() {
        let d = tempfile::tempdir().unwrap();
        let s = load(&d.path().join("config.toml"), false).unwrap();
        assert_eq!(s, Settings::default());
        assert_eq!(s.paths.state_dir, "/var/lib/shim-agent");
        assert!(!s.fetch.allow_unverified);
    }

    #[test]
    fn an_explicit_missing_file_is_an_error() {
        let d = tempfile::tempdir().unwrap();
        let e = load(&d.path().join("nope.toml"), true).unwrap_err();
        assert!(e.to_string().contains("nope.toml"), "{e}");
    }

    #[test]
    fn dropins_override_the_main_file_in_lexical_order() {
        let d = tempfile::tempdir().unwrap();
        let main = write(
            d.path(),
            "config.toml",
            "[containerd]\nunit = \"a.service\"\nverify-timeout-secs = 5\n[log]\nlevel = \"debug\"\n",
        );
        write(
            d.path(),
            "config.d/20-b.toml",
            "[containerd]\nunit = \"c.service\"\n",
        );
        write(
            d.path(),
            "config.d/10-a.toml",
            "[containerd]\nunit = \"b.service\"\nsocket = \"/x.sock\"\n",
        );
        write(d.path(), "config.d/ignored.txt", "garbage");
        let s = load(&main, true).unwrap();
        assert_eq!(s.containerd.unit, "c.service");
        assert_eq!(s.containerd.socket, "/x.sock");
        assert_eq!(s.containerd.verify_timeout_secs, 5);
        assert_eq!(s.log.level, "debug");
    }

    #[test]
    fn an_unknown_key_is_rejected_naming_the_file_and_key() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "");
        write(
            d.path(),
            "config.d/50-typo.toml",
            "[fetch]\nallow-unverifed = true\n",
        );
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("50-typo.toml"), "{e}");
        assert!(e.contains("allow-unverifed"), "{e}");
    }

    #[test]
    fn an_unknown_section_and_a_wrong_type_are_rejected() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "[contanerd]\nunit = \"x\"\n");
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("contanerd") && e.contains("config.toml"), "{e}");
        std::fs::write(&main, "[fetch]\nattempts = \"many\"\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("attempts") || e.contains("invalid type"), "{e}");
    }

    #[test]
    fn semantic_errors_are_named() {
        let d = tempfile::tempdir().unwrap();
        let main = write(
            d.path(),
            "config.toml",
            "[containerd]\nprofile = \"docker\"\n",
        );
        let e = load(&main, false).unwrap_err().to_string();
        assert!(
            e.contains("containerd.profile") && e.contains("docker"),
            "{e}"
        );
        std::fs::write(&main, "[paths]\nstate-dir = \"var/lib\"\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("paths.state-dir"), "{e}");
        std::fs::write(&main, "[fetch]\nattempts = 0\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("fetch.attempts"), "{e}");
        std::fs::write(
            &main,
            "[fetch]\ncredential-provider-config = \"/etc/kubernetes/cp.yaml\"\n",
        )
        .unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("credential-provider-bin-dir go together"), "{e}");
        std::fs::write(&main, "[fetch]\ncredential-provider-timeout-secs = 0\n").unwrap();
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("fetch.credential-provider-timeout-secs"), "{e}");
    }

    #[test]
    fn a_toml_syntax_error_names_file_line_and_column() {
        let d = tempfile::tempdir().unwrap();
        let main = write(d.path(), "config.toml", "[log]\nlevel = \n");
        let e = load(&main, false).unwrap_err().to_string();
        assert!(e.contains("config.toml") && e.contains("line 2"), "{e}");
    }
}
