//! The Kubernetes side of the agent (docs/design.md §1, §2, §5, §6, §7), by role.
//!
//! - [`agent`]: the node's agent: watches, rounds (plan, gate, transact, report), its memory,
//!   the Node's labels and state, and its rollout slot gate ([`agent::gate`]);
//! - [`coordinator`]: the cluster-wide work of the elected coordinator: election, the pure
//!   plan of each Shim, status, and the slot writes;
//! - the protocol both share, here: [`slots`] (pure: slot rules), [`reservations`] (pure:
//!   which waiting node each slot is kept for), [`reservation_hints`] (pure: how a node
//!   learns of its reservation, on its Node), [`lease_edits`] (every
//!   edit of a slot Lease), [`nodestate`] (the per-node state annotation), [`target`] (which
//!   Shims a node runs), [`connect`] (kubeconfig, node name, rotating credentials),
//!   [`watch`] (reflectors that nudge a round), [`api_answer`] (what a failed request's
//!   answer means), and [`session`] (`shim-agent run` with a
//!   cluster: the agent, and the coordinator when this node has a coordinator identity).
//!
//! Agents never write a Shim's spec or status per node: every agent watches every Shim (its
//! metadata, the spec read per generation), so per-node writes there would cost N² watch
//! events. Per-node state lives on the agent's own
//! Node; only the coordinator writes a Shim (its finalizer and status).

pub mod agent;
pub mod api_answer;
pub mod connect;
pub mod coordinator;
pub mod lease_edits;
pub mod nodestate;
pub mod readiness;
pub mod reservation_hints;
pub mod session;
pub mod slots;
pub mod target;
pub mod transport;
pub mod watch;

pub use crate::api::names::{
    CONTROL_PLANE_LABEL, COORDINATOR_LEASE, FIELD_MANAGER, FINALIZER, GROUP, MANAGED_BY_LABEL,
    NAMESPACE, STATE_ANNOTATION, node_label,
};
