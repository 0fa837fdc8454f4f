//! What the agent tells the outside about its work, process-wide: stable journal
//! `MESSAGE_ID`s, Prometheus metrics, and the one-line activity behind systemd's `STATUS=`.
//!
//! The core (the transaction engine, the rollout gate, the watches) records here; the service
//! shell (`service/`) serves the metrics, sends the activity to systemd and writes the logs.
//! Nothing here blocks or fails: a metric or a status line is never worth a failed install.

use std::collections::BTreeSet;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio::sync::watch;

/// Stable journal `MESSAGE_ID`s (`journalctl MESSAGE_ID=…`), one per kind of outcome. They
/// never change: scripts and alerts depend on them.
pub mod message_id {
    /// A Shim was installed or upgraded: containerd serves its handler (per Shim).
    pub const INSTALLED: &str = "dde55bace32f4adebc31a2a46492d292";
    /// A Shim was uninstalled (per Shim).
    pub const REMOVED: &str = "951234a001264399ba12750645e95fff";
    /// A transaction failed; what follows is its rollback (per Shim).
    pub const FAILED: &str = "1d4db5324f4c4ed7b31ba4581cf054b6";
    /// A transaction was rolled back: containerd runs the previous configuration (per Shim).
    pub const ROLLED_BACK: &str = "f25dc2e5a9f448b398a3268b67842133";
    /// Even the rollback failed: containerd is unhealthy, the journal stays open (per Shim).
    pub const ROLLBACK_FAILED: &str = "759102d1f53b473c90c1bce356e1ea74";
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TxnLabels {
    kind: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    watch: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookLabels {
    hook: &'static str,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabels {
    step: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShimLabels {
    shim: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShimStateLabels {
    shim: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckLabels {
    result: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckStepLabels {
    step: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HookNameLabels {
    hook: &'static str,
}

/// The agent's metrics, in one registry.
pub struct Metrics {
    registry: Registry,
    transactions: Family<TxnLabels, Counter>,
    rollbacks: Counter,
    restarts: Family<ResultLabels, Counter>,
    phase_seconds: Family<PhaseLabels, Histogram>,
    slot_wait_seconds: Histogram,
    watch_restarts: Family<WatchLabels, Counter>,
    shims_installed: Gauge,
    retained_versions: Family<ShimLabels, Gauge>,
    retained_tasks: Family<ShimLabels, Gauge>,
    coordinator_errors: Family<StepLabels, Counter>,
    hook_calls: Family<HookLabels, Counter>,
    hook_seconds: Family<HookNameLabels, Histogram>,
    runtime_checks: Family<CheckLabels, Counter>,
    signatures: Family<CheckLabels, Counter>,
    runtime_check_seconds: Family<CheckStepLabels, Histogram>,
    shims_set_aside: Gauge,
    shim_nodes: Family<ShimStateLabels, Gauge>,
    rollout_halted: Family<ShimLabels, Gauge>,
    /// The Shims [`shim_statuses`] last reported, whose series go when they do.
    reported_shims: Mutex<BTreeSet<String>>,
}

fn seconds_buckets() -> Histogram {
    // 1 ms … about 9 min
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shim_agent");
        let transactions = Family::<TxnLabels, Counter>::default();
        registry.register(
            "transactions",
            "Node transactions that ended, by kind (install, upgrade, uninstall) and result (committed, rolled_back, aborted, broken)",
            transactions.clone(),
        );
        let rollbacks = Counter::default();
        registry.register(
            "rollbacks",
            "Transactions rolled back after a failure",
            rollbacks.clone(),
        );
        let restarts = Family::<ResultLabels, Counter>::default();
        registry.register(
            "containerd_restarts",
            "containerd restarts over systemd, by result (ok, failed)",
            restarts.clone(),
        );
        let phase_seconds =
            Family::<PhaseLabels, Histogram>::new_with_constructor(seconds_buckets as fn() -> _);
        registry.register(
            "phase_duration_seconds",
            "Time spent in each phase of a transaction",
            phase_seconds.clone(),
        );
        let slot_wait_seconds = seconds_buckets();
        registry.register(
            "slot_wait_seconds",
            "Time a transaction waited for its rollout slots",
            slot_wait_seconds.clone(),
        );
        let watch_restarts = Family::<WatchLabels, Counter>::default();
        registry.register(
            "watch_restarts",
            "Kubernetes watches that failed and were restarted with backoff, by watch",
            watch_restarts.clone(),
        );
        let shims_installed = Gauge::default();
        registry.register(
            "shims_installed",
            "Shims installed on this node",
            shims_installed.clone(),
        );
        let retained_versions = Family::<ShimLabels, Gauge>::default();
        registry.register(
            "retained_versions",
            "Replaced or removed shim versions kept on disk because containerd tasks run through them, by Shim",
            retained_versions.clone(),
        );
        let retained_tasks = Family::<ShimLabels, Gauge>::default();
        registry.register(
            "retained_tasks",
            "containerd tasks that run through a retained shim version (why it is kept), by Shim",
            retained_tasks.clone(),
        );
        let coordinator_errors = Family::<StepLabels, Counter>::default();
        registry.register(
            "coordinator_errors",
            "Coordinator writes that failed, by step (finalizer, runtime_class, status) and reason (Conflict, NotFound, Forbidden, Invalid, Unavailable, Other)",
            coordinator_errors.clone(),
        );
        let hook_calls = Family::<HookLabels, Counter>::default();
        registry.register(
            "hook_calls",
            "Calls of ShimExtension hooks, by hook and result (Success, Deferred, Failure, Ignored)",
            hook_calls.clone(),
        );
        let hook_seconds =
            Family::<HookNameLabels, Histogram>::new_with_constructor(seconds_buckets as fn() -> _);
        registry.register(
            "hook_duration_seconds",
            "Latency of ShimExtension hook calls, by hook",
            hook_seconds.clone(),
        );
        let runtime_checks = Family::<CheckLabels, Counter>::default();
        registry.register(
            "runtime_checks",
            "Checks that a new shim works before it is committed (the preflight of its binary, a pod sandbox through its handler, its check container), by result (passed, failed) and reason (MissingLibraries, ShimDoesNotRun, NoSandboxImage, SandboxCheckFailed, CheckImageUnavailable, ContainerCheckFailed, ...)",
            runtime_checks.clone(),
        );
        let signatures = Family::<CheckLabels, Counter>::default();
        registry.register(
            "signature_checks",
            "Signatures of shims checked before anything changes, by result (verified, refused) and reason (SignerIdentityMismatch, NoSignedTime, SignatureRequiredByNode, SignatureRefusedByNode, ...)",
            signatures.clone(),
        );
        let runtime_check_seconds = Family::<CheckStepLabels, Histogram>::new_with_constructor(
            seconds_buckets as fn() -> _,
        );
        registry.register(
            "runtime_check_duration_seconds",
            "Time of the passed runtime checks, by step (sandbox: RunPodSandbox to ready; container: the check container; total: the whole check with its cleanup)",
            runtime_check_seconds.clone(),
        );
        let shims_set_aside = Gauge::default();
        registry.register(
            "shims_set_aside",
            "Shims this agent sets aside (reason AgentCrashed) because it crashed twice while working on them, until their spec changes",
            shims_set_aside.clone(),
        );
        let shim_nodes = Family::<ShimStateLabels, Gauge>::default();
        registry.register(
            "shim_nodes",
            "Nodes of each Shim as its status counts them, by state (targeted, installed, failed, updating); served by the elected coordinator",
            shim_nodes.clone(),
        );
        let rollout_halted = Family::<ShimLabels, Gauge>::default();
        registry.register(
            "rollout_halted",
            "1 while a Shim's RolloutHalted condition is True (too many failures, or an extension refused), else 0; served by the elected coordinator",
            rollout_halted.clone(),
        );
        Metrics {
            shims_set_aside,
            shim_nodes,
            rollout_halted,
            reported_shims: Mutex::default(),
            registry,
            runtime_checks,
            signatures,
            runtime_check_seconds,
            hook_calls,
            hook_seconds,
            transactions,
            rollbacks,
            restarts,
            phase_seconds,
            slot_wait_seconds,
            watch_restarts,
            shims_installed,
            retained_versions,
            retained_tasks,
            coordinator_errors,
        }
    }

    /// The text exposition format (`text/plain; version=0.0.4` with the OpenMetrics EOF).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // writing into a String cannot fail
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// The retained versions now: (Shim name, tasks using the version), one entry per version.
/// Shims with none are dropped from the gauges.
pub fn retained(versions: &[(String, usize)]) {
    let m = metrics();
    m.retained_versions.clear();
    m.retained_tasks.clear();
    for (shim, tasks) in versions {
        let labels = ShimLabels {
            shim: crate::text::clip(shim, 253),
        };
        m.retained_versions.get_or_create(&labels).inc();
        m.retained_tasks
            .get_or_create(&labels)
            .inc_by(i64::try_from(*tasks).unwrap_or(i64::MAX));
    }
}

/// A coordinator write failed.
pub fn coordinator_error(step: &'static str, reason: &'static str) {
    metrics()
        .coordinator_errors
        .get_or_create(&StepLabels { step, reason })
        .inc();
}

/// A transaction ended (`kind`: install, upgrade, uninstall; `result`: committed,
/// rolled_back, aborted, broken).
pub fn transaction_ended(kind: &'static str, result: &'static str) {
    metrics()
        .transactions
        .get_or_create(&TxnLabels { kind, result })
        .inc();
    if result == "rolled_back" {
        metrics().rollbacks.inc();
    }
}

/// containerd was restarted (or the restart failed).
pub fn containerd_restarted(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics()
        .restarts
        .get_or_create(&ResultLabels { result })
        .inc();
}

/// Time spent in one phase of a transaction.
pub fn phase_took(phase: &str, d: Duration) {
    metrics()
        .phase_seconds
        .get_or_create(&PhaseLabels {
            phase: phase.to_string(),
        })
        .observe(d.as_secs_f64());
}

/// Time a transaction waited for its rollout slots.
pub fn slot_waited(d: Duration) {
    metrics().slot_wait_seconds.observe(d.as_secs_f64());
}

/// The Shims the agent sets aside now, after it crashed working on them.
pub fn set_aside(shims: usize) {
    metrics()
        .shims_set_aside
        .set(i64::try_from(shims).unwrap_or(i64::MAX));
}

/// A Shim's rollout as its status says it, for the coordinator's gauges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShimRollout {
    pub shim: String,
    pub targeted: i32,
    pub installed: i32,
    pub failed: i32,
    pub updating: i32,
    /// Its `RolloutHalted` condition is True.
    pub halted: bool,
}

/// Every Shim's rollout as the API server holds its status (the elected coordinator's cache,
/// each round): its node counts, and whether it is halted. A Shim no longer listed (deleted,
/// its finalizer gone) loses its series.
pub fn shim_statuses(shims: impl IntoIterator<Item = ShimRollout>) {
    let m = metrics();
    let mut reported = m
        .reported_shims
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    let mut now = BTreeSet::new();
    for r in shims {
        let shim = crate::text::clip(&r.shim, 253);
        for (state, n) in [
            ("targeted", r.targeted),
            ("installed", r.installed),
            ("failed", r.failed),
            ("updating", r.updating),
        ] {
            let labels = ShimStateLabels {
                shim: shim.clone(),
                state,
            };
            m.shim_nodes.get_or_create(&labels).set(i64::from(n));
        }
        let halted = r.halted;
        m.rollout_halted
            .get_or_create(&ShimLabels { shim: shim.clone() })
            .set(i64::from(halted));
        now.insert(shim);
    }
    for gone in reported.difference(&now) {
        forget_shim(m, gone);
    }
    *reported = now;
}

/// This process is no longer the coordinator: the next leader reports the Shims.
pub fn coordinator_stepped_down() {
    let m = metrics();
    let mut reported = m
        .reported_shims
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    for gone in reported.iter() {
        forget_shim(m, gone);
    }
    reported.clear();
}

fn forget_shim(m: &Metrics, shim: &str) {
    for state in ["targeted", "installed", "failed", "updating"] {
        m.shim_nodes.remove(&ShimStateLabels {
            shim: shim.to_string(),
            state,
        });
    }
    m.rollout_halted.remove(&ShimLabels {
        shim: shim.to_string(),
    });
}

/// A ShimExtension hook was called (`result` after its failure policy).
pub fn hook_called(hook: &'static str, result: &'static str, took: Duration) {
    metrics()
        .hook_calls
        .get_or_create(&HookLabels { hook, result })
        .inc();
    metrics()
        .hook_seconds
        .get_or_create(&HookNameLabels { hook })
        .observe(took.as_secs_f64());
}

/// A runtime check ended: `reason` is empty when it passed.
pub fn runtime_checked(reason: &'static str) {
    let result = if reason.is_empty() {
        "passed"
    } else {
        "failed"
    };
    metrics()
        .runtime_checks
        .get_or_create(&CheckLabels { result, reason })
        .inc();
}

/// A shim's signature was checked: verified (`reason` empty) or refused for `reason`.
pub fn signature_checked(reason: &'static str) {
    let result = if reason.is_empty() {
        "verified"
    } else {
        "refused"
    };
    metrics()
        .signatures
        .get_or_create(&CheckLabels { result, reason })
        .inc();
}

/// How long a passed runtime check's `step` took (`sandbox`, `container`, `total`).
pub fn runtime_check_took(step: &'static str, d: Duration) {
    metrics()
        .runtime_check_seconds
        .get_or_create(&CheckStepLabels { step })
        .observe(d.as_secs_f64());
}

/// A watch failed and is being retried.
pub fn watch_restarted(watch: &'static str) {
    metrics()
        .watch_restarts
        .get_or_create(&WatchLabels { watch })
        .inc();
}

/// What the agent is doing now, for `systemctl status` (systemd's `STATUS=`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Activity {
    /// How many times the agent became ready (recovered its journal and synced its
    /// watches): each one is a `READY=1` to systemd.
    pub readied: u64,
    /// Shims installed on this node.
    pub installed: usize,
    /// The work under way, e.g. "waiting for a slot for spin-v0-15-1".
    pub doing: Option<String>,
    /// Shims whose last change failed.
    pub failing: Vec<String>,
}

impl Activity {
    /// The status line: "2 shims installed, waiting for a slot for spin-v0-15-1".
    pub fn line(&self) -> String {
        let mut out = match self.installed {
            0 => "no shims installed".to_string(),
            1 => "1 shim installed".to_string(),
            n => format!("{n} shims installed"),
        };
        if let Some(d) = &self.doing {
            out.push_str(", ");
            out.push_str(d);
        }
        if !self.failing.is_empty() {
            out.push_str(&format!("; failing: {}", self.failing.join(", ")));
        }
        out
    }
}

static ACTIVITY: LazyLock<watch::Sender<Activity>> =
    LazyLock::new(|| watch::Sender::new(Activity::default()));

/// Follow the activity (the service sends each new line to systemd).
pub fn activity() -> watch::Receiver<Activity> {
    ACTIVITY.subscribe()
}

fn update_activity(f: impl FnOnce(&mut Activity)) {
    ACTIVITY.send_if_modified(|a| {
        let before = a.clone();
        f(a);
        *a != before
    });
}

/// The agent is ready: journal recovered, watches synced (again, after a reload).
pub fn ready() {
    update_activity(|a| a.readied += 1);
}

/// Say what is under way (`None`: nothing).
pub fn doing(what: Option<String>) {
    update_activity(|a| a.doing = what);
}

/// Say how many shims are installed and which are failing.
pub fn settled(installed: usize, failing: Vec<String>) {
    metrics().shims_installed.set(installed as i64);
    update_activity(|a| {
        a.installed = installed;
        a.failing = failing;
    });
}

/// A list of names for a status line: "a", "a and b", "a, b and 1 more".
pub fn names(list: &[String]) -> String {
    match list {
        [] => String::new(),
        [a] => a.clone(),
        [a, b] => format!("{a} and {b}"),
        [a, b, rest @ ..] => format!("{a}, {b} and {} more", rest.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_line_says_what_is_installed_and_under_way() {
        let mut a = Activity::default();
        assert_eq!(a.line(), "no shims installed");
        a.installed = 2;
        a.doing = Some("waiting for a slot for spin-v0-15-1".into());
        assert_eq!(
            a.line(),
            "2 shims installed, waiting for a slot for spin-v0-15-1"
        );
        a.installed = 1;
        a.doing = None;
        a.failing = vec!["kata".into()];
        assert_eq!(a.line(), "1 shim installed; failing: kata");
    }

    #[test]
    fn names_are_listed_shortly() {
        let n = |v: &[&str]| names(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(n(&[]), "");
        assert_eq!(n(&["a"]), "a");
        assert_eq!(n(&["a", "b"]), "a and b");
        assert_eq!(n(&["a", "b", "c", "d"]), "a, b and 2 more");
    }

    #[test]
    fn metrics_are_exposed_with_the_agent_prefix() {
        transaction_ended("install", "committed");
        transaction_ended("upgrade", "rolled_back");
        containerd_restarted(true);
        phase_took("restarted", Duration::from_millis(70));
        set_aside(2);
        let halted = ShimRollout {
            shim: "spin".into(),
            targeted: 5,
            installed: 3,
            updating: 1,
            failed: 1,
            halted: true,
        };
        let gone = ShimRollout {
            shim: "gone".into(),
            ..ShimRollout::default()
        };
        shim_statuses([halted.clone(), gone]);
        shim_statuses([halted]);
        let text = metrics().encode();
        assert!(
            !text.contains("shim=\"gone\""),
            "a Shim no longer listed keeps series:\n{text}"
        );
        for want in [
            "shim_agent_transactions_total{kind=\"install\",result=\"committed\"}",
            "shim_agent_transactions_total{kind=\"upgrade\",result=\"rolled_back\"}",
            "shim_agent_rollbacks_total",
            "shim_agent_containerd_restarts_total{result=\"ok\"}",
            "shim_agent_phase_duration_seconds_count{phase=\"restarted\"} 1",
            "shim_agent_slot_wait_seconds_count",
            "shim_agent_shims_installed",
            "shim_agent_shims_set_aside 2",
            "shim_agent_shim_nodes{shim=\"spin\",state=\"targeted\"} 5",
            "shim_agent_shim_nodes{shim=\"spin\",state=\"installed\"} 3",
            "shim_agent_shim_nodes{shim=\"spin\",state=\"failed\"} 1",
            "shim_agent_shim_nodes{shim=\"spin\",state=\"updating\"} 1",
            "shim_agent_rollout_halted{shim=\"spin\"} 1",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }
}
