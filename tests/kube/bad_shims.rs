//! Bad Shims end as a condition with a clear reason and message, never a crash or a retry
//! storm, and do not hold back a good Shim that arrives with them. On the real API server.

use std::time::Duration;

use k8s_openapi::api::node::v1::RuntimeClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::support;
use crate::support::agent_rig::{Rig, with_agent};
use crate::support::kube::{SERIAL, eventually};
use crate::support::live::{fake, shim_yaml};
use crate::support::shim_builder::ShimBuilder;
use crate::support::{Entry, Route, TestServer, foreign_elf, sha256_hex, tar_gz};

fn yaml(name: &str, location: &str, sha: &str, selector: (&str, &str)) -> String {
    ShimBuilder::new(name)
        .node_selector(selector.0, selector.1)
        .artifact(location, sha)
        .yaml()
}

const NAMES: &[&str] = &[
    "kb-good",
    "kb-404",
    "kb-digest",
    "kb-arch",
    "kb-clash",
    "kb-rc",
    "kb-nowhere",
    "kb-unicode",
];

/// An archive of files with long non-ASCII names and no shim binary: its failure message
/// lists them, well past the 1000 bytes of an Event note (the agent once cut the note at a
/// byte inside a character, and panicked on every start).
fn unicode_names_no_shim() -> Vec<u8> {
    let entries: Vec<Entry> = (0..30)
        .map(|i| {
            let name = format!("файл-{i:02}-{}", "ü🎉".repeat(8));
            Entry::File(Box::leak(name.into_boxed_str()), b"x".to_vec(), 0o644)
        })
        .collect();
    tar_gz(&entries)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_bad_shim_ends_as_a_condition_with_its_reason_and_the_good_one_still_installs() {
    let _serial = SERIAL.lock().await;
    let Some(rig) = Rig::new("kb-bad").await else {
        return;
    };
    for n in NAMES {
        rig.force_delete(n).await;
    }
    let sel = ("test", "kb-bad");
    // a handler the node owner wrote himself, with other settings
    let cfg = rig.w.root.resolve("/etc/containerd/config.toml").unwrap();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.kb-clash]\n  runtime_type = \"io.containerd.mine.v1\"\n");
    std::fs::write(&cfg, text).unwrap();
    let f = fake(&rig.w);
    // a RuntimeClass of the same name that someone else owns
    let rcs: Api<RuntimeClass> = Api::all(rig.admin.clone());
    let taken: RuntimeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        "metadata": {"name": "kb-rc"}, "handler": "someone-elses",
    }))
    .unwrap();
    rcs.create(&PostParams::default(), &taken).await.unwrap();

    let server = TestServer::start();
    server.route("/missing.tgz", Route::status(404, "no such file"));
    let good = tar_gz(&[Entry::File(
        "containerd-shim-x-v2",
        support::real_elf(),
        0o755,
    )]);
    let (good_url, _) = support::file_url(&rig.w.art, "good.tgz", &good);
    let foreign = tar_gz(&[Entry::File("containerd-shim-x-v2", foreign_elf(), 0o755)]);
    let (foreign_url, _) = support::file_url(&rig.w.art, "foreign.tgz", &foreign);
    let good_sha = sha256_hex(&good);
    let unicode = unicode_names_no_shim();
    let (unicode_url, _) = support::file_url(&rig.w.art, "unicode.tgz", &unicode);
    let docs = [
        shim_yaml(&rig.w, "kb-good", "1", sel),
        // a digest no other Shim has: the store would otherwise already hold it (content
        // addressed) and need no download
        yaml(
            "kb-404",
            &server.url("/missing.tgz"),
            &sha256_hex(b"never served"),
            sel,
        ),
        yaml("kb-digest", &good_url, &"0".repeat(64), sel),
        yaml("kb-arch", &foreign_url, &sha256_hex(&foreign), sel),
        yaml("kb-clash", &good_url, &good_sha, sel),
        yaml("kb-rc", &good_url, &good_sha, sel),
        yaml("kb-nowhere", &good_url, &good_sha, ("test", "nowhere")),
        yaml("kb-unicode", &unicode_url, &sha256_hex(&unicode), sel),
    ];
    let expect = [
        ("kb-404", "Degraded", "HttpStatus", "404"),
        ("kb-digest", "Degraded", "DigestMismatch", "kb-bad-node"),
        ("kb-arch", "Degraded", "WrongArchitecture", "kb-bad-node"),
        ("kb-clash", "Degraded", "HandlerConflict", "kb-clash"),
        (
            "kb-rc",
            "Ready",
            "RuntimeClassConflict",
            "does not belong to this Shim",
        ),
        ("kb-nowhere", "Ready", "NoTargetedNodes", "matches no node"),
        ("kb-unicode", "Degraded", "NoShimBinary", "файл-00-ü🎉"),
    ];
    with_agent(&rig, &f, || async {
        let (ok, out) = rig.env.apply(&docs.join("---\n"));
        assert!(ok, "{out}");
        eventually(60, "the good Shim Ready", || async {
            (rig.condition("kb-good", "Ready").await?.0 == "True").then_some(())
        })
        .await;
        for (shim, type_, reason, text) in expect {
            let msg = eventually(60, &format!("{shim}: {type_} {reason}"), || async {
                let s = rig.shim(shim).await?;
                let c = s
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == type_ && c.reason.as_deref() == Some(reason))?;
                c.message
            })
            .await;
            assert!(msg.contains(text), "{shim}: {msg:?} lacks {text:?}");
        }
        // the failure went out as an Event on the Shim with its reason
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(rig.admin.clone(), "default");
        eventually(30, "an InstallFailed Event for kb-digest", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .iter()
                .any(|e| {
                    e.reason.as_deref() == Some("InstallFailed")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("kb-digest")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.starts_with("DigestMismatch"))
                })
                .then_some(())
        })
        .await;
        // the long Unicode failure went out too, clipped on a character boundary
        eventually(30, "an InstallFailed Event for kb-unicode", || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items.iter().find_map(|e| {
                let note = e.note.as_deref()?;
                (e.reason.as_deref() == Some("InstallFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("kb-unicode")
                    && note.starts_with("NoShimBinary")
                    && note.len() <= 1000
                    && note.contains("файл"))
                .then_some(())
            })
        })
        .await;
        // capped backoff, not a retry storm: a failing Shim is tried again after 10 s at the
        // earliest (and a 404 is not retried within an attempt)
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            server.hits("/missing.tgz") <= 2,
            "hits: {}",
            server.hits("/missing.tgz")
        );
    })
    .await;
    assert!(f.serving.borrow().contains("kb-good"));
    assert!(
        f.serving.borrow().contains("kb-rc"),
        "the node side of kb-rc works"
    );
    for n in NAMES {
        rig.force_delete(n).await;
    }
    let _ = rcs.delete("kb-rc", &DeleteParams::default()).await;
}
