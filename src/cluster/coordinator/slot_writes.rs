//! The coordinator's rollout I/O (docs/design.md §5, §6): each Shim's slots read from the
//! cache, its slot Leases kept as [`plan_slots`] says, and the rollout part of its status. The
//! rules (where a rollout stands, who waits, what to write) are pure, in `slot_plan.rs`.
//!
//! Every write is guarded by the resourceVersion the coordinator's watch last saw; a 409 or
//! a 404 means someone moved first, and the next round (on the next watch event) plans again
//! from what it sees then.

use std::collections::BTreeSet;

use tokio::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::reflector::Store;
use kube::{Api, Client, ResourceExt};

use super::CoordinatorError;
use super::reservations::{Reservations, plan_reservations};
pub use super::slot_plan::Rollout;
use super::slot_plan::{SlotAction, narrows, plan_slots, plan_stamps, retarget, rollout_of};
use super::status::{NodeView, with_rollout};
use super::written::Written;
use crate::api::lease::ShimLease;
use crate::api::names::NAMESPACE;
use crate::api::{Shim, ShimStatus};
use crate::cluster::lease_edits;
use crate::cluster::slots::{Slot, owned_by_node, slot_index, slot_name, slot_of};

/// The slots of `shim` the coordinator sees, with their Leases.
pub fn slots_of(shim: &Shim, leases: &Store<ShimLease>) -> Vec<(Slot, ShimLease)> {
    leases
        .state()
        .iter()
        .filter_map(|l| slot_of(shim, l).map(|s| (s, (**l).clone())))
        .collect()
}

impl Rollout {
    /// The rollout of `shim` now, from the slot Leases the coordinator's cache holds
    /// ([`rollout_of`] decides); `memory` notes its slots and passes over the nodes whose
    /// reservation ran out.
    pub fn of(
        shim: &Shim,
        nodes: &[NodeView],
        leases: &Store<ShimLease>,
        memory: &mut Reservations,
        now: Instant,
    ) -> Rollout {
        let slots = slots_of(shim, leases);
        let all = leases.state();
        rollout_of(shim, nodes, slots, all.iter().map(|l| &**l), memory, now)
    }

    /// `status` with this rollout's part.
    pub fn status(
        &self,
        status: ShimStatus,
        previous: Option<&ShimStatus>,
        now: &Time,
    ) -> ShimStatus {
        let plain: Vec<Slot> = self.slots.iter().map(|(s, _)| s.clone()).collect();
        with_rollout(status, self.limits, &plain, self.halted, previous, now)
    }

    /// Make the slot Leases what the rules say. `nodes`: the Nodes that exist; `held_back`:
    /// an extension holds this generation's rollout (its slots close as in a halt);
    /// `written`: the writes made against versions the cache may still show.
    pub async fn keep_slots(
        &self,
        client: &Client,
        shim: &Shim,
        nodes: &BTreeSet<String>,
        held_back: bool,
        written: &mut Written,
    ) {
        let api = Api::<ShimLease>::namespaced(client.clone(), NAMESPACE);
        let plain: Vec<Slot> = self.slots.iter().map(|(s, _)| s.clone()).collect();
        // A holder whose Node is gone *and* whose owner reference the garbage collector
        // removed: the admission policy lets the coordinator free only such a slot.
        let gone = |s: &Slot| {
            let Some(h) = s.holder.as_deref() else {
                return false;
            };
            let lease = self.slots.iter().find(|(x, _)| x.index == s.index);
            !nodes.contains(h) && lease.is_some_and(|(_, l)| !owned_by_node(l, h))
        };
        let name = shim.name_any();
        self.delete_orphans(&api, &name).await;
        let mut actions = plan_slots(self.limits, self.halted || held_back, &plain, gone);
        // a slot whose name an orphan holds is made once the cache shows the orphan gone (a
        // create now would meet a 409 and hold the index back for `WRITTEN_FOR`)
        let taken: BTreeSet<u32> = self
            .orphans
            .iter()
            .filter_map(|l| slot_index(&name, &l.name_any()))
            .collect();
        actions.retain(|a| !matches!(a, SlotAction::Create { index, .. } if taken.contains(index)));
        actions.extend(plan_stamps(self.limits, &plain, &actions, |n, s| {
            retarget(n, s, self.targeted)
        }));
        actions.extend(self.reservations(&plain, &actions));
        let (narrowing, rest): (Vec<_>, Vec<_>) = actions.into_iter().partition(narrows);
        if self.write_all(&api, shim, &narrowing, written).await {
            self.write_all(&api, shim, &rest, written).await;
        } else {
            tracing::debug!(shim = %name, "a slot moved while N shrank: the other writes wait for the next round");
        }
    }

