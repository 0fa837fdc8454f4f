//! A round's Events, pure: what each change says, and the writes that carry it. Every change
//! has its Event on its Shim; the Node gets one Event per kind of outcome (type and reason)
//! per round, naming the Shims it is about, instead of one per Shim: a 50-Shim batch wrote 100
//! Events, half of them on the Node, beside the next node's slot claims and labels at the API
//! server. A change whose Shim is gone (an uninstall once the Shim was deleted), or alone in its
//! kind, keeps its own Event on the Node, with its whole note.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

/// Shim names listed at most in a Node Event for many Shims; the rest are counted.
const NAMES_LISTED: usize = 20;

/// One change's Event (its type, reason and note; the reason is its action too): about
/// `node`, and about its Shim when that still exists.
#[derive(Debug, Clone)]
struct Told {
    shim: String,
    type_: EventType,
    reason: String,
    note: String,
    node: ObjectReference,
    on_shim: Option<ObjectReference>,
}

impl Told {
    fn event(&self) -> Event {
        crate::events::event(self.type_, &self.reason, &self.reason, &self.note)
    }

    fn same_kind(&self, other: &Told) -> bool {
        self.type_ == other.type_ && self.reason == other.reason
    }
}

/// The Events of one round, in the order the changes told them.
#[derive(Debug, Default)]
pub struct RoundEvents {
    told: Vec<Told>,
}

impl RoundEvents {
    /// `shim`'s Event of `type_` with `reason` and `note`, about `node` and its Shim
    /// (`on_shim`: `None` when the Shim is gone).
    pub fn tell(
        &mut self,
        shim: &str,
        (type_, reason, note): (EventType, &str, String),
        node: ObjectReference,
        on_shim: Option<ObjectReference>,
    ) {
        self.told.push(Told {
            shim: shim.to_string(),
            type_,
            reason: reason.to_string(),
            note,
            node,
            on_shim,
        });
    }

    /// The writes, emptying the round: each Shim's Event, and on the Node one Event per type and
    /// reason among the changes whose Shim exists (or the change's own, when it is the only one
    /// of its kind), then one per change whose Shim is gone. In the order told.
    pub fn take_writes(&mut self) -> Vec<(Event, Vec<ObjectReference>)> {
        let told = std::mem::take(&mut self.told);
        let mut writes = Vec::with_capacity(told.len() + 1);
        // the kinds of the Events on the Node, in the order first told, with their changes
        let mut kinds: Vec<Vec<&Told>> = Vec::new();
        for t in &told {
            match &t.on_shim {
                Some(s) => {
                    writes.push((t.event(), vec![s.clone()]));
                    match kinds.iter_mut().find(|k| k[0].same_kind(t)) {
                        Some(k) => k.push(t),
                        None => kinds.push(vec![t]),
                    }
                }
                None => writes.push((t.event(), vec![t.node.clone()])),
            }
        }
        for kind in kinds {
            let first = kind[0];
            let event = match kind.as_slice() {
                [one] => one.event(),
                many => for_many(first, many.iter().map(|t| t.shim.as_str())),
            };
            writes.push((event, vec![first.node.clone()]));
        }
        writes
    }
}

/// The Node's Event for the changes of one kind: its reason, and the Shims it is about, in
/// name order.
fn for_many<'s>(like: &Told, shims: impl ExactSizeIterator<Item = &'s str>) -> Event {
    let n = shims.len();
    let mut all: Vec<&str> = shims.collect();
    all.sort_unstable();
    let listed = &all[..n.min(NAMES_LISTED)];
    let more = match n - listed.len() {
        0 => String::new(),
        k => format!(" and {k} more"),
    };
    let note = format!(
        "{} for {n} Shims: {}{more}; each Shim's own Event says more",
        like.reason,
        listed.join(", ")
    );
    crate::events::event(like.type_, &like.reason, &like.reason, &note)
}

#[cfg(test)]
#[path = "round_events_tests.rs"]
mod tests;
