//! An API server that does not answer at first: the agent says so and keeps waiting, its
//! watches retrying, instead of ending (every agent of a fleet listing everything again at
//! once kept a slow API server slow: BENCHMARKS.md, 5000 agents). Once the server answers,
//! the agent works as usual.

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use shim_agent::cluster::connect::Source;
use shim_agent::cluster::session;

use crate::support::agent_rig::{Rig, cluster_node};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};

/// Forward every connection to `port` on to `upstream` (host:port), from now on.
async fn forward(port: u16, upstream: String) {
    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                if let Ok(mut out) = TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                }
            });
        }
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_keeps_waiting_for_an_api_server_that_does_not_answer_yet() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("ke-late").await else {
        return;
    };
    let shim = "ke-late-spin";
    rig.force_delete(shim).await;
    // the node's kubeconfig, pointed at a port where nothing listens yet
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut kc = kube::config::Kubeconfig::read_from(&rig.kubeconfig).unwrap();
    let mut upstream = String::new();
    for c in &mut kc.clusters {
        let cluster = c.cluster.as_mut().unwrap();
        let server = cluster.server.clone().unwrap();
        upstream = server.trim_start_matches("https://").to_string();
        cluster.server = Some(format!("https://127.0.0.1:{port}"));
    }
    assert!(upstream.starts_with("127.0.0.1:"), "{upstream}");
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubelet.conf");
    std::fs::write(&kubeconfig, serde_yaml::to_string(&kc).unwrap()).unwrap();

    let f = fake(&rig.w);
    let n = cluster_node(&rig.w, &f);
    let mut config = rig.config();
    config.source = Source::Kubeconfig(kubeconfig);
    config.node_wait = Duration::from_secs(1);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let agent = session::run(&n, config, rx);
    let body = async {
        // three times the node wait with no answer: the agent must still be running
        tokio::time::sleep(Duration::from_secs(3)).await;
        forward(port, upstream).await;
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "ke-late")));
        assert!(ok, "{out}");
        eventually(60, "installed once the API server answers", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        let _ = tx.send(true);
    };
    tokio::pin!(agent);
    tokio::select! {
        biased;
        () = body => {}
        r = &mut agent => panic!("the agent ended while the API server did not answer: {r:?}"),
    }
    let _ = agent.await;
    assert_eq!(*f.restarts.borrow(), 1);
    rig.force_delete(shim).await;
}
