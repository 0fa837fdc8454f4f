//! The transaction engine on distro profiles: k3s (a Go template it renders at start) and
//! microk8s (a sed template), through `txn::Node` with a scripted distro.
//!
//! The scripted k3s is honest about what it models: its restart renders `config.toml` from
//! `config.toml.tmpl` (the base template standing for the file it rendered at install) and
//! fails when the result is not valid TOML, as k3s's containerd would; its CRI serves the
//! handlers of the rendered file. No k3s binary can be had here (not in Debian, nor any
//! package registry this machine reaches), so a real k3s run is not part of the suite; the
//! rendered results are read by real containerd builds in tests/pure/distro_templates.rs.

use std::cell::RefCell;
use std::collections::BTreeSet;

use shim_agent::containerd::template::BASE_LINE;
use shim_agent::hostroot::HostRoot;
use shim_agent::node::NodeError;
use shim_agent::node::check::{CheckReport, HandlerCheck};
use shim_agent::profile;
use shim_agent::state::Origin;
use shim_agent::txn::{Change, HealthCheck, Node, Restarter};

use crate::support;
use crate::support::live::{World, block, shim, world};

const DIR: &str = "/var/lib/rancher/k3s/agent/etc/containerd";
const DROPINS: &str = "config-v3.toml.d";

struct FakeK3s {
    root: HostRoot,
    /// What k3s renders from its own base template.
    base: Vec<u8>,
    serving: RefCell<BTreeSet<String>>,
    restarts: RefCell<Vec<String>>,
    /// Restart numbers (1-based) that fail.
    fail_restarts: Vec<usize>,
}

impl FakeK3s {
    /// k3s v1.29 (containerd 1.7, config version 2, no drop-in import).
    fn new(w: &World) -> FakeK3s {
        FakeK3s::rendering(
            w,
            "../shared/containerd-configs/k3s-v1.29-config-v2-rendered.toml",
        )
    }

    /// A k3s with containerd 2.x whose base imports `config-v3.toml.d/*.toml`
    /// (k3s-io/k3s#13680; the rendered file of tests/fixtures/dropins).
    fn importing_dropins(w: &World) -> FakeK3s {
        FakeK3s::rendering(
            w,
            "tests/fixtures/dropins/k3s-imports-new-dir-gets-a-dropin/input/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        )
    }

    fn rendering(w: &World, base: &str) -> FakeK3s {
        let base =
            std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(base)).unwrap();
        let dir = w.root.resolve(DIR).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.toml"), &base).unwrap();
        let f = FakeK3s {
            root: w.root.clone(),
            base,
            serving: RefCell::default(),
            restarts: RefCell::default(),
            fail_restarts: vec![],
        };
        f.serving.replace(f.handlers(&f.rendered()).unwrap());
        f
    }

    /// The files of the drop-in directory (sorted, as containerd reads them).
    fn dropins(&self) -> Vec<(String, Vec<u8>)> {
        let Ok(entries) = std::fs::read_dir(self.root.resolve(format!("{DIR}/{DROPINS}")).unwrap())
        else {
            return vec![];
        };
        let mut out: Vec<(String, Vec<u8>)> = entries
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .map(|p| {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                (name, std::fs::read(&p).unwrap())
            })
            .collect();
        out.sort();
        out
    }

    fn dropin_dir_exists(&self) -> bool {
        self.root
            .resolve(format!("{DIR}/{DROPINS}"))
            .unwrap()
            .exists()
    }

    /// The CRI handlers containerd serves with `rendered` and the drop-ins it imports.
    fn handlers(&self, rendered: &[u8]) -> Result<BTreeSet<String>, String> {
        let mut out = handlers(rendered)?;
        if String::from_utf8_lossy(rendered).contains(&format!("{DROPINS}/*.toml")) {
            for (_, d) in self.dropins() {
                out.extend(handlers(&d)?);
            }
        }
        Ok(out)
    }

    fn rendered(&self) -> Vec<u8> {
        std::fs::read(self.root.resolve(format!("{DIR}/config.toml")).unwrap()).unwrap()
    }

    fn template(&self) -> Option<Vec<u8>> {
        std::fs::read(
            self.root
                .resolve(format!("{DIR}/config.toml.tmpl"))
                .unwrap(),
        )
        .ok()
    }
}

