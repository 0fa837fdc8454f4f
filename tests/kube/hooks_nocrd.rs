//! An agent on a cluster without the ShimExtension CRD (upgraded before the cluster's
//! manifests): a real API server of its own (instance `nocrd` on port 6843, beside the shared
//! one; no other test uses that port), with the manifests applied except that CRD. The API
//! server answers 404 for the kind: the agent takes it as "no extensions", and a restart goes
//! through without waiting for a cache that never syncs.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::Api;
use kube::api::PostParams;
use shim_agent::cluster::agent::gate::GateTimings;
use shim_agent::cluster::connect::Source;
use shim_agent::cluster::node_label;
use shim_agent::cluster::session::{self, SessionConfig};

use crate::support::agent_rig::{cluster_node, fast};
use crate::support::kube::{Instance, SERIAL, client_for, eventually};
use crate::support::live::{fake, shim_yaml, world};

/// The instance's ports: API server, etcd (client; peer = +10).
const PORT: u16 = 6843;
const ETCD_PORT: u16 = 24190;

/// `deploy/manifests.yaml` without the ShimExtension CRD.
fn manifests_without_extensions() -> String {
    let all = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/manifests.yaml"),
    )
    .unwrap();
    let docs: Vec<&str> = all
        .split("\n---\n")
        .filter(|d| !d.contains("name: shimextensions.containerd.x-k8s.io"))
        .collect();
    assert_eq!(
        docs.len() + 1,
        all.split("\n---\n").count(),
        "exactly the ShimExtension CRD left out"
    );
    docs.join("\n---\n")
}

#[tokio::test(flavor = "current_thread")]
async fn without_the_extension_crd_a_restart_goes_through_at_once() {
    let _serial = SERIAL.lock().await;
    let Some(inst) = Instance::start("nocrd", PORT, ETCD_PORT) else {
        return;
    };
    let env = &inst.env;
    let (ok, out) = env.apply(&manifests_without_extensions());
    assert!(ok, "{out}");
    let (ok, out) = env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/shims.containerd.x-k8s.io",
        "crd/shimleases.containerd.x-k8s.io",
    ]);
    assert!(ok, "{out}");
    // the kind is unknown to this API server
    let (ok, out) = env.kubectl(&["get", "shimextensions.containerd.x-k8s.io"]);
    assert!(!ok, "{out}");

    let name = "nocrd-node";
    let admin = env.admin_client().await;
    let node: KubeNode = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"test": "nocrd"}},
    }))
    .unwrap();
    Api::<KubeNode>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    let kubeconfig = inst.node_identity(name);
    let w = world();
    let f = fake(&w);
    let n = cluster_node(&w, &f);
    let config = SessionConfig {
        source: Source::Kubeconfig(kubeconfig.clone()),
        node_name: name.into(),
        coordinator_source: Some(Source::Kubeconfig(inst.coordinator_identity())),
        coordinator: fast(),
        node_wait: Duration::from_secs(20),
        credential_check: Duration::from_millis(500),
        gate: GateTimings::default(),
        startup_taint: None,
    };
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let agent = session::run(&n, config, stop);
    let nodes: Api<KubeNode> = Api::all(client_for(&env.admin).await);
    let body = async {
        // the agent is up: it leads (the only one) and its watches synced
        eventually(30, "the agent's coordinator leading", || async {
            let l = Api::<shim_agent::api::lease::ShimLease>::namespaced(
                admin.clone(),
                shim_agent::cluster::NAMESPACE,
            )
            .get_opt(shim_agent::cluster::COORDINATOR_LEASE)
            .await
            .ok()??;
            l.spec.holder_identity.filter(|h| h == name)
        })
        .await;
        let applied = Instant::now();
        let (ok, out) = env.apply(&shim_yaml(&w, "nocrd", "1", ("test", "nocrd")));
        assert!(ok, "{out}");
        eventually(25, "the Shim installed and the Node labelled", || async {
            let n = nodes.get(name).await.ok()?;
            (n.metadata
                .labels?
                .get(&node_label("nocrd"))
                .map(String::as_str)
                == Some("true"))
            .then_some(())
        })
        .await;
        let took = applied.elapsed();
        eprintln!("installed {took:?} after the apply, without the ShimExtension CRD");
        // no wait for the extensions' cache (30 s): the 404 said there are none
        assert!(
            took < Duration::from_secs(10),
            "the restart waited {took:?} for extensions that cannot exist"
        );
        assert_eq!(*f.restarts.borrow(), 1);
        let _ = stop_tx.send(true);
    };
    let (r, ()) = tokio::join!(agent, body);
    r.expect("agent session");
}
