//! The Kubernetes daemon on the real API server (the kube env of tests/support/kube.rs), with
//! the scripted containerd on the host side (instant restarts, local file:// artifacts):
//!
//! 1. idle cost with 50 Shims installed: resident memory and CPU of this process (two agents:
//!    the coordinator and a follower) over an idle window;
//! 2. API requests per node per hour at steady state, by verb and resource, counted in each
//!    agent's own HTTP client (watches are listed apart);
//! 3. latency from a Shim's creation to the node label, in two phases: until the node
//!    announces `Installing` (watch delivery, debounce, planning, the announcement patch), and
//!    from there to the label (the transaction with its fsyncs, and the label patch).
//!
//! `cargo bench --bench daemon` (env `DAEMON_BENCH_IDLE_SECS`, default 60;
//! `DAEMON_BENCH_RUNS`, default 20; `DAEMON_BENCH_AT_ONCE=1` creates the batch side by side).
//! Needs the kube env (`KUBE_ENV_DIR`). `RUST_LOG=bench=debug` prints a timeline: each
//! request as an agent's client sends it, and each latency Shim's creation, `Installing` and
//! label as the harness sees them.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node as KubeNode;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use shim_agent::api::Shim;
use shim_agent::cluster::coordinator::{self, CoordinatorConfig};
use shim_agent::cluster::{STATE_ANNOTATION, node_label};
use support::agent_rig::{cluster_node, run_agent};
use support::kube::{KubeEnv, kube_env};
use support::live::{fake, shim_yaml, world};

type Counts = Arc<Mutex<BTreeMap<String, u64>>>;

/// A client like the agent's, counting every request it sends.
async fn counting_client(kubeconfig: &std::path::Path, counts: Counts) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let who = kubeconfig
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let observe = move |req: http::Request<kube::client::Body>| {
        // RUST_LOG=bench=debug: each request as it leaves, for a timeline
        tracing::debug!(target: "bench", who = %who, "{} {}", req.method(), req.uri());
        let watch = req.uri().query().is_some_and(|q| q.contains("watch=true"));
        let resource = req
            .uri()
            .path()
            .rsplit('/')
            .find(|s| {
                [
                    "shims",
                    "nodes",
                    "pods",
                    "shimleases",
                    "events",
                    "runtimeclasses",
                ]
                .contains(s)
            })
            .unwrap_or("other");
        let key = format!(
            "{} {resource}",
            if watch {
                "WATCH"
            } else {
                req.method().as_str()
            }
        );
        *counts.lock().unwrap().entry(key).or_default() += 1;
        req
    };
    // the agent's own transport (one HTTP/2 connection), each request counted on its way
    shim_agent::cluster::transport::client_observed(config, observe).unwrap()
}

