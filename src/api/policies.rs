//! The ValidatingAdmissionPolicies of `shim-agent manifests`: what RBAC cannot say (docs/design.md
//! §7). RBAC grants verbs on resources; these hold each identity to its own objects and to the
//! fields its role writes.
//!
//! - `shim-agent-shim-writes`: agents (the coordinator, in practice) add and remove only the
//!   cleanup finalizer of a Shim; spec, labels and annotations stay the operator's.
//! - `shim-agent-slot-writes`: a node agent writes only rollout slots, takes a free open slot
//!   only for itself and only when it is reserved for nobody else, frees only its own, touches only its own Node among a slot's owners,
//!   leaves another holder's renewals and failure mark alone, and changes nothing of a slot
//!   that is the coordinator's (its Shim, close mark, N, reservation, other owners).
//! - `shim-agent-node-writes`: a dedicated node identity (not the kubelet's, which
//!   NodeRestriction confines) writes only its own Node, and there only the Shim labels and
//!   the state and startup-taint annotations.
//! - `shim-agent-node-status`: a dedicated node identity writes, of its own Node's status, only
//!   the ShimsReady condition, and no metadata through the status.
//! - `shim-agent-node-taints`: the coordinator removes only the startup taint a ready Node
//!   names, and writes only the Node's reservation hint; nothing else of a Node, its
//!   metadata included, changes.
//! - `shim-agent-runtimeclass-writes`: node agents write no RuntimeClass; the coordinator
//!   writes only RuntimeClasses a Shim owns (an administrator's are never touched).
//! - `shim-agent-runtimeclass-shims` (evaluated once per Shim): a RuntimeClass the coordinator
//!   writes for a Shim has that Shim's name for it, its handler and its node label; and the
//!   RuntimeClass a Shim names can belong to no other owner.

use super::lease::NAMESPACE;
use super::lease::{
    SLOT_CLOSED, SLOT_FAILED, SLOT_FREED, SLOT_HOLDER_LABEL, SLOT_RESERVATIONS_ANNOTATION,
    SLOT_RESERVED_LABEL, SLOT_SHIM_LABEL,
};
use super::rbac::{
    AGENT_GROUP, AGENT_USER_PREFIX, COORDINATOR_GROUP, COORDINATOR_SERVICE_ACCOUNT, SERVICE_ACCOUNT,
};

pub const SHIM_WRITES_POLICY: &str = "shim-agent-shim-writes";
pub const SLOT_WRITES_POLICY: &str = "shim-agent-slot-writes";
pub const NODE_WRITES_POLICY: &str = "shim-agent-node-writes";
pub const RUNTIMECLASS_WRITES_POLICY: &str = "shim-agent-runtimeclass-writes";
pub const RUNTIMECLASS_SHIMS_POLICY: &str = "shim-agent-runtimeclass-shims";
pub const NODE_STATUS_POLICY: &str = "shim-agent-node-status";
pub const NODE_TAINTS_POLICY: &str = "shim-agent-node-taints";

use super::names::{
    API_VERSION, FINALIZER, GROUP, MANAGED_BY_LABEL as MANAGED_BY, SHIMS_READY,
    STARTUP_TAINT_ANNOTATION as STARTUP_TAINT, STATE_ANNOTATION, VERSION,
};

/// The extra a node-bound ServiceAccount token carries: the Node it is bound to.
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

fn sa(name: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{name}")
}

/// CEL: the request comes from a node agent (a kubelet, a dedicated node identity, or the
/// node agents' ServiceAccount).
fn is_node_agent() -> String {
    format!(
        "request.userInfo.username.startsWith('system:node:') || request.userInfo.groups.exists(g, g == '{AGENT_GROUP}') || request.userInfo.username == '{}'",
        sa(SERVICE_ACCOUNT)
    )
}

/// CEL: the request comes from a dedicated node identity (not a kubelet).
fn is_dedicated_node_agent() -> String {
    format!(
        "!request.userInfo.username.startsWith('system:node:') && ({})",
        is_node_agent()
    )
}

/// CEL: the request comes from a coordinator.
fn is_coordinator() -> String {
    format!(
        "request.userInfo.groups.exists(g, g == '{COORDINATOR_GROUP}') || request.userInfo.username == '{}'",
        sa(COORDINATOR_SERVICE_ACCOUNT)
    )
}

