//! The agent when things go wrong around it, on the real API server: the coordinator dies,
//! the API server goes away mid-install.

use std::time::{Duration, Instant};

use shim_agent::cluster::{STATE_ANNOTATION, node_label};

use crate::support;
use crate::support::agent_rig::{Rig, cluster_node, fast, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_builder, shim_yaml};

async fn holder(rig: &Rig) -> Option<String> {
    support::agent_rig::coordinator_holder(&rig.admin).await
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

/// SIGKILL the kube-apiserver (a crash, not a graceful stop) and wait until it is gone.
async fn kill_apiserver() {
    let pid = apiserver_pid().expect("kube-apiserver pid");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "kube-apiserver did not exit"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Start it again (the kube env's up.sh keeps what still runs).
async fn start_apiserver(rig: &Rig) {
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
}

/// The pid of the instance the tests use (`KUBE_ENV_NAME`, as `up.sh` reads it), never another
/// one's: killing the default instance under someone else's tests is not this test's business.
fn apiserver_pid() -> Option<i32> {
    let state = std::env::var("KUBE_ENV_STATE").unwrap_or_else(|_| "/var/tmp/kube-env".into());
    let name = std::env::var("KUBE_ENV_NAME").unwrap_or_else(|_| "default".into());
    std::fs::read_to_string(format!("{state}/{name}/run/kube-apiserver.pid"))
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
        // `recreate`: no rollout slot, whose renewal right before the restart would (rightly)
        // stop the restart while the API server is away; this test is about the agent alone.
        let yaml = shim_builder(&rig.w, shim, "1")
            .node_selector("test", "kr-outage")
            .recreate()
            .yaml();
        let (ok, out) = rig.env.apply(&yaml);
        assert!(ok, "{out}");
        eventually(30, "the node announcing the install", || async {
            let s = rig.state_annotation().await?;
            s.contains("Installing").then_some(())
        })
        .await;
        // the API server goes away while containerd restarts
        kill_apiserver().await;
        let t = Instant::now();
        while fref.serving.borrow().get(shim).is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the install did not finish locally"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(*fref.restarts.borrow(), 1);
        // back again
        start_apiserver(&rig).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_replaced_on_disk_is_used_without_a_restart() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kr-rotate").await else {
        return;
    };
    let shim = "kr-rotate-spin";
    rig.force_delete(shim).await;
    // The kubelet's layout: a kubeconfig naming certificate files that get replaced.
    let pki = rig.kubeconfig.parent().unwrap().join("pki");
    let file = format!("system-node-{}", rig.name);
    let (good_crt, good_key) = (
        pki.join(format!("{file}.crt")),
        pki.join(format!("{file}.key")),
    );
    let tmp = tempfile::tempdir().unwrap();
    let (crt, key) = (tmp.path().join("client.crt"), tmp.path().join("client.key"));
    // first a certificate the API server does not trust (signed by another CA)
    let aside = tmp.path().join("good");
    std::fs::create_dir(&aside).unwrap();
    std::fs::rename(&good_crt, aside.join("crt")).unwrap();
    std::fs::rename(&good_key, aside.join("key")).unwrap();
    let out = std::process::Command::new(rig.env.dir.join("identity.sh"))
        .env("CA", "front-proxy-ca")
        .args([&format!("system:node:{}", rig.name), "system:nodes"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::rename(&good_crt, &crt).unwrap();
    std::fs::rename(&good_key, &key).unwrap();
    std::fs::rename(aside.join("crt"), &good_crt).unwrap();
    std::fs::rename(aside.join("key"), &good_key).unwrap();
    let mut kc = kube::config::Kubeconfig::read_from(&rig.kubeconfig).unwrap();
    for a in &mut kc.auth_infos {
        let info = a.auth_info.as_mut().unwrap();
        info.client_certificate_data = None;
        info.client_key_data = None;
        info.client_certificate = Some(crt.display().to_string());
        info.client_key = Some(key.display().to_string());
    }
    let kubeconfig = tmp.path().join("kubelet.conf");
    std::fs::write(&kubeconfig, serde_yaml::to_string(&kc).unwrap()).unwrap();

    let f = fake(&rig.w);
    let n = cluster_node(&rig.w, &f);
    let mut config = rig.config();
    config.source = shim_agent::cluster::connect::Source::Kubeconfig(kubeconfig);
    config.node_wait = Duration::from_secs(60);
    let (tx, rx) = tokio::sync::watch::channel(false);
    let agent = shim_agent::cluster::session::run(&n, config, rx);
    let body = async {
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "kr-rotate")));
        assert!(ok, "{out}");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            rig.label(shim).await,
            None,
            "an untrusted certificate gets nowhere"
        );
        // the kubelet rotates its certificate: new files, same paths
        for (from, to) in [(&good_crt, &crt), (&good_key, &key)] {
            let next = to.with_extension("new");
            std::fs::copy(from, &next).unwrap();
            std::fs::rename(&next, to).unwrap();
        }
        eventually(30, "the label with the rotated certificate", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        let _ = tx.send(true);
    };
    let (result, ()) = tokio::join!(agent, body);
    result.expect("the agent ran through the rotation");
    assert_eq!(*f.restarts.borrow(), 1);
    rig.force_delete(shim).await;
}

fn etcd(path: &str, body: &str) -> serde_json::Value {
    let port = std::env::var("KUBE_ENV_ETCD_PORT").unwrap_or_else(|_| "23790".into());
    let out = std::process::Command::new("curl")
        .args(["-sf", "-X", "POST", "-d", body])
        .arg(format!("http://127.0.0.1:{port}{path}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "etcd {path}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_resume_after_410_gone_when_the_history_was_compacted_during_an_outage() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kr-gone").await else {
        return;
    };
    let shim = "kr-gone-spin";
    rig.force_delete(shim).await;
    let f = fake(&rig.w);
    with_agent(&rig, &f, || async {
        rig.env
            .apply(&shim_yaml(&rig.w, shim, "1", ("test", "kr-gone")));
        eventually(30, "the install", || async {
            (rig.label(shim).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        // history moves on without the agent's watches seeing it, then the API server goes,
        // and etcd compacts everything before now: resuming from the old resourceVersion
        // answers 410 Gone
        for i in 0..5 {
            rig.env.kubectl(&[
                "create",
                "configmap",
                &format!("kr-gone-{i}"),
                "-n",
                "default",
            ]);
        }
        kill_apiserver().await;
        let rev = etcd("/v3/maintenance/status", "{}")["header"]["revision"]
            .as_str()
            .unwrap()
            .to_string();
        etcd(
            "/v3/kv/compaction",
            &format!("{{\"revision\":\"{rev}\",\"physical\":true}}"),
        );
        start_apiserver(&rig).await;
        // the watches relisted: a new artifact is seen and installed
        let (ok, out) = rig
            .env
            .apply(&shim_yaml(&rig.w, shim, "2", ("test", "kr-gone")));
        assert!(ok, "{out}");
        eventually(60, "the upgrade after the relist", || async {
            (*f.restarts.borrow() >= 2).then_some(())
        })
        .await;
        for i in 0..5 {
            rig.env.kubectl(&[
                "delete",
                "configmap",
                &format!("kr-gone-{i}"),
                "-n",
                "default",
            ]);
        }
    })
    .await;
    assert_eq!(*f.restarts.borrow(), 2);
    rig.force_delete(shim).await;
}