fn proc_self(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of this process, in clock ticks (100 per second here).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn non_watch(c: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    c.iter()
        .filter(|(k, _)| !k.starts_with("WATCH"))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

async fn labelled(admin: &Client, node: &str, shims: &[String]) -> bool {
    let n = Api::<KubeNode>::all(admin.clone()).get(node).await.unwrap();
    shims
        .iter()
        .all(|s| n.labels().get(&node_label(s)).is_some_and(|v| v == "true"))
}

/// Whether every one of `shims` has its RuntimeClass (named as the Shim in this benchmark).
async fn classes_applied(admin: &Client, shims: &[String]) -> bool {
    let classes = Api::<RuntimeClass>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap();
    let names: std::collections::BTreeSet<String> =
        classes.items.iter().map(|c| c.name_any()).collect();
    shims.iter().all(|s| names.contains(s))
}

fn main() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(bench());
}

async fn bench() {
    let Some(env) = kube_env() else {
        eprintln!("daemon bench: no kube env (set KUBE_ENV_DIR)");
        return;
    };
    let idle_secs: u64 = std::env::var("DAEMON_BENCH_IDLE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let runs: usize = std::env::var("DAEMON_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    // DAEMON_BENCH_AT_ONCE=1: the 50 Shims created side by side once the agents run
    let at_once = std::env::var("DAEMON_BENCH_AT_ONCE").is_ok_and(|v| v == "1");
    let admin = env.admin_client().await;
    cleanup(env, &admin).await;
    let names = ["bench-leader", "bench-follower"];
    for n in names {
        env.create_node(n, &[("bench", "daemon")]).await;
    }
    env.create_node("bench-leader", &[("bench", "daemon"), ("lat", "yes")])
        .await;
    let (wa, wb) = (world(), world());
    let (fa, fb) = (fake(&wa), fake(&wb));
    let (na, nb) = (cluster_node(&wa, &fa), cluster_node(&wb, &fb));
    let (ca, cb): (Counts, Counts) = Default::default();
    let client_a = counting_client(&env.node_identity(names[0]), ca.clone()).await;
    let client_b = counting_client(&env.node_identity(names[1]), cb.clone()).await;
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let rss_before = proc_self("VmRSS:");

    // the leader starts first and keeps the coordinator lease
    // each node's coordinator with the coordinator identity (a node's own may not do its
    // writes, docs/design.md §7), its requests counted with the node's
    let coord_client_a = counting_client(&env.coordinator_identity(), ca.clone()).await;
    let coord_client_b = counting_client(&env.coordinator_identity(), cb.clone()).await;
    let coord_a = tokio::spawn(coordinator::run(
        coord_client_a,
        names[0].into(),
        CoordinatorConfig::default(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let coord_b = tokio::spawn(coordinator::run(
        coord_client_b,
        names[1].into(),
        CoordinatorConfig::default(),
        stop.clone(),
    ));
    let agent = |n, client, name: &'static str| run_agent(n, client, name, stop.clone());
    let body = async {
        let shims: Vec<String> = (0..50).map(|i| format!("bench-{i:02}")).collect();
        let docs: Vec<String> = shims
            .iter()
            .map(|s| shim_yaml(&wa, s, "1", ("bench", "daemon")))
            .collect();
        let t = if at_once {
            // the agents run and watch before the batch arrives, as on a cluster's nodes, and
            // the batch arrives at once: 50 creates side by side, timed from the first
            tokio::time::sleep(Duration::from_secs(2)).await;
            // sent as a controller sends them: over one HTTP/2 connection that is already up
            // (client-go's way). kube's own client speaks HTTP/1.1: its first create went
            // alone on the pooled connection, the other 49 waited 50-90 ms for TLS
            // connections of their own, and each node's round began with that one Shim.
            let creator = counting_client(&env.admin, Counts::default()).await;
            let api: Api<Shim> = Api::all(creator);
            api.list(&ListParams::default().limit(1)).await.unwrap();
            let t = Instant::now();
            let creates = docs.iter().map(|d| {
                let shim: Shim = serde_yaml::from_str(d).unwrap();
                let api = api.clone();
                async move { api.create(&PostParams::default(), &shim).await.unwrap() }
            });
            futures_util::future::join_all(creates).await;
            t
        } else {
            // issue 7's figure: kubectl apply (one object after another, about 1 s for 50)
            // while the agents start, timed from its end
            let (ok, out) = env.apply(&docs.join("---\n"));
            assert!(ok, "{out}");
            Instant::now()
        };
        // the labels and the RuntimeClasses (a pod needs both), each timed when complete
        let (mut labels_at, mut classes_at) = (None, None);
        while labels_at.is_none() || classes_at.is_none() {
            assert!(
                t.elapsed() < Duration::from_secs(120),
                "50 Shims not installed"
            );
            if labels_at.is_none()
                && labelled(&admin, names[0], &shims).await
                && labelled(&admin, names[1], &shims).await
            {
                labels_at = Some(t.elapsed());
            }
            if classes_at.is_none() && classes_applied(&admin, &shims).await {
                classes_at = Some(t.elapsed());
            }
            // polled every 20 ms: at 200 ms the figure was rounded up by as much
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let secs = |d: Option<Duration>| d.unwrap_or_default().as_secs_f64();
        println!(
            "50 Shims installed and labelled on 2 nodes in {:.2} s ({} and {} containerd restarts); their RuntimeClasses applied in {:.2} s",
            secs(labels_at),
            fa.restarts.borrow(),
            fb.restarts.borrow(),
            secs(classes_at)
        );
        tokio::time::sleep(Duration::from_secs(5)).await; // status writes settle

        let (a0, b0) = (ca.lock().unwrap().clone(), cb.lock().unwrap().clone());
        let (cpu0, t0) = (cpu_ticks(), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let (cpu1, secs) = (cpu_ticks(), t0.elapsed().as_secs_f64());
        let (a1, b1) = (ca.lock().unwrap().clone(), cb.lock().unwrap().clone());
        let rss = proc_self("VmRSS:");
        println!(
            "idle {secs:.0} s, two agents with 50 Shims each: CPU {:.2}% of one core; RSS {:.1} MiB (harness before the agents: {:.1} MiB, so the agents: {:.1} MiB); peak {:.1} MiB",
            (cpu1 - cpu0) as f64 / secs,
            rss as f64 / 1024.0,
            rss_before as f64 / 1024.0,
            (rss - rss_before) as f64 / 1024.0,
            proc_self("VmHWM:") as f64 / 1024.0
        );
        let per_hour = |d: &BTreeMap<String, u64>| -> Vec<String> {
            d.iter()
                .map(|(k, v)| format!("{k}: {:.0}/h", *v as f64 * 3600.0 / secs))
                .collect()
        };
        let (da, db) = (
            delta(&non_watch(&a1), &non_watch(&a0)),
            delta(&non_watch(&b1), &non_watch(&b0)),
        );
        println!(
            "requests beyond the watches, coordinator node: {:?}",
            per_hour(&da)
        );
        println!(
            "requests beyond the watches, other node:       {:?}",
            per_hour(&db)
        );
        println!(
            "watches opened in the window: coordinator {:?}, other {:?}",
            delta(&a1, &a0)
                .into_iter()
                .filter(|(k, _)| k.starts_with("WATCH"))
                .collect::<Vec<_>>(),
            delta(&b1, &b0)
                .into_iter()
                .filter(|(k, _)| k.starts_with("WATCH"))
                .collect::<Vec<_>>()
        );

        latency(env, &admin, &wa, names[0], runs).await;
        let _ = stop_tx.send(true);
    };
    tokio::join!(
        agent(&na, client_a, names[0]),
        agent(&nb, client_b, names[1]),
        body
    );
    let _ = tokio::join!(coord_a, coord_b);
    cleanup(env, &admin).await;
}

/// Creation → `Installing` on the node → label, for `runs` new Shims on one node.
async fn latency(env: &KubeEnv, admin: &Client, w: &support::live::World, node: &str, runs: usize) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, KubeNode)>();
    let api = Api::<KubeNode>::all(admin.clone());
    let cfg = watcher::Config::default().fields(&format!("metadata.name={node}"));
    let watch = tokio::spawn(async move {
        let mut s = std::pin::pin!(watcher(api, cfg).applied_objects());
        while let Some(Ok(n)) = s.next().await {
            let _ = tx.send((Instant::now(), n));
        }
    });
    let shims: Api<Shim> = Api::all(admin.clone());
    let (mut to_announce, mut to_label, mut total) = (vec![], vec![], vec![]);
    for i in 0..runs {
        let name = format!("bench-lat-{i:02}");
        let yaml = shim_yaml(w, &name, "1", ("lat", "yes"));
        let shim: Shim = serde_yaml::from_str(&yaml).unwrap();
        while rx.try_recv().is_ok() {}
        let t0 = Instant::now();
        tracing::debug!(target: "bench", shim = %name, "creating");
        shims.create(&PostParams::default(), &shim).await.unwrap();
        tracing::debug!(target: "bench", shim = %name, "created");
        let mut announced = None;
        loop {
            let (at, n) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .expect("label within 30 s")
                .unwrap();
            let state = n
                .annotations()
                .get(STATE_ANNOTATION)
                .cloned()
                .unwrap_or_default();
            if announced.is_none()
                && state.contains(&format!("\"{name}\":{{\"phase\":\"Installing\""))
            {
                tracing::debug!(target: "bench", shim = %name, "Installing seen");
                announced = Some(at);
            }
            if n.labels()
                .get(&node_label(&name))
                .is_some_and(|v| v == "true")
            {
                tracing::debug!(target: "bench", shim = %name, "label seen");
                let a = announced.unwrap_or(at);
                to_announce.push(a - t0);
                to_label.push(at - a);
                total.push(at - t0);
                break;
            }
        }
    }
    watch.abort();
    let _ = env;
    let med = |v: &mut Vec<Duration>| {
        v.sort();
        let p = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1000.0;
        format!("p50 {:.1} ms, p90 {:.1} ms", p(0.5), p(0.9))
    };
    println!("creation → label over {runs} Shims: {}", med(&mut total));
    println!(
        "  creation → Installing announced: {}",
        med(&mut to_announce)
    );
    println!("  Installing → label:              {}", med(&mut to_label));
}

async fn cleanup(env: &KubeEnv, admin: &Client) {
    let shims: Api<Shim> = Api::all(admin.clone());
    for s in shims.list(&Default::default()).await.unwrap().items {
        let n = s.name_any();
        if n.starts_with("bench-") {
            env.kubectl(&[
                "patch",
                "shim",
                &n,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
            env.kubectl(&["delete", "shim", &n, "--wait=false"]);
        }
    }
    // no class left from a run before passes for one this run applied
    let classes: Api<RuntimeClass> = Api::all(admin.clone());
    for c in classes.list(&Default::default()).await.unwrap().items {
        if c.name_any().starts_with("bench-") {
            let _ = classes.delete(&c.name_any(), &Default::default()).await;
        }
    }
}