/// CEL: the node a node agent acts for (`''`: it names none, and may write nothing).
fn node_of_requester() -> String {
    let extra = format!("request.userInfo.extra[?'{NODE_NAME_EXTRA}'].orValue([])");
    format!(
        "request.userInfo.username.startsWith('system:node:') ? request.userInfo.username.substring(12) : request.userInfo.username.startsWith('{AGENT_USER_PREFIX}') ? request.userInfo.username.substring({}) : (request.userInfo.username == '{}' && {extra}.size() == 1) ? {extra}[0] : ''",
        AGENT_USER_PREFIX.len(),
        sa(SERVICE_ACCOUNT)
    )
}

fn meta(name: &str) -> serde_json::Value {
    serde_json::json!({"name": name, "labels": {"app.kubernetes.io/name": "shim-agent"}})
}

fn rules(group: &str, resource: &str, operations: &[&str]) -> serde_json::Value {
    let version = if group == GROUP { VERSION } else { "v1" };
    serde_json::json!({"resourceRules": [{
        "apiGroups": [group],
        "apiVersions": [version],
        "operations": operations,
        "resources": [resource],
    }]})
}

/// Agents add and remove only the `containerd.x-k8s.io/cleanup` finalizer of a Shim. Status is
/// a subresource and is not matched.
pub fn shim_writes() -> serde_json::Value {
    let finalizers =
        |o: &str| format!("{o}.metadata.?finalizers.orValue([]).filter(f, f != '{FINALIZER}')");
    serde_json::json!({
        "metadata": meta(SHIM_WRITES_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules(GROUP, "shims", &["UPDATE"]),
            "matchConditions": [{
                "name": "shim-agent-identity",
                "expression": format!("{} || {}", is_node_agent(), is_coordinator()),
            }],
            "validations": [
                {
                    "expression": "object.spec == oldObject.spec",
                    "message": "shim-agent identities may not change a Shim's spec",
                },
                {
                    "expression": "object.metadata.?labels.orValue({}) == oldObject.metadata.?labels.orValue({}) && object.metadata.?annotations.orValue({}) == oldObject.metadata.?annotations.orValue({})",
                    "message": "shim-agent identities may not change a Shim's labels or annotations",
                },
                {
                    "expression": format!("{} == {}", finalizers("object"), finalizers("oldObject")),
                    "message": format!("shim-agent identities may only add or remove the {FINALIZER} finalizer"),
                },
            ],
        },
    })
}