/// The CRI handlers of one config file (`Err` when containerd could not read it).
fn handlers(file: &[u8]) -> Result<BTreeSet<String>, String> {
    let doc: toml_edit::DocumentMut = String::from_utf8_lossy(file)
        .parse()
        .map_err(|e| format!("containerd cannot read its config: {e}"))?;
    let plugin = match doc.get("version").and_then(|v| v.as_integer()) {
        Some(3..) => "io.containerd.cri.v1.runtime",
        _ => "io.containerd.grpc.v1.cri",
    };
    Ok(doc["plugins"][plugin]["containerd"]["runtimes"]
        .as_table_like()
        .map(|rt| rt.iter().map(|(k, _)| k.to_string()).collect())
        .unwrap_or_default())
}

impl Restarter for &FakeK3s {
    async fn restart(&self, unit: &str) -> Result<(), NodeError> {
        self.restarts.borrow_mut().push(unit.to_string());
        if self.fail_restarts.contains(&self.restarts.borrow().len()) {
            return Err(support::live::restart_failed(unit));
        }
        let rendered = match self.template() {
            Some(t) => String::from_utf8_lossy(&t)
                .replace(BASE_LINE, &String::from_utf8_lossy(&self.base))
                .into_bytes(),
            None => self.base.clone(),
        };
        std::fs::write(
            self.root.resolve(format!("{DIR}/config.toml")).unwrap(),
            &rendered,
        )
        .unwrap();
        // containerd does not start on a config it cannot read
        let served = self
            .handlers(&rendered)
            .map_err(|_| support::live::restart_failed(unit))?;
        self.serving.replace(served);
        Ok(())
    }
}

impl HealthCheck for &FakeK3s {
    async fn prove(
        &self,
        checks: &[HandlerCheck],
    ) -> Result<Vec<CheckReport>, Vec<(String, NodeError)>> {
        let s = self.serving.borrow();
        let failed: Vec<_> = checks
            .iter()
            .filter(|c| !s.contains(&c.handler))
            .map(|c| {
                let e = NodeError::SandboxCheckFailed {
                    handler: c.handler.clone(),
                    detail: "no runtime handler".into(),
                };
                (c.handler.clone(), e)
            })
            .collect();
        if failed.is_empty() {
            Ok(vec![])
        } else {
            Err(failed)
        }
    }

    async fn sweep_checks(&self) -> Result<usize, NodeError> {
        Ok(0)
    }

    async fn sandbox_ready(&self) -> Result<(), NodeError> {
        Ok(())
    }

    async fn runtime_version(&self) -> Option<String> {
        Some("v1.7.23-k3s2".into())
    }

    async fn verify(&self, present: &[String], absent: &[String]) -> Result<(), NodeError> {
        let s = self.serving.borrow();
        match (
            present.iter().find(|h| !s.contains(*h)),
            absent.iter().find(|h| s.contains(*h)),
        ) {
            (None, None) => Ok(()),
            (Some(missing), _) => Err(NodeError::HandlerMissing {
                handler: missing.clone(),
                present: s.iter().cloned().collect(),
            }),
            (None, Some(still)) => Err(NodeError::HandlerStillServed {
                handlers: vec![still.clone()],
            }),
        }
    }
}

fn k3s_node<'a>(w: &'a World, f: &'a FakeK3s) -> Node<'a, &'a FakeK3s, &'a FakeK3s> {
    Node {
        root: &w.root,
        settings: &w.settings,
        profile: profile::builtin("k3s"),
        platform: shim_agent::artifact::node_platform(),
        origin: Origin::Static,
        restarter: f,
        health: f,
    }
}

#[test]
fn on_k3s_the_handler_goes_into_the_template_and_k3s_is_restarted() {
    let w = world();
    let f = FakeK3s::new(&w);
    let report = block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap();
    assert_eq!(report.installed, ["wasm-demo"]);
    assert_eq!(*f.restarts.borrow(), ["k3s.service"]);
    assert!(f.serving.borrow().contains("wasm-demo"));
    let tmpl = String::from_utf8(f.template().expect("template written")).unwrap();
    assert!(tmpl.contains(BASE_LINE), "{tmpl}");
    // k3s's rendered file is only ever written by k3s: its base, then our block
    let rendered = String::from_utf8(f.rendered()).unwrap();
    let at = rendered
        .find(&*String::from_utf8_lossy(&f.base))
        .expect("the base is rendered whole");
    assert!(rendered[at..].contains("# shim-agent: handler wasm-demo (begin)"));

    // nothing changed: no restart
    let report = block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap();
    assert_eq!(report.unchanged, ["wasm-demo"]);
    assert_eq!(f.restarts.borrow().len(), 1);

    // uninstall: the template the agent created goes, k3s renders its base again
    let report =
        block(k3s_node(&w, &f).apply(vec![Change::Uninstall("wasm-demo".into())])).unwrap();
    assert_eq!(report.removed, ["wasm-demo"]);
    assert_eq!(f.template(), None);
    assert_eq!(f.rendered(), f.base);
    assert!(!f.serving.borrow().contains("wasm-demo"));
}

