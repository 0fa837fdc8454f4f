//! What a round plans from, as the round and the Node's report both read it: the Shims (the
//! cluster's, the node's static ones), the pods, the Shims held back, and the Shims' change
//! counter that ends a wait for a first slot.

use crate::api::Shim;
use crate::cluster::target::{Inputs, PodUse};
use crate::state::NodeState;

/// What a round plans from: the Shims (the cluster's, the node's static ones), the pods and
/// the Shims held back.
pub(super) struct RoundView<'r> {
    pub(super) cluster: &'r [Shim],
    pub(super) statics: &'r [Shim],
    pub(super) statics_ok: bool,
    pub(super) pods: &'r [PodUse],
    pub(super) held: &'r std::collections::BTreeSet<String>,
    /// The Shims' change counter as of the read: a change ends the wait for a first slot.
    pub(super) specs: tokio::sync::watch::Receiver<u64>,
}

impl<'r> RoundView<'r> {
    /// What the planner reads for this node: the round's Shims, pods and held-back Shims,
    /// with the Node's labels and the node's state.
    pub(super) fn inputs(
        &self,
        node_labels: &'r std::collections::BTreeMap<String, String>,
        state: &'r NodeState,
    ) -> Inputs<'r> {
        Inputs {
            node_labels,
            cluster: self.cluster,
            statics: self.statics,
            statics_ok: self.statics_ok,
            state,
            pods: self.pods,
            held: self.held,
        }
    }
}
