//! The check's sandbox and container as CRI configs (pure): named so an operator recognises
//! them in `crictl pods`, labelled so a sweep finds them, and kept out of the kubelet's way.

use std::collections::HashMap;

use super::spec::{
    CHECK_HANDLER_LABEL, CHECK_ID_LABEL, CHECK_LABEL, CHECK_NAMESPACE, ContainerCheck,
};
use crate::node::cri::containers::{
    ContainerConfig, ContainerMetadata, ImageSpec, LinuxContainerConfig,
    LinuxContainerSecurityContext,
};
use crate::node::cri::proto::{
    LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NAMESPACE_CONTAINER, NAMESPACE_NODE,
    NAMESPACE_POD, NamespaceOption, PodSandboxConfig, PodSandboxMetadata,
};

/// The check container's log file, in its sandbox's log directory.
pub const CHECK_LOG: &str = "check.log";
/// The cgroup parent of check sandboxes: outside the kubelet's `kubepods`, and a valid
/// parent for both cgroup drivers (the systemd driver needs a `.slice`; an empty parent is
/// refused there).
pub const CHECK_CGROUP_PARENT: &str = "system.slice";

/// A fresh id for one check of `handler`: the handler and the time in nanoseconds (hex), so
/// that no two checks share a sandbox name.
pub fn sandbox_id_for(handler: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{handler}-{nanos:x}")
}

/// The labels of a check sandbox and its container.
fn labels(handler: &str, id: &str) -> HashMap<String, String> {
    HashMap::from([
        (CHECK_LABEL.to_string(), "true".to_string()),
        (CHECK_ID_LABEL.to_string(), id.to_string()),
        (CHECK_HANDLER_LABEL.to_string(), handler.to_string()),
        (
            "app.kubernetes.io/managed-by".to_string(),
            "shim-agent".to_string(),
        ),
    ])
}

/// The sandbox of check `id` of `handler`, its container logs under `log_directory` (a node
/// path): `shim-agent-check-<handler>` in [`CHECK_NAMESPACE`], on the node's network (no CNI,
/// no pod IP), with the kubelet's default namespaces otherwise (its own pid namespace).
pub fn check_sandbox_config(handler: &str, id: &str, log_directory: &str) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: format!("shim-agent-check-{handler}"),
            uid: id.to_string(),
            namespace: CHECK_NAMESPACE.to_string(),
            attempt: 0,
        }),
        hostname: String::new(),
        log_directory: log_directory.to_string(),
        labels: labels(handler, id),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: CHECK_CGROUP_PARENT.to_string(),
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces()),
            }),
        }),
    }
}

/// The check container of `c` in sandbox `sandbox_id`, logging to [`CHECK_LOG`].
pub fn container_config(c: &ContainerCheck, sandbox_id: &str) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: "check".to_string(),
            attempt: 0,
        }),
        image: Some(ImageSpec {
            image: c.image.clone(),
        }),
        command: c.command.clone(),
        args: c.args.clone(),
        labels: HashMap::from([(CHECK_ID_LABEL.to_string(), sandbox_id.to_string())]),
        log_path: CHECK_LOG.to_string(),
        linux: Some(LinuxContainerConfig {
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(namespaces()),
            }),
        }),
    }
}

/// The node's network, a pid namespace of its own (the kubelet's default for a pod that does
/// not share its process namespace), the pod's IPC.
fn namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NAMESPACE_NODE,
        pid: NAMESPACE_CONTAINER,
        ipc: NAMESPACE_POD,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_check_sandbox_is_named_for_its_handler_and_labelled_for_the_sweep() {
        let c = check_sandbox_config("wasm", "wasm-17", "/var/lib/shim-agent/checks/wasm-17");
        let m = c.metadata.clone().unwrap();
        assert_eq!(
            (m.name.as_str(), m.namespace.as_str(), m.uid.as_str()),
            ("shim-agent-check-wasm", "shim-agent-check", "wasm-17")
        );
        assert_eq!(c.labels[CHECK_LABEL], "true");
        assert_eq!(c.labels[CHECK_ID_LABEL], "wasm-17");
        assert_eq!(c.labels[CHECK_HANDLER_LABEL], "wasm");
        let linux = c.linux.unwrap();
        assert_eq!(linux.cgroup_parent, "system.slice");
        let ns = linux.security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, NAMESPACE_NODE, "no CNI needed");
        assert!(!c.labels.keys().any(|k| k.starts_with("io.kubernetes")));
    }

    #[test]
    fn two_checks_of_one_handler_never_share_an_id() {
        let a = sandbox_id_for("spin");
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert_ne!(a, sandbox_id_for("spin"));
        assert!(a.starts_with("spin-"));
    }
}
