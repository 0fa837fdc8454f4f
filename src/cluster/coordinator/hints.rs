//! The coordinator's writes of reservation hints ([`crate::cluster::reservation_hints`]): each
//! Node is pointed at the slots reserved for it, as the slot cache shows them. A hint follows
//! its reservation by one round (the reservation's own write brings the event that starts
//! it); a reservation is made while the slot is still held, so the node watches its slot
//! before the release it waits for.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node as KubeNode;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use super::error::CoordinatorError;
use super::written::WRITTEN_FOR;
use crate::api::lease::ShimLease;
use crate::cluster::reservation_hints::{self, Hints};

/// The hints written that the Node cache may not show yet: node -> (hints, when). A write is
/// not made again with the same hints until the cache shows them, or [`WRITTEN_FOR`] passed
/// (under load the Node watch lags by seconds and rounds run every few tens of milliseconds).
#[derive(Debug, Default)]
pub struct Hinted(BTreeMap<String, (Hints, Instant)>);

impl Hinted {
    fn already(&self, node: &str, hints: &Hints, now: Instant) -> bool {
        self.0
            .get(node)
            .is_some_and(|(h, at)| h == hints && now.duration_since(*at) < WRITTEN_FOR)
    }
}

/// Point every Node at the slots reserved for it, side by side.
pub async fn point_nodes(
    client: &Client,
    nodes: &Store<KubeNode>,
    leases: &Store<ShimLease>,
    hinted: &mut Hinted,
) {
    let slots = leases.state();
    let wanted = reservation_hints::wanted(slots.iter().map(|l| &**l));
    let now = Instant::now();
    let none = Hints::new();
    let todo: Vec<(String, Hints, serde_json::Value)> = nodes
        .state()
        .iter()
        .filter_map(|n| {
            let name = n.name_any();
            let want = wanted.get(&name);
            let patch = reservation_hints::patch(n, want)?;
            let want = want.unwrap_or(&none).clone();
            (!hinted.already(&name, &want, now)).then_some((name, want, patch))
        })
        .collect();
    hinted
        .0
        .retain(|_, (_, at)| now.duration_since(*at) < WRITTEN_FOR);
    let api = Api::<KubeNode>::all(client.clone());
    let writes = todo.into_iter().map(|(name, want, patch)| {
        let api = api.clone();
        async move {
            let r = api
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            (name, want, r)
        }
    });
    for (name, want, r) in futures_util::future::join_all(writes).await {
        match r {
            Ok(_) => {
                tracing::debug!(node = %name, hints = ?want, "node pointed at its reserved slots");
                hinted.0.insert(name, (want, now));
            }
            Err(e) => CoordinatorError::ReservationHint(e).record(&format!("node {name}")),
        }
    }
}
