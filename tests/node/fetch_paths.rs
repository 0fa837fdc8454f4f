//! The packaged agent under the node's systemd fetching as a node in a locked-down network
//! does: a Shim whose `oci` artifact names a registry that does not resolve, pulled instead
//! through the mirror containerd's registry hosts name (Debian's docker-registry, TLS from a
//! private CA, htpasswd), with the credentials the kubelet's credential-provider plugin gives
//! (a script the test writes), through the HTTP proxy of the unit's drop-in (Debian's
//! tinyproxy, with a login). The proxy's log shows the tunnel to the mirror; the journal shows
//! no secret.
//!
//! Skipped with a reason without a node env sharing the host's network, docker-registry or
//! tinyproxy, unless required (CI).

use crate::support::kube::eventually;
use crate::support::node_env::agent::write;
use crate::support::node_env::{self, NodeEnv, node_env};
use crate::support::proxy::{self, tinyproxy};
use crate::support::registry::{self, registry_with_login};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, tar_gz};

const TEST: &str = "node_fetch_paths";
const UPSTREAM: &str = "upstream.invalid:5000";
const CERTS_D: &str = "etc/containerd/certs.d";
const PLUGINS: &str = "usr/local/lib/shim-agent-test-credential-providers";
const PLUGIN: &str = "np-credentials";
/// Where Debian's ca-certificates puts the bundle (the node image has none).
const CA_BUNDLE: &str = "etc/ssl/certs/ca-certificates.crt";

/// Puts the node back, whatever happens.
struct Restore<'a>(&'a NodeEnv);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let env = self.0;
        env.remove_agent();
        let _ = std::fs::remove_dir_all(env.root.join(CERTS_D));
        let _ = std::fs::remove_dir_all(env.root.join(PLUGINS));
        let _ = std::fs::remove_file(env.root.join(CA_BUNDLE));
        // (only when empty: the image had none)
        let _ = std::fs::remove_dir(env.root.join("etc/ssl/certs"));
        let _ = std::fs::remove_dir(env.root.join("etc/ssl"));
        let _ = std::fs::remove_file(env.root.join("etc/kubernetes/np-credential-providers.yaml"));
        env.restore_config();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_pulls_through_a_mirror_with_a_plugins_credentials_via_its_proxy() {
    let Some(env) = node_env(TEST).await else {
        return;
    };
    if !env.shares_host_network() {
        node_env::skip(
            TEST,
            "the node env does not share the host's network (INFRA_NETWORK=host)",
        );
        return;
    }
    let Some(reg) = registry_with_login(TEST) else {
        return;
    };
    let Some(proxy) = tinyproxy(TEST) else { return };
    let _restore = Restore(&env);
    env.remove_agent();
    env.ensure_images();

    // the artifact: the node's own runc shim under another name, in the private registry
    let shim = std::fs::read(env.root.join("usr/bin/containerd-shim-runc-v2")).unwrap();
    let tgz = tar_gz(&[
        Entry::Dir("bin/"),
        Entry::File("bin/containerd-shim-np-v2", shim, 0o755),
    ]);
    let login =
        oci_client::secrets::RegistryAuth::Basic(registry::USER.into(), registry::PASSWORD.into());
    let manifest = reg.push_as("shims/np", "v1", &tgz, &login).await;

    // containerd's registry hosts: the upstream's mirror, with the private CA
    let config = std::fs::read_to_string(env.config_file()).unwrap();
    let mut doc: toml_edit::DocumentMut = config.parse().unwrap();
    let cri = if env.containerd.config_version >= 3 {
        "io.containerd.cri.v1.images"
    } else {
        "io.containerd.grpc.v1.cri"
    };
    doc["plugins"][cri]["registry"]["config_path"] = toml_edit::value("/etc/containerd/certs.d");
    std::fs::write(env.config_file(), doc.to_string()).unwrap();
    // the node trusts the private CA system-wide (an OCI client cannot start without a
    // system bundle; containerd's hosts.toml names it for the mirror too)
    write(
        &env.root.join(CA_BUNDLE),
        &std::fs::read(reg.ca()).unwrap(),
        0o644,
    );
    let hosts = env.root.join(CERTS_D).join(UPSTREAM);
    write(
        &hosts.join("ca.pem"),
        &std::fs::read(reg.ca()).unwrap(),
        0o644,
    );
    write(
        &hosts.join("hosts.toml"),
        format!("server = \"https://{UPSTREAM}\"\n\n[host.\"https://{}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"ca.pem\"\n", reg.host()).as_bytes(),
        0o644,
    );

    // the kubelet's credential provider, and a plugin that answers for the mirror
    let answer = format!(
        "{{\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"kind\":\"CredentialProviderResponse\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"1h\",\"auth\":{{\"{}\":{{\"username\":\"{}\",\"password\":\"{}\"}}}}}}",
        reg.host(),
        registry::USER,
        registry::PASSWORD
    );
    write(
        &env.root.join(PLUGINS).join(PLUGIN),
        format!("#!/bin/sh\ncat >/dev/null\necho '{answer}'\n").as_bytes(),
        0o755,
    );
    write(
        &env.root.join("etc/kubernetes/np-credential-providers.yaml"),
        format!("apiVersion: kubelet.config.k8s.io/v1\nkind: CredentialProviderConfig\nproviders:\n- name: {PLUGIN}\n  matchImages: [\"{}\"]\n  apiVersion: credentialprovider.kubelet.k8s.io/v1\n", reg.host()).as_bytes(),
        0o644,
    );
    let agent_config = format!(
        "[fetch]\ncredential-provider-config = \"/etc/kubernetes/np-credential-providers.yaml\"\ncredential-provider-bin-dir = \"/{PLUGINS}\"\n"
    );
    // the proxy, as a node owner's drop-in gives it
    let dropin = format!(
        "[Service]\nEnvironment=\"HTTPS_PROXY={}\"\n",
        proxy.url_with(proxy::PASSWORD)
    );
    let agent = env.install_agent(&agent_config, Some(&dropin)).await;
    write(
        &env.root.join("etc/shim-agent/shims.d/np.yaml"),
        ShimBuilder::new("np")
            .oci(&format!("{UPSTREAM}/shims/np@{manifest}"))
            .yaml()
            .as_bytes(),
        0o644,
    );

    agent.start();
    let status = eventually(120, "Shim np installed", || async {
        let s = env.exec_ok(&["shim-agent", "status"]);
        s.lines()
            .any(|l| l.starts_with("np ") && l.contains(" installed "))
            .then_some(s)
    })
    .await;
    eprintln!("{status}");
    let tunnel = format!("CONNECT {} HTTP/1.1", reg.host());
    assert!(
        proxy.requests().contains(&tunnel),
        "the proxy's log: {:?}",
        proxy.requests()
    );
    let journal = agent.journal();
    assert!(
        !journal.contains(registry::PASSWORD) && !journal.contains(proxy::PASSWORD),
        "a secret in the journal:\n{journal}"
    );
    assert_eq!(agent.show("NRestarts"), "0");
}
