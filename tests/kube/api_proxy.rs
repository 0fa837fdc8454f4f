//! The connection to the API server through an HTTP proxy, as client-go makes it: the
//! kubeconfig's `proxy-url` (with a login) tunnels the TLS connection with CONNECT through a
//! real proxy (Debian's tinyproxy), whose log shows it; a proxy that refuses the login fails
//! the connection without the password in the error.

use shim_agent::cluster::connect::{Source, client};

use crate::support::kube::kube_env;
use crate::support::proxy::{self, tinyproxy};

const TEST: &str = "api_proxy";

/// The node identity's kubeconfig with `proxy-url` on its cluster, written beside it.
fn with_proxy_url(
    kubeconfig: &std::path::Path,
    proxy_url: &str,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let mut kc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(kubeconfig).unwrap()).unwrap();
    kc["clusters"][0]["cluster"]["proxy-url"] = proxy_url.into();
    let out = dir.join("proxied.kubeconfig");
    std::fs::write(&out, serde_yaml::to_string(&kc).unwrap()).unwrap();
    out
}

#[tokio::test]
async fn the_api_server_is_reached_through_the_kubeconfigs_proxy() {
    let Some(kube) = kube_env() else { return };
    let Some(proxy) = tinyproxy(TEST) else { return };
    let d = tempfile::tempdir().unwrap();
    let identity = kube.node_identity("api-proxy-node");

    let kc = with_proxy_url(&identity, &proxy.url_with(proxy::PASSWORD), d.path());
    let c = client(&Source::Kubeconfig(kc)).await.unwrap();
    let v = c
        .apiserver_version()
        .await
        .expect("/version through the proxy");
    assert!(!v.git_version.is_empty());
    let kc: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(&identity).unwrap()).unwrap();
    let server = kc["clusters"][0]["cluster"]["server"]
        .as_str()
        .unwrap()
        .to_string();
    let hostport = server.trim_start_matches("https://").trim_end_matches('/');
    assert!(
        proxy
            .requests()
            .iter()
            .any(|r| r == &format!("CONNECT {hostport} HTTP/1.1")),
        "the proxy's log: {:?}",
        proxy.requests()
    );

    let kc = with_proxy_url(&identity, &proxy.url_with("wr0ng-pw"), d.path());
    let c = client(&Source::Kubeconfig(kc)).await.unwrap();
    let e = c.apiserver_version().await.unwrap_err();
    let said = format!("{e} {e:?}");
    assert!(
        !said.contains("wr0ng-pw") && !said.contains(proxy::PASSWORD),
        "{said}"
    );
}
