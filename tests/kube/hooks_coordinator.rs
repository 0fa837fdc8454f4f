//! BeforeRollout and the coordinator, on the real API server: an approval or a refusal
//! persisted in the Shim's status survives a coordinator failover (the extension is not asked
//! twice for a generation, and a refused one stays halted), and a slow extension holds only its own Shim's rollout, not the coordinator's
//! loop. Test extensions over HTTPS on loopback (tests/support/hookserver).

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::{Patch, PatchParams};
use shim_agent::api::Shim;
use shim_agent::cluster::coordinator;

use crate::support;
use crate::support::agent_rig::{Rig, cluster_node, fast};
use crate::support::hooks_kube::{extension, script};
use crate::support::hookserver::{Call, HookServer, failure, success};
use crate::support::kube::{KubeEnv, SERIAL, eventually};
use crate::support::live::{World, fake, shim_builder};

const BR: &str = "BeforeRolloutRequest";

/// A Shim `name` for the Nodes labelled `selector`, labelled `fleet: <name>` (what the test
/// extensions select).
fn labelled_shim(w: &World, name: &str, selector: (&str, &str)) -> String {
    shim_builder(w, name, "1")
        .label("fleet", name)
        .node_selector(selector.0, selector.1)
        .yaml()
}

fn before_rollout_calls(server: &HookServer) -> Vec<Call> {
    server
        .calls()
        .into_iter()
        .filter(|c| c.kind == BR)
        .collect()
}

async fn coordinator_holder(env: &KubeEnv) -> Option<String> {
    support::agent_rig::coordinator_holder(&env.admin_client().await).await
}

