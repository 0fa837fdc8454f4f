//! The fleet's simulated hosts and its checker: restarts counted fleet-wide and each checked
//! against the node's slot on the API server; every slot event checked as it happens.

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use shim_agent::api::lease::SLOT_TARGETED;
use shim_agent::api::lease::ShimLease;
use shim_agent::cluster::NAMESPACE;
use shim_agent::cluster::slots::{SLOT_CLOSED, SLOT_COUNT, SLOT_FREED, SLOT_SHIM_LABEL};
use shim_agent::txn::{HealthCheck, Restarter};

use super::super::live::FakeContainerd;

#[derive(Default)]
pub struct Shared {
    /// The bound a new acquisition must respect now.
    pub n: usize,
    pub restarting: usize,
    pub holders: usize,
    pub peak_restarting: usize,
    pub peak_holders: usize,
    pub restarts: usize,
    pub violations: Vec<String>,
    pub timeline: Vec<(f64, usize, usize)>,
    pub slot_events: usize,
    /// In a worker process: report restarts and violations to the parent (`procs`).
    pub relay: bool,
    /// In the parent of workers: each restart's start (+1) and end (-1) as the workers
    /// stamped them, seconds since the run began; counted in time order by `recount`.
    pub stamped: Vec<(f64, i32)>,
    /// Slot releases as the checker saw them, seconds since the run began.
    pub releases: Vec<f64>,
    /// Slot takes as the checker saw them, seconds since the run began.
    pub takes: Vec<f64>,
    /// The targeted nodes stamped on the slots as they first appeared.
    pub targeted: BTreeSet<Option<String>>,
}

impl Shared {
    /// Hand-off times, seconds: each release to the first restart that began after it and
    /// is not matched to an earlier release.
    pub fn handoffs(&self) -> Vec<f64> {
        self.matched().iter().map(|(r, s)| s - r).collect()
    }

    /// Each hand-off in two parts, seconds: release → the first take after it, and that
    /// take → the restart (hand-offs with no take seen between are left out).
    pub fn handoff_parts(&self) -> (Vec<f64>, Vec<f64>) {
        let mut takes = self.takes.clone();
        takes.sort_by(f64::total_cmp);
        let (mut j, mut to_take, mut to_restart) = (0, Vec::new(), Vec::new());
        for (r, s) in self.matched() {
            while j < takes.len() && takes[j] < r {
                j += 1;
            }
            if let Some(&t) = takes.get(j).filter(|&&t| t <= s) {
                to_take.push(t - r);
                to_restart.push(s - t);
                j += 1;
            }
        }
        (to_take, to_restart)
    }

    /// Restart ends → the first release after each (not matched to an earlier end),
    /// seconds: the node's steps after its restart, up to its slot going back.
    pub fn ends_to_release(&self) -> Vec<f64> {
        let ends = self.stamped.iter().filter(|x| x.1 < 0).map(|x| x.0);
        each_with_next(ends, self.releases.iter().copied())
            .into_iter()
            .map(|(e, r)| r - e)
            .collect()
    }

    /// (release, restart begins) pairs, in time order.
    fn matched(&self) -> Vec<(f64, f64)> {
        let starts = self.stamped.iter().filter(|x| x.1 > 0).map(|x| x.0);
        each_with_next(self.releases.iter().copied(), starts)
    }

    /// The restart counts and the timeline from the workers' stamps in time order (their
    /// reports reach the parent each through its own pipe, so arrival order could
    /// interleave one node's end after another's start).
    pub fn recount(&mut self) {
        self.stamped.sort_by(|a, b| a.0.total_cmp(&b.0));
        // holder counts as the checker saw them, with the restarts merged in
        let holders: Vec<(f64, usize)> = self.timeline.iter().map(|x| (x.0, x.2)).collect();
        let (mut restarting, mut h, mut j) = (0i64, 0usize, 0usize);
        let mut timeline = Vec::new();
        self.peak_restarting = 0;
        self.restarts = 0;
        for &(t, delta) in &self.stamped {
            while j < holders.len() && holders[j].0 <= t {
                h = holders[j].1;
                timeline.push((holders[j].0, restarting.max(0) as usize, h));
                j += 1;
            }
            restarting += i64::from(delta);
            if delta > 0 {
                self.restarts += 1;
            }
            self.peak_restarting = self.peak_restarting.max(restarting.max(0) as usize);
            timeline.push((t, restarting.max(0) as usize, h));
        }
        for &(t, hh) in &holders[j..] {
            timeline.push((t, restarting.max(0) as usize, hh));
        }
        self.restarting = restarting.max(0) as usize;
        self.timeline = timeline;
    }
}

pub type SharedRef = Arc<Mutex<Shared>>;

