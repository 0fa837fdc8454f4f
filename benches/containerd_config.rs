//! Benchmark of the containerd config engine: `plan_add` then `plan_remove` on the largest
//! editable corpus file (found by size), in place. Plain `main`, no criterion: it times N
//! iterations of each operation and prints mean, p50 and p99, plus the cost of one bare
//! `toml_edit` parse and render of the same file as a baseline.
//!
//! Run: `cargo bench --bench containerd_config` (N from `BENCH_ITERS`, default 2000).

use std::path::Path;
use std::time::{Duration, Instant};

use shim_agent::containerd::{
    AddOptions, ConfigFile, ConfigSet, DropinPolicy, RuntimeSpec, plan_add, plan_remove,
};

fn stats(name: &str, mut d: Vec<Duration>) {
    d.sort();
    let mean = d.iter().sum::<Duration>() / d.len() as u32;
    let p = |q: f64| d[((d.len() as f64 * q) as usize).min(d.len() - 1)];
    println!(
        "{name:<28} n={:<6} mean={:>9.1?} p50={:>9.1?} p99={:>9.1?} max={:>9.1?}",
        d.len(),
        mean,
        p(0.50),
        p(0.99),
        d[d.len() - 1]
    );
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/containerd-configs");
    let mut files: Vec<(u64, std::path::PathBuf)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus {} missing: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_none_or(|e| e != "md"))
        .map(|p| (std::fs::metadata(&p).unwrap().len(), p))
        .collect();
    files.sort_by(|a, b| b.cmp(a));
    let mut spec = RuntimeSpec::from_binary(
        "spin",
        "/opt/shim-agent/shims/spin/3f5a/containerd-shim-spin-v2",
    );
    spec.options
        .insert("SystemdCgroup".into(), serde_json::Value::Bool(true));
    let opts = AddOptions {
        replace: false,
        dropin: DropinPolicy::Never,
    };
    let (size, path, set) = files
        .iter()
        .find_map(|(size, p)| {
            let set = ConfigSet {
                main: ConfigFile {
                    host_path: "/etc/containerd/config.toml".into(),
                    bytes: std::fs::read(p).ok()?,
                },
                dropins: vec![],
            };
            plan_add(&set, &spec, &opts)
                .ok()
                .map(|_| (*size, p.clone(), set))
        })
        .expect("an editable corpus file");
    println!(
        "file: {} ({size} bytes), {iters} iterations",
        path.file_name().unwrap().to_string_lossy()
    );
    let plan = plan_add(&set, &spec, &opts).unwrap();
    let added = ConfigSet {
        main: ConfigFile {
            host_path: set.main.host_path.clone(),
            bytes: plan.changes[0].after.clone().unwrap(),
        },
        dropins: vec![],
    };
    let (mut add, mut remove, mut noop) = (Vec::new(), Vec::new(), Vec::new());
    let (mut parse, mut render) = (Vec::new(), Vec::new());
    let text = std::str::from_utf8(&set.main.bytes).unwrap();
    for _ in 0..iters {
        // Baseline: what toml_edit alone costs (the engine parses twice and renders twice).
        let t = Instant::now();
        let doc: toml_edit::DocumentMut = text.parse().unwrap();
        parse.push(t.elapsed());
        let t = Instant::now();
        std::hint::black_box(doc.to_string());
        render.push(t.elapsed());
        let t = Instant::now();
        let p = plan_add(&set, &spec, &opts).unwrap();
        add.push(t.elapsed());
        std::hint::black_box(p);
        let t = Instant::now();
        let p = plan_remove(&added, "spin").unwrap();
        remove.push(t.elapsed());
        assert_eq!(p.changes[0].after.as_deref(), Some(&set.main.bytes[..]));
        let t = Instant::now();
        let p = plan_add(&added, &spec, &opts).unwrap();
        noop.push(t.elapsed());
        assert!(p.is_empty());
    }
    stats("plan_add (in place)", add);
    stats("plan_remove", remove);
    stats("plan_add (already there)", noop);
    stats("baseline: toml_edit parse", parse);
    stats("baseline: toml_edit render", render);
}