/// A node agent writes only rollout slots (the ShimLeases labelled `slot-of`), and only its
/// own. The one exception is how a deleted Node's slot is freed: the holder takes the slot
/// with its Node as an owner; when that Node is deleted, Kubernetes' garbage collector (not a
/// node) removes the dangling owner reference, and a slot whose holder is no longer among its
/// owners may be freed.
pub fn slot_writes() -> serde_json::Value {
    serde_json::json!({
        "metadata": meta(SLOT_WRITES_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules(GROUP, "shimleases", &["CREATE", "UPDATE", "DELETE"]),
            "matchConditions": [{"name": "node-agent", "expression": is_node_agent()}],
            "variables": [
                {"name": "me", "expression": node_of_requester()},
                {"name": "slot", "expression": format!("'{SLOT_SHIM_LABEL}' in (request.operation == 'DELETE' ? oldObject : object).metadata.?labels.orValue({{}})")},
                {"name": "was", "expression": "request.operation == 'CREATE' ? '' : oldObject.spec.?holderIdentity.orValue('')"},
                {"name": "now", "expression": "request.operation == 'DELETE' ? '' : object.spec.?holderIdentity.orValue('')"},
                {"name": "oldOwners", "expression": "request.operation == 'CREATE' ? [] : oldObject.metadata.?ownerReferences.orValue([]).filter(r, r.kind == 'Node').map(r, r.name)"},
                {"name": "newOwners", "expression": "request.operation == 'DELETE' ? [] : object.metadata.?ownerReferences.orValue([]).filter(r, r.kind == 'Node').map(r, r.name)"},
                {"name": "oldL", "expression": "request.operation == 'CREATE' ? {} : oldObject.metadata.?labels.orValue({})"},
                {"name": "newL", "expression": "request.operation == 'DELETE' ? {} : object.metadata.?labels.orValue({})"},
                {"name": "oldA", "expression": "request.operation == 'CREATE' ? {} : oldObject.metadata.?annotations.orValue({})"},
                {"name": "newA", "expression": "request.operation == 'DELETE' ? {} : object.metadata.?annotations.orValue({})"},
            ],
            "validations": [
                {
                    "expression": "variables.me != ''",
                    "message": format!("this identity is a shim-agent node agent but acts for no node: use the kubelet's credentials, a certificate named {AGENT_USER_PREFIX}<node>, or a token bound to the Node"),
                },
                {
                    "expression": "variables.slot",
                    "messageExpression": "'node ' + variables.me + ' may write only rollout slots, not the coordinator lease'",
                },
                {
                    "expression": "variables.was == variables.now || (variables.was == '' && variables.now == variables.me) || (variables.was == variables.me && variables.now == '') || (variables.now == '' && !(variables.was in variables.oldOwners))",
                    "messageExpression": "'node ' + variables.me + ' may take a free slot only for itself and free only its own: holder ' + (variables.was == '' ? '(none)' : variables.was) + ' -> ' + (variables.now == '' ? '(none)' : variables.now)",
                },
                {
                    "expression": "variables.newOwners.filter(n, n != variables.me) == variables.oldOwners.filter(n, n != variables.me)",
                    "messageExpression": "'node ' + variables.me + ' may add or remove only its own Node as an owner of a slot'",
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || variables.was == '' || variables.was == variables.me || variables.was != variables.now || (object.spec == oldObject.spec && object.metadata.?annotations[?'{SLOT_FAILED}'].orValue('') == oldObject.metadata.?annotations[?'{SLOT_FAILED}'].orValue(''))"),
                    "messageExpression": "'node ' + variables.me + ' may not renew or mark the slot of ' + variables.was",
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || ({} && {} && {} && {})", same_except("variables.oldL", "variables.newL", &[SLOT_HOLDER_LABEL]), same_except("variables.oldA", "variables.newA", &[SLOT_FAILED, SLOT_FREED]), same_list("ownerReferences.filter(r, r.kind != 'Node')"), same_list("finalizers")),
                    "messageExpression": format!("'node ' + variables.me + ' may change, of a slot, only its holder, the times, the {SLOT_HOLDER_LABEL} label, the {SLOT_FAILED} mark and its own Node as an owner: the Shim it belongs to, its close mark, N, its reservation and its other owners are the coordinator\\'s'"),
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || (variables.now == '' ? !('{SLOT_HOLDER_LABEL}' in variables.newL) : variables.newL[?'{SLOT_HOLDER_LABEL}'].orValue('') == variables.now) && (!('{SLOT_FREED}' in variables.newA) || ('{SLOT_FREED}' in variables.oldA && variables.oldA['{SLOT_FREED}'] == variables.newA['{SLOT_FREED}']))"),
                    "messageExpression": format!("'node ' + variables.me + ' must label a slot with its holder ({SLOT_HOLDER_LABEL}), and may remove but not write {SLOT_FREED}'"),
                },
                {
                    "expression": format!("!(variables.was == '' && variables.now != '') || variables.oldL[?'{SLOT_RESERVED_LABEL}'].orValue(variables.now) == variables.now"),
                    "messageExpression": format!("'node ' + variables.me + ' may not take a slot reserved for ' + variables.oldL[?'{SLOT_RESERVED_LABEL}'].orValue('') + ' ({SLOT_RESERVED_LABEL})'"),
                },
                {
                    "expression": format!("!(variables.was == '' && variables.now != '') || !('{SLOT_CLOSED}' in variables.oldA)"),
                    "messageExpression": format!("'node ' + variables.me + ' may not take a closed slot ({SLOT_CLOSED}: ' + variables.oldA[?'{SLOT_CLOSED}'].orValue('') + ')'"),
                },
            ],
        },
    })
}

/// CEL: maps `old` and `new` agree on every key but `except`.
fn same_except(old: &str, new: &str, except: &[&str]) -> String {
    let keys = except
        .iter()
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{new}.all(k, k in [{keys}] || (k in {old} && {old}[k] == {new}[k])) && {old}.all(k, k in [{keys}] || k in {new})"
    )
}

/// CEL: the metadata list `field` (with an optional `.filter(…)`) is the same in the update.
fn same_list(field: &str) -> String {
    let (name, rest) = field.split_once('.').unwrap_or((field, ""));
    let rest = if rest.is_empty() {
        String::new()
    } else {
        format!(".{rest}")
    };
    format!(
        "object.metadata.?{name}.orValue([]){rest} == oldObject.metadata.?{name}.orValue([]){rest}"
    )
}

