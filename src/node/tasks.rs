//! The tasks containerd runs, as it records them on disk: each task's bundle,
//! `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/`, holds `shim-binary-path`, the
//! absolute path of the shim binary the task was started through (containerd ≥ 1.6). After a
//! restart containerd reloads every task through that path; a missing file drops the task
//! ("failed to resolve runtime path: invalid custom binary path"). Installed shim versions
//! are therefore kept while a task names a file inside them (`txn::retain`).
//!
//! Reading the disk rather than the task API: it needs no connection and works while
//! containerd is down or restarting, in every namespace at once, and costs one `read_dir` per
//! namespace plus one small read per task.
//!
//! [`scan`] does the I/O; [`parse_shim_path`] reads one bundle's file.

use std::path::{Path, PathBuf};

use crate::hostroot::HostRoot;

/// containerd's directory of v2 task bundles, under its state directory.
pub const TASK_DIR: &str = "io.containerd.runtime.v2.task";
/// The bundle file naming the shim binary the task was started through.
pub const SHIM_PATH_FILE: &str = "shim-binary-path";
/// The bundle file of a pod's container on containerd 2.x: the id of its pod sandbox, whose
/// shim runs it (the container's bundle names no shim of its own).
pub const SANDBOX_FILE: &str = "sandbox";
/// containerd's default state directory.
pub const DEFAULT_STATE_DIR: &str = "/run/containerd";

/// One task containerd records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Task {
    pub namespace: String,
    pub id: String,
    /// Host path of the shim binary it was started through (for a pod's container on
    /// containerd 2.x, its sandbox's); `None` when the bundle records none (a bundle being
    /// created or deleted right now).
    pub shim_path: Option<String>,
}

impl Task {
    /// `namespace/id`, as `ctr -n <ns> tasks ls` names it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.namespace, self.id)
    }
}

/// What a scan found; directories that could not be read are listed in `errors` (a scan that
/// cannot see every task must not be taken to mean "no task").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskScan {
    pub tasks: Vec<Task>,
    pub errors: Vec<String>,
}

/// The state directories to look in (host paths): containerd's own `state` setting when
/// `config_text` (its main config) sets one, the socket's directory and `containerd/` under
/// it (k3s and rke2 keep both in `/run/k3s/containerd`, k0s and microk8s put the state one
/// level down), and the default.
pub fn state_dirs(socket: &str, config_text: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(state) = config_text
        .and_then(|t| t.parse::<toml_edit::DocumentMut>().ok())
        .and_then(|d| d.get("state").and_then(|v| v.as_str()).map(str::to_string))
        && state.starts_with('/')
    {
        out.push(state);
    }
    if let Some(dir) = Path::new(socket).parent() {
        out.push(dir.display().to_string());
        out.push(dir.join("containerd").display().to_string());
    }
    out.push(DEFAULT_STATE_DIR.to_string());
    let mut seen = std::collections::BTreeSet::new();
    out.retain(|d| seen.insert(d.clone()));
    out
}

/// Every task recorded under any of `state_dirs` (host paths, resolved under `root`), and
/// under `reached` (state directories as this process reaches them, e.g. through
/// `/proc/<pid>/root` into a container's mount namespace).
pub fn scan(root: &HostRoot, state_dirs: &[String], reached: &[PathBuf]) -> TaskScan {
    let mut out = TaskScan::default();
    let dirs = state_dirs
        .iter()
        .filter_map(|s| root.resolve(Path::new(s).join(TASK_DIR)).ok())
        .chain(reached.iter().map(|d| d.join(TASK_DIR)));
    let mut seen = std::collections::BTreeSet::new();
    let mut sandboxes: Vec<(usize, String)> = Vec::new();
    for dir in dirs {
        if !seen.insert(dir.clone()) {
            continue;
        }
        for ns in read_dir_names(&dir, &mut out.errors) {
            let ns_dir = dir.join(&ns);
            for id in read_dir_names(&ns_dir, &mut out.errors) {
                let bundle = ns_dir.join(&id);
                let shim_path = read_small(&bundle.join(SHIM_PATH_FILE), &mut out.errors);
                let sandbox = match shim_path {
                    Some(_) => None,
                    None => read_small(&bundle.join(SANDBOX_FILE), &mut out.errors),
                };
                let namespace = ns.clone();
                out.tasks.push(Task {
                    namespace,
                    id,
                    shim_path,
                });
                if let Some(sb) = sandbox {
                    sandboxes.push((out.tasks.len() - 1, sb));
                }
            }
        }
    }
    // a pod's container runs in its sandbox's shim
    let shims: std::collections::HashMap<(String, String), String> = out
        .tasks
        .iter()
        .filter_map(|t| Some(((t.namespace.clone(), t.id.clone()), t.shim_path.clone()?)))
        .collect();
    for (i, sandbox) in sandboxes {
        if let Some(t) = out.tasks.get_mut(i) {
            t.shim_path = shims.get(&(t.namespace.clone(), sandbox)).cloned();
        }
    }
    out
}