#[test]
fn on_k3s_a_failed_restart_removes_the_template_again_and_restarts_k3s() {
    let w = world();
    let mut f = FakeK3s::new(&w);
    f.fail_restarts = vec![1];
    let e = format!(
        "{:#}",
        block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap_err()
    );
    assert!(e.contains("rolled back"), "{e}");
    assert_eq!(f.template(), None, "the created template is gone");
    assert_eq!(
        f.restarts.borrow().len(),
        2,
        "the failed one and the rollback's"
    );
    assert_eq!(f.rendered(), f.base);
}

#[test]
fn on_k3s_a_runtime_k3s_found_itself_is_left_alone() {
    // the base k3s rendered already has `spin` (k3s found containerd-shim-spin-v2 on PATH)
    let w = world();
    let f = FakeK3s::new(&w);
    let e = format!(
        "{:#}",
        block(k3s_node(&w, &f).apply(vec![shim(&w, "spin", "1")])).unwrap_err()
    );
    assert!(e.contains("spin") && e.contains("config.toml"), "{e}");
    assert_eq!(f.template(), None);
    assert!(f.restarts.borrow().is_empty(), "nothing to restart");
}

#[test]
fn on_k3s_importing_a_dropin_directory_the_handler_goes_there_and_leaves_with_it() {
    let w = world();
    let f = FakeK3s::importing_dropins(&w);
    let report = block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap();
    assert_eq!(report.installed, ["wasm-demo"]);
    assert_eq!(*f.restarts.borrow(), ["k3s.service"]);
    assert!(f.serving.borrow().contains("wasm-demo"));
    assert!(
        f.serving.borrow().contains("spin"),
        "k3s's own runtimes stay"
    );
    let names: Vec<String> = f.dropins().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["shim-agent-wasm-demo.toml"]);
    assert_eq!(f.template(), None);
    assert_eq!(f.rendered(), f.base, "the rendered file is k3s's alone");

    // an upgrade rewrites the drop-in where it is
    let report = block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "2")])).unwrap();
    assert_eq!(report.installed, ["wasm-demo"]);
    assert_eq!(f.dropins().len(), 1);

    let report =
        block(k3s_node(&w, &f).apply(vec![Change::Uninstall("wasm-demo".into())])).unwrap();
    assert_eq!(report.removed, ["wasm-demo"]);
    assert!(!f.serving.borrow().contains("wasm-demo"));
    assert!(
        !f.dropin_dir_exists(),
        "the directory the agent created goes too"
    );
    assert_eq!(f.rendered(), f.base);
}

#[test]
fn on_k3s_a_failed_restart_takes_the_new_dropin_and_its_directory_away() {
    let w = world();
    let mut f = FakeK3s::importing_dropins(&w);
    f.fail_restarts = vec![1];
    let e = format!(
        "{:#}",
        block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap_err()
    );
    assert!(e.contains("rolled back"), "{e}");
    assert!(!f.dropin_dir_exists(), "nothing new is left behind");
    assert_eq!(f.restarts.borrow().len(), 2);
}

#[test]
fn on_k3s_a_failed_uninstall_puts_the_dropin_and_its_directory_back() {
    let w = world();
    let mut f = FakeK3s::importing_dropins(&w);
    block(k3s_node(&w, &f).apply(vec![shim(&w, "wasm-demo", "1")])).unwrap();
    let before = f.dropins();
    f.fail_restarts = vec![2];
    let e = format!(
        "{:#}",
        block(k3s_node(&w, &f).apply(vec![Change::Uninstall("wasm-demo".into())])).unwrap_err()
    );
    assert!(e.contains("rolled back"), "{e}");
    assert_eq!(
        f.dropins(),
        before,
        "restored into the directory made again"
    );
    assert!(f.serving.borrow().contains("wasm-demo"));
}