    /// Delete the Leases an earlier Shim named `shim` left ([`orphan_slots`]), side by side,
    /// each guarded by its UID and resourceVersion. A node that still held one for the old
    /// Shim finds it gone at its renewal and restarts nothing for a Shim that is gone.
    async fn delete_orphans(&self, api: &Api<ShimLease>, shim: &str) {
        let deletes = self.orphans.iter().map(|l| async move {
            tracing::warn!(shim = %shim, slot = %l.name_any(), holder = ?l.spec.holder_identity, "deleting a slot left by an earlier Shim of this name");
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: l.uid(),
                    resource_version: l.resource_version(),
                }),
                ..DeleteParams::default()
            };
            if let Err(e) = api.delete(&l.name_any(), &dp).await {
                CoordinatorError::Slot(e).record(&format!("{shim}: delete {}", l.name_any()));
            }
        });
        futures_util::future::join_all(deletes).await;
    }

    /// The reservation writes, on the slots below N that `planned` leaves alone.
    fn reservations(&self, plain: &[Slot], planned: &[SlotAction]) -> Vec<SlotAction> {
        let n = self.limits.slots.unwrap_or(0);
        let untouched: BTreeSet<u32> = plain
            .iter()
            .map(|s| s.index)
            .filter(|i| *i >= n || planned.iter().any(|a| a.index() == *i))
            .collect();
        plan_reservations(plain, &self.waiting, &self.expired, &untouched)
            .into_iter()
            .map(|r| SlotAction::Reserve {
                index: r.index,
                node: r.node,
                resource_version: r.resource_version,
            })
            .collect()
    }

    /// Write `actions` side by side (each guarded by its own resourceVersion), except those
    /// `written` already against the version the cache still shows; true when every one
    /// landed.
    async fn write_all(
        &self,
        api: &Api<ShimLease>,
        shim: &Shim,
        actions: &[SlotAction],
        written: &mut Written,
    ) -> bool {
        let name = &shim.name_any();
        let (waiting, todo): (Vec<&SlotAction>, Vec<&SlotAction>) =
            actions.iter().partition(|a| written.already(a));
        for action in &waiting {
            tracing::debug!(shim = %name, ?action, "written at this version already; the cache has not shown it yet");
        }
        let writes = todo
            .into_iter()
            .map(|action| async move { (action, self.write(api, shim, action).await) });
        let now = Instant::now();
        let mut landed = waiting.is_empty();
        for (action, result) in futures_util::future::join_all(writes).await {
            match result {
                Ok(()) => {
                    tracing::debug!(shim = %name, ?action, "slot written");
                    written.note(action, now);
                }
                Err(e) => {
                    if matches!(&e, kube::Error::Api(s) if s.code == 409 || s.code == 404) {
                        written.note(action, now);
                    }
                    CoordinatorError::Slot(e).record(&format!("{name}: {action:?}"));
                    landed = false;
                }
            }
        }
        landed
    }

    /// One planned write of a slot Lease (a slot no longer listed is left for the next round).
    async fn write(
        &self,
        api: &Api<ShimLease>,
        shim: &Shim,
        action: &SlotAction,
    ) -> Result<(), kube::Error> {
        let name = shim.name_any();
        let count = self.limits.slots;
        let lease = |i: u32| {
            self.slots
                .iter()
                .find(|(s, _)| s.index == i)
                .map(|(_, l)| l.clone())
        };
        let replace = |l: ShimLease| async move {
            api.replace(&l.name_any(), &PostParams::default(), &l)
                .await
                .map(|_| ())
        };
        match action {
            SlotAction::Create { index, closed } => {
                let l = lease_edits::create(shim, *index, *closed, count, self.targeted);
                api.create(&PostParams::default(), &l).await.map(|_| ())
            }
            SlotAction::Delete {
                index,
                resource_version,
            } => {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: Some(resource_version.clone()),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                api.delete(&slot_name(&name, *index), &dp).await.map(|_| ())
            }
            SlotAction::Mark { index, closed, .. } => match lease(*index) {
                Some(l) => {
                    let closed = lease_edits::close(l, *closed);
                    replace(lease_edits::stamp(closed, count, self.targeted)).await
                }
                None => Ok(()),
            },
            SlotAction::Free { index, .. } => match lease(*index) {
                Some(l) => {
                    tracing::warn!(shim = %name, slot = index, holder = ?l.spec.holder_identity, "freeing the slot of a deleted Node");
                    replace(lease_edits::free(l)).await
                }
                None => Ok(()),
            },
            SlotAction::Stamp { index, .. } => match lease(*index) {
                Some(l) => replace(lease_edits::stamp(l, count, self.targeted)).await,
                None => Ok(()),
            },
            SlotAction::Reserve { index, node, .. } => match lease(*index) {
                Some(l) => replace(lease_edits::reserve(l, node.as_deref())).await,
                None => Ok(()),
            },
        }
    }
}