pub fn note(shared: &SharedRef, t0: Instant, f: impl FnOnce(&mut Shared)) {
    let mut s = shared.lock().unwrap();
    f(&mut s);
    let (r, h) = (s.restarting, s.holders);
    s.peak_restarting = s.peak_restarting.max(r);
    s.peak_holders = s.peak_holders.max(h);
    s.timeline.push((t0.elapsed().as_secs_f64(), r, h));
}

/// In a worker process, one report line to the parent on stdout (`procs::relayed`).
fn relay(shared: &SharedRef, kind: &str, what: &str) {
    if shared.lock().unwrap().relay {
        println!("{kind} {what}");
    }
}

/// One restart under way; it ends when dropped (also when the agent is killed mid-restart).
struct Restarting {
    shared: SharedRef,
    t0: Instant,
}

impl Restarting {
    fn start(shared: &SharedRef, t0: Instant) -> Restarting {
        relay(shared, "R+", &super::procs::wall_ns().to_string());
        note(shared, t0, |s| {
            s.restarting += 1;
            s.restarts += 1;
            s.stamped.push((t0.elapsed().as_secs_f64(), 1));
        });
        Restarting {
            shared: shared.clone(),
            t0,
        }
    }
}

impl Drop for Restarting {
    fn drop(&mut self) {
        relay(&self.shared, "R-", &super::procs::wall_ns().to_string());
        note(&self.shared, self.t0, |s| {
            s.restarting -= 1;
            s.stamped.push((self.t0.elapsed().as_secs_f64(), -1));
        });
    }
}

/// A simulated host: the scripted containerd of `live`, restarts counted fleet-wide, and
/// each restart checked against the node's slot on the API server.
pub struct Host {
    pub name: String,
    pub inner: FakeContainerd,
    pub shared: SharedRef,
    pub t0: Instant,
    pub slots: Api<ShimLease>,
    pub shim: String,
    /// Notified when this host's agent is to be killed (during its restart, or as the
    /// coordinator); a notification before the agent waits for it is kept.
    pub crash: Rc<tokio::sync::Notify>,
    /// How long a killed agent stays down.
    pub down_for: Cell<Duration>,
    /// This node's clock skew (as its agent writes times).
    pub skew_secs: i64,
    pub crash_on_restart: Cell<bool>,
    pub delete_on_restart: Cell<bool>,
    pub nodes: Api<KubeNode>,
}

impl Restarter for &Host {
    async fn restart(&self, unit: &str) -> Result<(), shim_agent::node::NodeError> {
        // A restart needs this node's slot, renewed right before it. The read-back runs
        // beside the restart (a harness must not lengthen the path it measures), and the
        // restart returns only once it is done, so the node cannot release meanwhile.
        let began = k8s_openapi::jiff::Timestamp::now().as_second() + self.skew_secs;
        // A deleted Node's slot is freed for another node while this host may still be
        // restarting: from then on this host is not one of the fleet's nodes.
        let deleting = self.delete_on_restart.replace(false);
        let _counted = (!deleting).then(|| Restarting::start(&self.shared, self.t0));
        let check = async {
            let lp = ListParams::default().labels(&format!("{SLOT_SHIM_LABEL}={}", self.shim));
            // Renewed by this node's own (skewed) clock within the 10 s before the restart
            // began, and not after it: how long before (`None`: it held none).
            let renewed_before = match self.slots.list(&lp).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|l| {
                        l.spec.holder_identity.as_deref() == Some(&self.name)
                            && l.annotations().get(SLOT_FREED).is_none()
                    })
                    .find_map(|l| Some(began - l.spec.renew_time.as_ref()?.0.as_second())),
                Err(_) => Some(0), // the API server is busy: cannot tell, do not count
            };
            if !renewed_before.is_some_and(|s| (0..=10).contains(&s)) {
                let why = match renewed_before {
                    Some(s) => format!("its renewal is stamped {s} s before"),
                    None => "the read-back shows it holding no slot".into(),
                };
                let v = format!(
                    "{} restarted containerd without a slot renewed just before ({why})",
                    self.name
                );
                relay(&self.shared, "V", &v);
                note(&self.shared, self.t0, |s| s.violations.push(v));
            }
        };
        let restart = async {
            if deleting {
                let _ = self
                    .nodes
                    .delete(&self.name, &DeleteParams::default())
                    .await;
            }
            if self.crash_on_restart.replace(false) {
                self.crash.notify_one();
            }
            (&self.inner).restart(unit).await
        };
        let ((), r) = tokio::join!(check, restart);
        r
    }
}

impl HealthCheck for &Host {
    async fn prove(
        &self,
        checks: &[shim_agent::node::check::HandlerCheck],
    ) -> Result<Vec<shim_agent::node::check::CheckReport>, Vec<(String, shim_agent::node::NodeError)>>
    {
        (&self.inner).prove(checks).await
    }

    async fn sweep_checks(&self) -> Result<usize, shim_agent::node::NodeError> {
        (&self.inner).sweep_checks().await
    }