/// A bundle file's text, trimmed (`None`: missing or empty; a read error is listed).
fn read_small(path: &Path, errors: &mut Vec<String>) -> Option<String> {
    match std::fs::read(path) {
        Ok(bytes) => parse_shim_path(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            errors.push(format!("{}: {e}", path.display()));
            None
        }
    }
}

/// The directories in `dir` by name; an unreadable `dir` is listed in `errors`.
fn read_dir_names(dir: &Path, errors: &mut Vec<String>) -> Vec<String> {
    crate::fsutil::subdir_names(dir).unwrap_or_else(|e| {
        errors.push(format!("{}: {e}", dir.display()));
        Vec::new()
    })
}

/// The shim path recorded in a bundle's `shim-binary-path` (trimmed; empty: none).
pub fn parse_shim_path(bytes: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(bytes);
    let path = text.trim();
    (!path.is_empty()).then(|| path.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_dirs_follow_the_socket_and_the_config() {
        assert_eq!(
            state_dirs("/run/containerd/containerd.sock", None),
            vec!["/run/containerd", "/run/containerd/containerd"]
        );
        assert_eq!(
            state_dirs(
                "/run/k0s/containerd.sock",
                Some("version = 2\nstate = \"/run/custom\"\n")
            ),
            vec![
                "/run/custom",
                "/run/k0s",
                "/run/k0s/containerd",
                "/run/containerd"
            ]
        );
        // a config that does not parse, or a relative state, adds nothing
        assert_eq!(
            state_dirs("/run/containerd/containerd.sock", Some("state = [")).len(),
            2
        );
    }

    #[test]
    fn every_namespace_and_task_is_found_with_its_shim_path() {
        let d = tempfile::tempdir().unwrap();
        let root = HostRoot::new(d.path()).unwrap();
        let base = d.path().join("run/containerd").join(TASK_DIR);
        for (ns, id, path) in [
            (
                "k8s.io",
                "abc",
                Some("/opt/shim-agent/shims/w/aa/containerd-shim-w-v1\n"),
            ),
            ("default", "t1", Some("/usr/bin/containerd-shim-runc-v2")),
            ("k8s.io", "new", None),
            ("k8s.io", "ctr-in-abc", None),
        ] {
            let b = base.join(ns).join(id);
            std::fs::create_dir_all(&b).unwrap();
            if let Some(p) = path {
                std::fs::write(b.join(SHIM_PATH_FILE), p).unwrap();
            }
        }
        // containerd 2.x: a pod's container names its sandbox, not a shim
        std::fs::write(base.join("k8s.io/ctr-in-abc").join(SANDBOX_FILE), "abc\n").unwrap();
        let found = scan(&root, &["/run/containerd".to_string()], &[]);
        assert!(found.errors.is_empty(), "{found:?}");
        let names: Vec<(String, Option<String>)> = found
            .tasks
            .iter()
            .map(|t| (t.name(), t.shim_path.clone()))
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    "default/t1".into(),
                    Some("/usr/bin/containerd-shim-runc-v2".into())
                ),
                (
                    "k8s.io/abc".into(),
                    Some("/opt/shim-agent/shims/w/aa/containerd-shim-w-v1".into())
                ),
                (
                    "k8s.io/ctr-in-abc".into(),
                    Some("/opt/shim-agent/shims/w/aa/containerd-shim-w-v1".into())
                ),
                ("k8s.io/new".into(), None),
            ]
        );
        // no task directory at all: no tasks, no error
        let none = scan(&root, &["/run/elsewhere".to_string()], &[]);
        assert_eq!(none, TaskScan::default());
        // the same directory reached another way is read once
        let reached = scan(
            &root,
            &["/run/containerd".to_string()],
            &[d.path().join("run/containerd")],
        );
        assert_eq!(reached.tasks.len(), 4);
        assert_eq!(none, TaskScan::default());
    }
}
