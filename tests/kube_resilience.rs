//! The agent when things go wrong around it, on the real API server: the coordinator dies,
//! the API server goes away mid-install.

mod support;

use std::time::{Duration, Instant};

use kube::Api;
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::{COORDINATOR_LEASE, NAMESPACE, STATE_ANNOTATION, node_label};
use support::agent_rig::{Rig, cluster_node, fast, with_agent};
use support::kube::{SERIAL, eventually};
use support::live::{fake, shim_yaml};

async fn holder(rig: &Rig) -> Option<String> {
    Api::<ShimLease>::namespaced(rig.admin.clone(), NAMESPACE)
        .get_opt(COORDINATOR_LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec.holder_identity)
        .filter(|h| !h.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_the_coordinator_dies_the_other_agent_takes_over_within_the_lease_duration() {
    let _serial = SERIAL.lock().await;
    let (Some(a), Some(b)) = (Rig::new("kr-fail-a").await, Rig::new("kr-fail-b").await) else {
        return;
    };
    let (fa, fb) = (fake(&a.w), fake(&b.w));
    let (na, nb) = (cluster_node(&a.w, &fa), cluster_node(&b.w, &fb));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let (kill_a_tx, kill_a) = tokio::sync::oneshot::channel::<()>();
    let (kill_b_tx, kill_b) = tokio::sync::oneshot::channel::<()>();
    // Each agent runs until killed (its future dropped: no lease release) or stopped.
    let agent_a = async {
        tokio::select! {
            r = shim_agent::cluster::session::run(&na, a.config(), stop.clone()) => r.unwrap(),
            _ = kill_a => {}
        }
    };
    let agent_b = async {
        tokio::select! {
            r = shim_agent::cluster::session::run(&nb, b.config(), stop.clone()) => r.unwrap(),
            _ = kill_b => {}
        }
    };
    let lease_duration = fast().timings.lease_duration;
    let body = async {
        let first = eventually(30, "a coordinator", || holder(&a)).await;
        assert!(first == a.name || first == b.name, "holder {first}");
        let killed = Instant::now();
        let survivor = if first == a.name {
            let _ = kill_a_tx.send(());
            b.name.clone()
        } else {
            let _ = kill_b_tx.send(());
            a.name.clone()
        };
        eventually(30, "the survivor holding the lease", || async {
            (holder(&a).await.as_deref() == Some(survivor.as_str())).then_some(())
        })
        .await;
        let took = killed.elapsed();
        // observed on the survivor's clock: at most one lease duration after the last renewal
        // it saw, plus one retry period to notice, plus the request itself
        let bound = lease_duration + fast().timings.retry_period * 2 + Duration::from_millis(500);
        assert!(took <= bound, "takeover took {took:?}, more than {bound:?}");
        eprintln!("coordinator takeover after {took:?} (lease {lease_duration:?})");
        let _ = stop_tx.send(true);
    };
    tokio::join!(agent_a, agent_b, body);
}

fn apiserver_pid() -> Option<i32> {
    let state = std::env::var("KUBE_ENV_STATE").unwrap_or_else(|_| "/var/tmp/kube-env".into());
    std::fs::read_to_string(format!("{state}/default/run/kube-apiserver.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_install_finishes_while_the_api_server_is_down_and_the_label_follows_once_it_is_back() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kr-outage").await else {
        return;
    };
    let mut f = fake(&rig.w);
    f.restart_delay = Duration::from_secs(3);
    let shim = "kr-outage-spin";
    rig.force_delete(shim).await;
    let fref = &f;
    with_agent(&rig, &f, || async {
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "1", "test: kr-outage"));
        assert!(ok, "{out}");
        eventually(30, "the node announcing the install", || async {
            let n = rig.node().await;
            let s = n
                .metadata
                .annotations
                .as_ref()?
                .get(STATE_ANNOTATION)?
                .clone();
            s.contains("Installing").then_some(())
        })
        .await;
        // the API server goes away while containerd restarts
        let pid = apiserver_pid().expect("kube-apiserver pid");
        assert!(
            std::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
        let t = Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "kube-apiserver did not exit"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        while fref.serving.borrow().get(shim).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the install did not finish locally"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*fref.restarts.borrow(), 1);
        // back again
        let up = rig.env.dir.join("up.sh");
        let out = tokio::task::spawn_blocking(move || std::process::Command::new(up).output())
            .await
            .unwrap()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        eventually(60, "the label after the outage", || async {
            let n = kube::Api::<k8s_openapi::api::core::v1::Node>::all(rig.admin.clone())
                .get(&rig.name)
                .await
                .ok()?;
            let labelled = n.metadata.labels.as_ref()?.get(&node_label(shim))? == "true";
            let state = n
                .metadata
                .annotations
                .as_ref()?
                .get(STATE_ANNOTATION)?
                .clone();
            (labelled && state.contains("\"phase\":\"Installed\"")).then_some(())
        })
        .await;
    })
    .await;
    rig.force_delete(shim).await;
}