/// CEL: an update leaves the object's labels, annotations, owners and finalizers as they were.
fn same_metadata() -> String {
    same_metadata_but(&[])
}

/// CEL: [`same_metadata`], except the annotations `but`.
fn same_metadata_but(but: &[&str]) -> String {
    let annotations = |o: &str| format!("{o}.metadata.?annotations.orValue({{}})");
    format!(
        "object.metadata.?labels.orValue({{}}) == oldObject.metadata.?labels.orValue({{}}) && {} && {} && {}",
        same_except(&annotations("oldObject"), &annotations("object"), but),
        same_list("ownerReferences"),
        same_list("finalizers")
    )
}

/// A dedicated node identity writes only its own Node, and there only the Shim labels
/// (`containerd.x-k8s.io/…`) and the state annotation, as NodeRestriction holds a kubelet.
pub fn node_writes() -> serde_json::Value {
    let ours = format!("k.startsWith('{GROUP}/')");
    serde_json::json!({
        "metadata": meta(NODE_WRITES_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules("", "nodes", &["CREATE", "UPDATE", "DELETE"]),
            "matchConditions": [{"name": "dedicated-node-agent", "expression": is_dedicated_node_agent()}],
            "variables": [
                {"name": "me", "expression": node_of_requester()},
                {"name": "oldL", "expression": "request.operation == 'CREATE' ? {} : oldObject.metadata.?labels.orValue({})"},
                {"name": "newL", "expression": "request.operation == 'DELETE' ? {} : object.metadata.?labels.orValue({})"},
                {"name": "oldA", "expression": "request.operation == 'CREATE' ? {} : oldObject.metadata.?annotations.orValue({})"},
                {"name": "newA", "expression": "request.operation == 'DELETE' ? {} : object.metadata.?annotations.orValue({})"},
                {"name": "mine", "expression": format!("['{STATE_ANNOTATION}', '{STARTUP_TAINT}']")},
            ],
            "validations": [
                {
                    "expression": "request.operation == 'UPDATE' && variables.me != '' && object.metadata.name == variables.me",
                    "messageExpression": "'a shim-agent node identity may update only its own Node (' + (variables.me == '' ? 'it acts for no node' : variables.me) + '), not ' + (request.operation == 'DELETE' ? oldObject : object).metadata.name",
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || (object.spec == oldObject.spec && variables.newL.all(k, {ours} || (k in variables.oldL && variables.oldL[k] == variables.newL[k])) && variables.oldL.all(k, {ours} || k in variables.newL) && variables.newA.all(k, k in variables.mine || (k in variables.oldA && variables.oldA[k] == variables.newA[k])) && variables.oldA.all(k, k in variables.mine || k in variables.newA))"),
                    "message": format!("a shim-agent node identity may change only its Node's {GROUP}/ labels and its {STATE_ANNOTATION} and {STARTUP_TAINT} annotations"),
                },
                {
                    "expression": format!("request.operation != 'UPDATE' || ({} && {})", same_list("ownerReferences"), same_list("finalizers")),
                    "message": "a shim-agent node identity may not change its Node's owners or finalizers",
                },
            ],
        },
    })
}

/// A dedicated node identity writes, of its own Node's status, only the ShimsReady condition
/// (a kubelet's own status writes are the kubelet's, under NodeRestriction).
pub fn node_status() -> serde_json::Value {
    let others = |o: &str| {
        format!("{o}.status.?conditions.orValue([]).filter(c, c.type != '{SHIMS_READY}')")
    };
    serde_json::json!({
        "metadata": meta(NODE_STATUS_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules("", "nodes/status", &["UPDATE"]),
            "matchConditions": [{"name": "dedicated-node-agent", "expression": is_dedicated_node_agent()}],
            "variables": [{"name": "me", "expression": node_of_requester()}],
            "validations": [
                {
                    "expression": "variables.me != '' && object.metadata.name == variables.me",
                    "messageExpression": "'a shim-agent node identity may update only its own Node\\'s status, not ' + object.metadata.name",
                },
                {
                    "expression": format!("{} == {} && ['capacity', 'allocatable', 'addresses', 'nodeInfo', 'daemonEndpoints', 'phase'].all(f, (f in object.status) == (f in oldObject.status) && (!(f in object.status) || object.status[f] == oldObject.status[f]))", others("object"), others("oldObject")),
                    "message": format!("a shim-agent node identity may change, of its Node's status, only the {SHIMS_READY} condition"),
                },
                {
                    "expression": same_metadata(),
                    "message": "a shim-agent node identity may not change a Node's labels, annotations, owners or finalizers through its status",
                },
            ],
        },
    })
}

