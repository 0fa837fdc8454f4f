//! A kubelet's reads, with shim-agent's manifests applied, on the real API server. The agent
//! reads its own Node and the pods bound to it; a kubelet holds those through the Node
//! authorizer, which holds it to its own (its lists and watches too). The manifests once
//! granted `list` and `watch` of nodes and pods to `system:nodes` as well, and the API server
//! asks RBAC when the Node authorizer says no: every kubelet of the cluster could then list
//! every Node and every pod.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, WatchParams};

use crate::support::kube::{SERIAL, client_for, kube_env};

/// `r` was refused (403), said as `what`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: want 403, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_reads_its_own_node_and_pods_and_no_others() {
    let _serial = SERIAL.lock().await;
    let Some(env) = kube_env() else { return };
    let (me, other) = ("kr-node", "kr-other");
    for n in [me, other] {
        env.create_node(n, &[("test", "kr")]).await;
    }
    let client = client_for(&env.node_identity(me)).await;
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    // what the agent reads, as it reads it
    let own_pods = ListParams::default().fields(&format!("spec.nodeName={me}"));
    let own_node = ListParams::default().fields(&format!("metadata.name={me}"));
    pods.list(&own_pods).await.expect("its own pods");
    nodes.list(&own_node).await.expect("its own Node");
    nodes.get(me).await.expect("a get of its own Node");
    let wp = |f: &str| WatchParams::default().fields(f).timeout(1);
    pods.watch(&wp(&format!("spec.nodeName={me}")), "0")
        .await
        .map(|_| ())
        .expect("a watch of its own pods");
    // anyone else's
    refused(
        "a list of every pod",
        pods.list(&ListParams::default()).await,
    );
    refused(
        "a list of another node's pods",
        pods.list(&ListParams::default().fields(&format!("spec.nodeName={other}")))
            .await,
    );
    refused(
        "a watch of every pod",
        pods.watch(&WatchParams::default().timeout(1), "0")
            .await
            .map(|_| ()),
    );
    refused(
        "a list of every Node",
        nodes.list(&ListParams::default()).await,
    );
    refused(
        "a list of another Node",
        nodes
            .list(&ListParams::default().fields(&format!("metadata.name={other}")))
            .await,
    );
    refused(
        "a watch of every Node",
        nodes
            .watch(&WatchParams::default().timeout(1), "0")
            .await
            .map(|_| ()),
    );
    let admin: Api<Node> = Api::all(env.admin_client().await);
    for n in [me, other] {
        let _ = admin.delete(n, &Default::default()).await;
    }
}