/// Until `identity` holds the coordinator Lease.
async fn leads(env: &KubeEnv, identity: &str) {
    eventually(30, &format!("coordinator {identity} leading"), || async {
        (coordinator_holder(env).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

/// Coordinators `a` and `b` while `body` runs: `a` wins the first election (`b` contends
/// once `a` leads, as every other agent does); `body` is handed the means to kill `a` (a
/// crash: no release) and `b` is killed when `body` ends.
async fn failover<F: std::future::Future<Output = ()>>(
    env: &KubeEnv,
    a: &str,
    b: &str,
    body: impl FnOnce(tokio::sync::oneshot::Sender<()>) -> F,
) {
    let (kill_a_tx, kill_a) = tokio::sync::oneshot::channel::<()>();
    let (kill_b_tx, kill_b) = tokio::sync::oneshot::channel::<()>();
    let run_b = async {
        leads(env, a).await;
        coordinator_until(env, b, kill_b).await
    };
    let body = async {
        body(kill_a_tx).await;
        let _ = kill_b_tx.send(());
    };
    tokio::join!(coordinator_until(env, a, kill_a), run_b, body);
}

/// Run a coordinator as `identity` until `kill` fires (its future dropped: no release, as a
/// crash).
async fn coordinator_until(
    env: &KubeEnv,
    identity: &str,
    kill: tokio::sync::oneshot::Receiver<()>,
) {
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let client = env.admin_client().await;
    tokio::select! {
        () = coordinator::run(client, identity.into(), fast(), stop) => {}
        _ = kill => {}
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_approval_outlives_a_coordinator_failover_and_a_new_generation_is_asked_again() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("hooks-failover").await else {
        return;
    };
    let env = rig.env;
    let run = "hooks-failover";
    rig.force_delete(run).await;
    let server = HookServer::start(script(|c, _| success(&c.kind))).await;
    let _ext = extension(env, run, &server, "[{name: BeforeRollout}]");
    let shims: Api<Shim> = Api::all(rig.admin.clone());
    // no Node matches: only the coordinator's part is under test
    let (ok, out) = env.apply(&labelled_shim(&rig.w, run, ("no-such-node", "true")));
    assert!(ok, "{out}");

    failover(env, "hooks-co-a", "hooks-co-b", |kill_a| async move {
        // coordinator a asks once and persists the approval of generation 1
        leads(env, "hooks-co-a").await;
        eventually(
            20,
            "the approval of generation 1 in the Shim's status",
            || async {
                let s = shims.get(run).await.ok()?;
                (s.status?.approved_generation == Some(1)).then_some(())
            },
        )
        .await;
        assert_eq!(before_rollout_calls(&server).len(), 1);
        // a dies; b takes over
        let _ = kill_a.send(());
        leads(env, "hooks-co-b").await;
        // b reconciles at once once its caches synced; it must not ask for generation 1
        tokio::time::sleep(Duration::from_secs(3)).await;
        let calls = before_rollout_calls(&server);
        assert_eq!(
            calls.len(),
            1,
            "generation 1 was asked again after the failover: {calls:?}"
        );
        // a new generation is asked (by b)
        let patch = serde_json::json!({"spec": {"nodeSelector": {"no-such-node": "still"}}});
        shims
            .patch(run, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let calls = eventually(20, "BeforeRollout for generation 2", || async {
            let c = before_rollout_calls(&server);
            (c.len() >= 2).then_some(c)
        })
        .await;
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert_eq!(calls[1].body["generation"], 2);
        eventually(20, "the approval of generation 2", || async {
            let s = shims.get(run).await.ok()?;
            (s.status?.approved_generation == Some(2)).then_some(())
        })
        .await;
    })
    .await;
    rig.force_delete(run).await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_refusal_outlives_a_coordinator_failover_without_asking_again() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("hooks-refusal").await else {
        return;
    };
    let env = rig.env;
    let run = "hooks-refusal";
    rig.force_delete(run).await;
    let server = HookServer::start(script(|c, _| failure(&c.kind, "change freeze"))).await;
    let _ext = extension(env, run, &server, "[{name: BeforeRollout}]");
    let shims: Api<Shim> = Api::all(rig.admin.clone());
    let (ok, out) = env.apply(&labelled_shim(&rig.w, run, ("no-such-node", "true")));
    assert!(ok, "{out}");
    let halted_by_refusal = |s: &Shim| {
        let st = s.status.as_ref()?;
        let c = st.conditions.as_ref()?.iter().find(|c| {
            c.type_ == "RolloutHalted" && c.reason.as_deref() == Some("ExtensionRefused")
        })?;
        (st.refused_generation == Some(1) && c.status == "True").then(|| c.message.clone())
    };

    failover(env, "hooks-rf-a", "hooks-rf-b", |kill_a| async move {
        leads(env, "hooks-rf-a").await;
        let message = eventually(20, "the refusal of generation 1 in the status", || async {
            halted_by_refusal(&shims.get(run).await.ok()?)
        })
        .await;
        assert!(
            message
                .as_deref()
                .unwrap_or_default()
                .contains("change freeze"),
            "{message:?}"
        );
        assert_eq!(before_rollout_calls(&server).len(), 1);
        let _ = kill_a.send(());
        leads(env, "hooks-rf-b").await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let calls = before_rollout_calls(&server);
        assert_eq!(
            calls.len(),
            1,
            "generation 1 was asked again after the failover: {calls:?}"
        );
        let s = shims.get(run).await.unwrap();
        assert!(
            halted_by_refusal(&s).is_some(),
            "still halted by the refusal under b: {:?}",
            s.status
        );
    })
    .await;
    rig.force_delete(run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_before_rollout_holds_only_its_shim_while_another_rolls_out_at_once() {
    let _serial = SERIAL.lock().await;
    let (Some(a), Some(b)) = (
        Rig::new("hooks-slow-a").await,
        Rig::new("hooks-slow-b").await,
    ) else {
        return;
    };
    let env = a.env;
    let (shim_a, shim_b) = ("hooks-slow-a", "hooks-slow-b");
    a.force_delete(shim_a).await;
    a.force_delete(shim_b).await;
    const SLOW: Duration = Duration::from_secs(8);
    let server = HookServer::start(script(|c, _| {
        let mut r = success(&c.kind);
        r.delay = SLOW;
        r
    }))
    .await;
    // the extension selects Shim a only (fleet: hooks-slow-a)
    let _ext = extension(
        env,
        shim_a,
        &server,
        "[{name: BeforeRollout, timeoutSeconds: 20}]",
    );
    let (fa, fb) = (fake(&a.w), fake(&b.w));
    let (na, nb) = (cluster_node(&a.w, &fa), cluster_node(&b.w, &fb));
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let agent_a = shim_agent::cluster::session::run(&na, a.config(), stop.clone());
    let agent_b = shim_agent::cluster::session::run(&nb, b.config(), stop.clone());
    let body = async {
        eventually(30, "a coordinator", || coordinator_holder(env)).await;
        let (ok, out) = env.apply(&labelled_shim(&a.w, shim_a, ("test", "hooks-slow-a")));
        assert!(ok, "{out}");
        // the coordinator is asking about Shim a now (8 s to the answer)
        let asked = eventually(20, "BeforeRollout for Shim a", || async {
            before_rollout_calls(&server).first().cloned()
        })
        .await;
        let answer_at = asked.at + SLOW;
        let applied = Instant::now();
        let (ok, out) = env.apply(&labelled_shim(&b.w, shim_b, ("test", "hooks-slow-b")));
        assert!(ok, "{out}");
        eventually(20, "Shim b installed on its node", || async {
            (b.label(shim_b).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        let labelled = Instant::now();
        eprintln!(
            "Shim b labelled {:?} after its apply; Shim a's answer due in {:?}",
            labelled - applied,
            answer_at.saturating_duration_since(labelled)
        );
        assert!(
            labelled < answer_at,
            "Shim b waited for Shim a's BeforeRollout call ({:?} after its apply)",
            labelled - applied
        );
        assert_eq!(
            a.label(shim_a).await,
            None,
            "Shim a rolled out before its extension answered"
        );
        // Shim a goes on once its extension said Success
        eventually(30, "Shim a installed after its answer", || async {
            (a.label(shim_a).await.as_deref() == Some("true")).then_some(())
        })
        .await;
        assert!(Instant::now() >= answer_at);
        assert!(
            before_rollout_calls(&server)
                .iter()
                .all(|c| c.body["shims"][0]["name"] == shim_a),
            "the extension was asked about Shim b"
        );
        let _ = stop_tx.send(true);
    };
    let (ra, rb, ()) = tokio::join!(agent_a, agent_b, body);
    ra.expect("agent a");
    rb.expect("agent b");
    a.force_delete(shim_a).await;
    a.force_delete(shim_b).await;
}