/// The coordinator removes, of a Node, only the startup taint the Node's annotation names
/// (under containerd.x-k8s.io/), and only once the Node's ShimsReady condition is True, and
/// writes the Node's reservation hint ([`SLOT_RESERVATIONS_ANNOTATION`]); nothing else of the
/// Node changes.
pub fn node_taints() -> serde_json::Value {
    let taints = |o: &str| format!("{o}.spec.?taints.orValue([])");
    serde_json::json!({
        "metadata": meta(NODE_TAINTS_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules("", "nodes", &["CREATE", "UPDATE", "DELETE"]),
            "matchConditions": [{"name": "coordinator", "expression": is_coordinator()}],
            "variables": [
                {"name": "named", "expression": format!("oldObject == null ? '' : oldObject.metadata.?annotations[?'{STARTUP_TAINT}'].orValue('')")},
                {"name": "ready", "expression": format!("oldObject != null && oldObject.status.?conditions.orValue([]).exists(c, c.type == '{SHIMS_READY}' && c.status == 'True')")},
            ],
            "validations": [
                {
                    "expression": format!("request.operation == 'UPDATE' && {} && ['unschedulable', 'podCIDR', 'podCIDRs', 'providerID', 'configSource', 'externalID'].all(f, (f in object.spec) == (f in oldObject.spec) && (!(f in object.spec) || object.spec[f] == oldObject.spec[f]))", same_metadata_but(&[SLOT_RESERVATIONS_ANNOTATION])),
                    "message": format!("the shim-agent coordinator may only remove a Node's startup taint and write its {SLOT_RESERVATIONS_ANNOTATION} annotation: no create, delete, or other change"),
                },
                {
                    "expression": format!("{new}.all(t, t in {old}) && {old}.all(t, t in {new} || (variables.ready && variables.named.startsWith('{GROUP}/') && variables.named == t.key + ':' + t.effect))", new = taints("object"), old = taints("oldObject")),
                    "messageExpression": format!("'the shim-agent coordinator may remove only the startup taint the Node names in {STARTUP_TAINT} (under {GROUP}/), once its {SHIMS_READY} condition is True; not so on ' + object.metadata.name"),
                },
            ],
        },
    })
}

/// CEL: `o` is a RuntimeClass the coordinator manages: labelled, owned by a Shim.
fn shim_owned(o: &str) -> String {
    format!(
        "{o}.metadata.?labels[?'{MANAGED_BY}'].orValue('') == 'shim-agent' && {o}.metadata.?ownerReferences.orValue([]).exists(r, r.kind == 'Shim' && r.apiVersion == '{API_VERSION}')"
    )
}

/// Node agents write no RuntimeClass; the coordinator only those a Shim owns.
pub fn runtimeclass_writes() -> serde_json::Value {
    serde_json::json!({
        "metadata": meta(RUNTIMECLASS_WRITES_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": rules("node.k8s.io", "runtimeclasses", &["CREATE", "UPDATE", "DELETE"]),
            "matchConditions": [{"name": "shim-agent-identity", "expression": format!("{} || {}", is_node_agent(), is_coordinator())}],
            "validations": [
                {
                    "expression": format!("!({})", is_node_agent()),
                    "message": "shim-agent node agents may not write RuntimeClasses (only the coordinator does, for Shims)",
                },
                {
                    "expression": format!("request.operation == 'CREATE' || ({})", shim_owned("oldObject")),
                    "messageExpression": "'the coordinator may change or delete only RuntimeClasses a Shim owns, not ' + oldObject.metadata.name",
                },
                {
                    "expression": format!("request.operation == 'DELETE' || ({} && object.metadata.ownerReferences.filter(r, r.kind == 'Shim').size() == 1 && object.metadata.ownerReferences.exists(r, r.kind == 'Shim' && r.?controller.orValue(false)))", shim_owned("object")),
                    "messageExpression": "'a RuntimeClass the coordinator writes must be owned (controller) by exactly one Shim and labelled app.kubernetes.io/managed-by=shim-agent: ' + object.metadata.name",
                },
            ],
        },
    })
}