    async fn sandbox_ready(&self) -> Result<(), shim_agent::node::NodeError> {
        (&self.inner).sandbox_ready().await
    }

    async fn runtime_version(&self) -> Option<String> {
        (&self.inner).runtime_version().await
    }

    async fn verify(
        &self,
        present: &[String],
        absent: &[String],
    ) -> Result<(), shim_agent::node::NodeError> {
        (&self.inner).verify(present, absent).await
    }
}

/// Watch the slots; keep the holder count and check each change.
pub async fn checker(
    client: Client,
    shim: String,
    deleted: BTreeSet<String>,
    shared: SharedRef,
    t0: Instant,
) {
    let api: Api<ShimLease> = Api::namespaced(client, NAMESPACE);
    let cfg = watcher::Config::default().labels(&format!("{SLOT_SHIM_LABEL}={shim}"));
    let mut stream = watcher(api, cfg).applied_objects().boxed();
    let mut seen: BTreeMap<String, (String, Option<String>)> = BTreeMap::new();
    let mut bound = Bound::default();
    while let Some(Ok(l)) = stream.next().await {
        let holder = l.spec.holder_identity.clone().unwrap_or_default();
        let closed = l.annotations().get(SLOT_CLOSED).cloned();
        let stamp = l.annotations().get(SLOT_COUNT).and_then(|c| c.parse().ok());
        let n_of_claim = bound.see(&l.name_any(), stamp);
        let before = seen.insert(l.name_any(), (holder.clone(), closed.clone()));
        let all_halted =
            !seen.is_empty() && seen.values().all(|(_, c)| c.as_deref() == Some("halted"));
        let mut s = shared.lock().unwrap();
        s.slot_events += 1;
        if before.is_none() {
            s.targeted
                .insert(l.annotations().get(SLOT_TARGETED).cloned());
        }
        let (was, was_closed) = before.unwrap_or_default();
        if was.is_empty() && !holder.is_empty() && was_closed.is_some() {
            s.violations.push(format!(
                "{holder} took {} while it was closed ({was_closed:?})",
                l.name_any()
            ));
        }
        if !was.is_empty() && holder.is_empty() {
            s.releases.push(t0.elapsed().as_secs_f64());
            let freed_by_other = l.annotations().get(SLOT_FREED) == Some(&was);
            if freed_by_other && !deleted.contains(&was) {
                s.violations.push(format!(
                    "the slot of live node {was} was freed by someone else"
                ));
            }
        }
        if was.is_empty() && !holder.is_empty() {
            s.takes.push(t0.elapsed().as_secs_f64());
        }
        if all_halted && was.is_empty() && !holder.is_empty() {
            s.violations
                .push(format!("{holder} took a slot after the halt"));
        }
        s.holders = seen.values().filter(|(h, _)| !h.is_empty()).count();
        let n = n_of_claim.unwrap_or(s.n);
        if was.is_empty() && !holder.is_empty() && s.holders > n {
            let h = s.holders;
            s.violations
                .push(format!("{holder} took a slot: {h} holders > N = {n}"));
        }
        drop(s);
        note(&shared, t0, |_| {});
    }
}

/// The N a claim is held to, from the coordinator's stamps (`slot-count`) in the slots' own
/// event order (one watch: no race with the status). Nodes never change a stamp, so a stamp
/// that changes is the coordinator enacting an N. A claim on a slot stamped with the latest
/// N is held to it; one on a slot still stamped with an older N was planned under that N
/// (the coordinator stamps the open slots only once it has closed what a smaller N takes
/// away), so it is held to the larger of the two.
#[derive(Default)]
struct Bound {
    stamps: BTreeMap<String, usize>,
    latest: Option<usize>,
}

impl Bound {
    fn see(&mut self, slot: &str, stamp: Option<usize>) -> Option<usize> {
        let c = stamp?;
        if self.stamps.insert(slot.to_string(), c) != Some(c) {
            self.latest = Some(c);
        }
        let latest = self.latest.unwrap_or(c);
        Some(if c == latest { c } else { c.max(latest) })
    }
}

/// Each time of `from`, in time order, with the first time of `to` at or after it not paired
/// with an earlier one (a `from` with none left is dropped).
fn each_with_next(
    from: impl Iterator<Item = f64>,
    to: impl Iterator<Item = f64>,
) -> Vec<(f64, f64)> {
    let mut from: Vec<f64> = from.collect();
    from.sort_by(f64::total_cmp);
    let mut to: Vec<f64> = to.collect();
    to.sort_by(f64::total_cmp);
    let (mut j, mut out) = (0, Vec::new());
    for f in from {
        while j < to.len() && to[j] < f {
            j += 1;
        }
        if let Some(&t) = to.get(j) {
            out.push((f, t));
            j += 1;
        }
    }
    out
}
