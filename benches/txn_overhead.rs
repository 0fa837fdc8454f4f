//! Agent overhead of a live install and uninstall, excluding download and containerd's own
//! restart: the restart and CRI check are instant stand-ins, and the Fetched phase (copying,
//! hashing and unpacking the artifact from a file:// URL: uninstall drops it from the store)
//! is reported but subtracted. What is left is the agent's own work:
//! parsing, planning the config edit, journalling every phase with fsync, backups, placing
//! the binary, writing the config atomically, committing. Target: under 50 ms.
//!
//! `cargo bench --bench txn_overhead` (env `TXN_BENCH_RUNS`, default 50; `TXN_BENCH_BYTES`,
//! the shim's size, default 16 MiB; `TXN_BENCH_BATCH=K` also times K Shims in one
//! transaction).

use std::time::{Duration, Instant};

use shim_agent::api::load::parse_shims;
use shim_agent::artifact::node_platform;
use shim_agent::hostroot::HostRoot;
use shim_agent::profile;
use shim_agent::settings::Settings;
use shim_agent::state::{Origin, Phase};
use shim_agent::txn::{Change, Node};

#[path = "common/instant_node.rs"]
mod instant_node;
use instant_node::InstantNode;

fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("TXN_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let tmp = tempfile::tempdir().expect("tempdir");
    let rootdir = tmp.path().join("root");
    std::fs::create_dir_all(rootdir.join("etc/containerd")).expect("mkdir");
    let cfg = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../shared/containerd-configs/containerd-1.7.34-config-default.toml"
    ))
    .expect("shared corpus");
    std::fs::write(rootdir.join("etc/containerd/config.toml"), &cfg).expect("write");
    // a real shim-sized binary (the agent's own, ~10 MB debug / ~5 MB release)
    // a shim-sized binary: a real ELF (/bin/true) padded to 16 MiB, about what a Wasm shim weighs
    let mut elf = std::fs::read("/bin/true").expect("read /bin/true");
    let bytes = std::env::var("TXN_BENCH_BYTES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(16 << 20);
    elf.resize(bytes.max(elf.len()), 0);
    let art = tmp.path().join("shim.tar");
    {
        let mut b = tar::Builder::new(std::fs::File::create(&art).expect("create"));
        let mut h = tar::Header::new_gnu();
        h.set_size(elf.len() as u64);
        h.set_mode(0o755);
        h.set_cksum();
        b.append_data(&mut h, "containerd-shim-bench-v2", &elf[..])
            .expect("append");
        b.finish().expect("finish");
    }
    let sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(std::fs::read(&art).expect("read")))
    };
    let yaml = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: Shim\nmetadata: {{name: bench}}\nspec:\n  fetchStrategy: {{type: anonymousHttp, anonHttp: {{location: \"file://{}\", sha256: {sha}}}}}\n  runtimeClass: {{name: bench}}\n",
        art.display()
    );
    let shim = parse_shims(&yaml, "bench.yaml").expect("shim").remove(0);
    let batch = std::env::var("TXN_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(1);
    let batch_shims: Vec<_> = (0..batch)
        .map(|i| {
            let y = yaml.replace("bench", &format!("bench-{i:02}"));
            parse_shims(&y, "batch.yaml").expect("shim").remove(0)
        })
        .collect();
    let root = HostRoot::new(&rootdir).expect("root");
    let settings = Settings::default();
    let node = Node {
        root: &root,
        settings: &settings,
        profile: profile::builtin("containerd"),
        platform: node_platform(),
        origin: Origin::Cli,
        restarter: InstantNode(None),
        health: InstantNode(None),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // warm-up: the first install fetches into the store
    rt.block_on(node.apply(vec![Change::Install(Box::new(shim.clone()))]))
        .expect("install");
    rt.block_on(node.apply(vec![Change::Uninstall("bench".into())]))
        .expect("uninstall");

    let mut install = Vec::new();
    let mut overhead = Vec::new();
    let mut uninstall = Vec::new();
    let mut phases: std::collections::BTreeMap<Phase, Vec<Duration>> = Default::default();
    for _ in 0..runs {
        let t = Instant::now();
        let r = rt
            .block_on(node.apply(vec![Change::Install(Box::new(shim.clone()))]))
            .expect("install");
        let total = t.elapsed();
        install.push(total);
        assert_eq!(r.installed, ["bench"]);
        let external: Duration = r
            .phases
            .iter()
            .filter(|(p, _)| matches!(p, Phase::Fetched | Phase::Restarted | Phase::Verified))
            .map(|(_, d)| *d)
            .sum();
        overhead.push(total - external);
        for (p, d) in r.phases {
            phases.entry(p).or_default().push(d);
        }
        let t = Instant::now();
        rt.block_on(node.apply(vec![Change::Uninstall("bench".into())]))
            .expect("uninstall");
        uninstall.push(t.elapsed());
        assert_eq!(
            std::fs::read(rootdir.join("etc/containerd/config.toml")).expect("read"),
            cfg
        );
    }
    println!(
        "txn_overhead: {runs} installs + uninstalls of a {} byte shim from a file:// tar, restart/verify instant",
        elf.len()
    );
    println!(
        "install   median {:>8.2?}  min {:>8.2?}  max {:>8.2?}",
        median(install.clone()),
        install.iter().min().unwrap(),
        install.iter().max().unwrap()
    );
    println!(
        "uninstall median {:>8.2?}  min {:>8.2?}  max {:>8.2?}",
        median(uninstall.clone()),
        uninstall.iter().min().unwrap(),
        uninstall.iter().max().unwrap()
    );
    println!(
        "install overhead (total minus Fetched, Restarted, Verified) median {:>8.2?}  max {:>8.2?}  (target < 50 ms)",
        median(overhead.clone()),
        overhead.iter().max().unwrap()
    );
    println!("install phases (median time of the step that reached each):");
    for (p, ds) in phases {
        println!("  {:<10} {:>8.2?}", format!("{p:?}"), median(ds));
    }
    if batch > 1 {
        batch_runs(&rt, &node, &batch_shims, runs);
    }
}

/// `TXN_BENCH_BATCH=K`: K Shims (one artifact, K handlers) installed in one transaction
/// and uninstalled in another, `runs` times; the phases as above, and what no phase counts
/// (planning the config and the journal before the slots are asked for).
fn batch_runs(
    rt: &tokio::runtime::Runtime,
    node: &Node<'_, InstantNode, InstantNode>,
    shims: &[shim_agent::api::Shim],
    runs: usize,
) {
    let installs = || {
        shims
            .iter()
            .map(|s| Change::Install(Box::new(s.clone())))
            .collect::<Vec<_>>()
    };
    let uninstalls = || {
        shims
            .iter()
            .map(|s| Change::Uninstall(s.metadata.name.clone().unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    let (mut install, mut uninstall, mut unphased) = (Vec::new(), Vec::new(), Vec::new());
    let mut phases: std::collections::BTreeMap<Phase, Vec<Duration>> = Default::default();
    for _ in 0..runs {
        let t = Instant::now();
        let r = rt.block_on(node.apply(installs())).expect("batch install");
        let total = t.elapsed();
        assert_eq!(r.installed.len(), shims.len());
        install.push(total);
        unphased.push(total - r.phases.iter().map(|(_, d)| *d).sum::<Duration>());
        for (p, d) in r.phases {
            phases.entry(p).or_default().push(d);
        }
        let t = Instant::now();
        rt.block_on(node.apply(uninstalls()))
            .expect("batch uninstall");
        uninstall.push(t.elapsed());
    }
    println!(
        "batch of {}: install median {:>8.2?}  uninstall median {:>8.2?}  outside the phases (planning) median {:>8.2?}",
        shims.len(),
        median(install),
        median(uninstall),
        median(unphased)
    );
    for (p, ds) in phases {
        println!("  {:<10} {:>8.2?}", format!("{p:?}"), median(ds));
    }
}