/// Evaluated once per Shim (the binding's params): a RuntimeClass owned by this Shim has the
/// name, handler and node label this Shim asks for; and the RuntimeClass this Shim names
/// belongs to no one else.
pub fn runtimeclass_shims() -> serde_json::Value {
    serde_json::json!({
        "metadata": meta(RUNTIMECLASS_SHIMS_POLICY),
        "spec": {
            "failurePolicy": "Fail",
            "paramKind": {"apiVersion": API_VERSION, "kind": "Shim"},
            "matchConstraints": rules("node.k8s.io", "runtimeclasses", &["CREATE", "UPDATE"]),
            "matchConditions": [{"name": "coordinator", "expression": is_coordinator()}],
            "variables": [
                {"name": "owners", "expression": "object.metadata.?ownerReferences.orValue([]).filter(r, r.kind == 'Shim')"},
                {"name": "handler", "expression": "params.spec.runtimeClass.?handler.orValue(params.metadata.name)"},
                {"name": "mine", "expression": "variables.owners.exists(r, r.uid == params.metadata.uid)"},
                {"name": "terms", "expression": "params.spec.runtimeClass.?scheduling.?nodeSelector.orValue({})"},
                {"name": "selector", "expression": "object.?scheduling.?nodeSelector.orValue({})"},
                {"name": "fixed", "expression": "params.spec.runtimeClass.?overhead.?podFixed.orValue({})"},
                {"name": "overhead", "expression": "object.?overhead.?podFixed.orValue({})"},
            ],
            "validations": [
                {
                    "expression": format!("!variables.owners.exists(r, r.uid == params.metadata.uid) || (object.metadata.name == params.spec.runtimeClass.name && object.handler == variables.handler && object.?scheduling.?nodeSelector.orValue({{}})[?'{GROUP}/' + params.metadata.name].orValue('') == 'true')"),
                    "messageExpression": format!("'RuntimeClass ' + object.metadata.name + ' of Shim ' + params.metadata.name + ' must be named ' + params.spec.runtimeClass.name + ', run handler ' + variables.handler + ' and select {GROUP}/' + params.metadata.name + '=true'"),
                },
                {
                    "expression": "!variables.mine || (object.?scheduling.?tolerations.orValue([]) == params.spec.runtimeClass.?scheduling.?tolerations.orValue([]) && variables.selector.size() == variables.terms.size() + 1 && variables.terms.all(k, k in variables.selector && variables.selector[k] == variables.terms[k]))",
                    "messageExpression": "'RuntimeClass ' + object.metadata.name + ' of Shim ' + params.metadata.name + ' must have the Shim\\'s tolerations and nodeSelector terms (spec.runtimeClass.scheduling), and no others'",
                },
                {
                    "expression": "!variables.mine || (variables.overhead.size() == variables.fixed.size() && variables.fixed.all(k, k in variables.overhead && quantity(string(variables.fixed[k])).compareTo(quantity(string(variables.overhead[k]))) == 0))",
                    "messageExpression": "'RuntimeClass ' + object.metadata.name + ' of Shim ' + params.metadata.name + ' must have the Shim\\'s overhead (spec.runtimeClass.overhead.podFixed), and no other'",
                },
                {
                    "expression": "params.spec.runtimeClass.name != object.metadata.name || variables.owners.exists(r, r.uid == params.metadata.uid)",
                    "messageExpression": "'RuntimeClass ' + object.metadata.name + ' is the RuntimeClass of Shim ' + params.metadata.name + ' and can belong to no other owner'",
                },
            ],
        },
    })
}

/// Every policy with the binding that makes it deny.
pub fn policies() -> Vec<(&'static str, serde_json::Value, Option<serde_json::Value>)> {
    vec![
        (SHIM_WRITES_POLICY, shim_writes(), None),
        (SLOT_WRITES_POLICY, slot_writes(), None),
        (NODE_WRITES_POLICY, node_writes(), None),
        (RUNTIMECLASS_WRITES_POLICY, runtimeclass_writes(), None),
        (NODE_STATUS_POLICY, node_status(), None),
        (NODE_TAINTS_POLICY, node_taints(), None),
        (
            RUNTIMECLASS_SHIMS_POLICY,
            runtimeclass_shims(),
            Some(serde_json::json!({"selector": {}, "parameterNotFoundAction": "Allow"})),
        ),
    ]
}
