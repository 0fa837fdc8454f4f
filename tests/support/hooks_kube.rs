//! Helpers of the lifecycle-hook tests on the real API server: a ShimExtension selecting a
//! fleet run's Shim (deleted on drop), scripts, node names, and the Events on a Node.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use shim_agent::api::extension::{HookResult, ShimExtension};

use super::hookserver::{Call, HookServer, Reply, Script};
use super::kube::KubeEnv;

pub const BNR: &str = "BeforeNodeRestartRequest";
pub const ANC: &str = "AfterNodeChangeRequest";

/// A ShimExtension selecting the fleet `run`'s Shim, deleted again on drop.
pub struct Extension<'e> {
    pub env: &'e KubeEnv,
    pub name: String,
}

impl Drop for Extension<'_> {
    fn drop(&mut self) {
        let _ = self
            .env
            .kubectl(&["delete", "shimextension", &self.name, "--ignore-not-found"]);
    }
}

pub fn extension<'e>(
    env: &'e KubeEnv,
    run: &str,
    server: &HookServer,
    hooks: &str,
) -> Extension<'e> {
    let ca = server.ca_bundle();
    let yaml = format!(
        "apiVersion: containerd.x-k8s.io/v1alpha1\nkind: ShimExtension\nmetadata: {{name: {run}}}\nspec:\n  clientConfig: {{url: \"{}\", caBundle: {ca}}}\n  hooks: {hooks}\n  shimSelector: {{matchLabels: {{fleet: {run}}}}}\n",
        server.url()
    );
    let (ok, out) = env.apply(&yaml);
    assert!(ok, "{out}");
    Extension {
        env,
        name: run.into(),
    }
}

/// A sample of the agent's metrics as its metrics endpoint serves them (the telemetry registry,
/// encoded in the Prometheus text format): the value of the line starting with `series`
/// (`name{labels}`), 0 when there is none yet.
pub fn metric(series: &str) -> f64 {
    shim_agent::telemetry::metrics()
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `status.hooks` of extension `name`: its entry for `hook`, once it is there (`secs` at most).
pub async fn hook_status(env: &KubeEnv, name: &str, hook: &str, secs: u64) -> HookResult {
    let api: Api<ShimExtension> = Api::all(env.admin_client().await);
    super::kube::eventually(
        secs,
        &format!("{hook} in status.hooks of {name}"),
        || async {
            let ext = api.get(name).await.ok()?;
            ext.status?
                .hooks
                .into_iter()
                .find(|h| h.name.as_str() == hook)
        },
    )
    .await
}

pub fn script(f: impl Fn(&Call, usize) -> Reply + Send + Sync + 'static) -> Script {
    Arc::new(f)
}

pub fn node(run: &str, i: usize) -> String {
    format!("{run}-{i}")
}

/// The notes of Events with `reason` on Node `node` since `since`.
pub async fn events(env: &KubeEnv, node: &str, reason: &str, since: Instant) -> Vec<String> {
    let api: Api<Event> = Api::namespaced(env.admin_client().await, "default");
    let age = since.elapsed();
    let cutoff = k8s_openapi::jiff::Timestamp::now()
        - k8s_openapi::jiff::SignedDuration::try_from(age).unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().is_some_and(|r| {
                    r.kind.as_deref() == Some("Node") && r.name.as_deref() == Some(node)
                })
                && e.event_time.as_ref().is_some_and(|t| t.0 >= cutoff)
        })
        .filter_map(|e| e.note)
        .collect()
}
