# shellcheck shell=bash
# shellcheck disable=SC2034  # E2E_FAILED_CONTEXT: read by tests/e2e/run
# What only the end-to-end test needs, on top of the local cluster of scripts/lib/cluster.sh
# (shared with scripts/demo): its kube env, the gVisor artifact, the signing (a private authority
# playing Fulcio, the node's signature policy), a busybox pod, the node's state annotation, pod
# logs.
# Source it from bash with `set -euo pipefail`; call e2e_cleanup from an EXIT trap.
#
# The kube env, E2E_KUBE_ENV:
#   shared (default)  the one the cargo tests use: the instance KUBE_ENV_NAME and its ports name
#                     (unset: the default one, as scripts/test leaves them), started if it is down
#                     and stopped again at exit, else taken as it runs: up.sh adds the scheduler
#                     (only the missing components start; the one this run added is stopped at
#                     exit), and an API server started without a kubelet client certificate
#                     (scripts/test's) is restarted with one (kubectl logs). Through this
#                     repository's .ci/kube-env scripts (kubelet-node.sh prepare/join), whatever
#                     KUBE_ENV_DIR names: the same instance by its name, state and ports.
#   own               an instance of its own, wiped at exit, to run beside cargo tests at work:
#                     KUBE_ENV_NAME=e2e KUBE_ENV_PORT=6643 KUBE_ENV_ETCD_PORT=23990
#                     KUBE_ENV_ETCD_PEER_PORT=24000 KUBE_ENV_KCM_PORT=10457 KUBE_ENV_SCHED_PORT=10459
# Shared, one after the other as scripts/test runs them (cargo test has finished; each suite
# only after the other): what the e2e makes is named e2e-* (Shims, RuntimeClasses, Nodes, pods)
# and removed by name at exit and before it starts (e2e_sweep_*), never by wiping the instance;
# its Shims select every node, so they go first. Its coordinator is the manifests' Deployment
# (scripts/lib/cluster.sh: one replica, only on the e2e's own nodes, which carry the label
# shim-agent.dev/cluster=e2e), run by the deployment and replicaset controllers: the cargo tests'
# controller manager runs without them, so it is restarted with them and started again as it
# was at exit. The Deployment's pod takes the cluster's one coordinator Lease while it runs and
# releases it on SIGTERM (a node removed: its pod deleted first; at exit the Deployment is
# deleted); meanwhile it tends every Shim, as any coordinator does (finalizer, status, rollout
# slots), others' too. What the cargo tests leave (their Nodes, Shims that select only their own
# nodes) does not reach its nodes; what would (a Shim without a nodeSelector, a ShimExtension
# without a shimSelector, left by a failed cargo test) stops it at the start with their names
# (e2e_foreign_objects). Not safe: running it while cargo tests use the same instance (their
# coordinators and its would share the Lease; it stops first when it sees another client of that
# API server: e2e_shared_env_idle), and an e2e killed with SIGKILL (its Shims stay and reach the
# next cargo tests' nodes: any e2e run removes them first thing, or `kubectl delete shims` them;
# its Deployment stays too, its pod Pending: only the e2e's nodes take it).
# Both ways, its kubelets listen on KUBELET_PORT=10650 KUBELET_HEALTHZ_PORT=10648 (beside the node
# env's), and E2E_WORK is its work folder (default /var/tmp/shim-agent-e2e).

E2E_KUBE_ENV=${E2E_KUBE_ENV:-shared}
case $E2E_KUBE_ENV in
  shared) ;;
  own)
    export KUBE_ENV_NAME=e2e KUBE_ENV_PORT=6643 KUBE_ENV_ETCD_PORT=23990 KUBE_ENV_ETCD_PEER_PORT=24000
    export KUBE_ENV_KCM_PORT=10457 KUBE_ENV_SCHED_PORT=10459
    CLUSTER_KUBE_OWN=1 ;;
  *) echo "E2E_KUBE_ENV=$E2E_KUBE_ENV: shared (the default) or own" >&2; exit 2 ;;
esac
export KUBELET_PORT=${KUBELET_PORT:-10650} KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10648}
E2E_WORK=${E2E_WORK:-/var/tmp/shim-agent-e2e}
CLUSTER_NAME=e2e CLUSTER_WORK=$E2E_WORK
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/cluster.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/cluster.sh"
E2E_FAILED_CONTEXT="" # the node to describe when something fails

# --- a shared kube env: the e2e's objects by name, and the objects of others that would reach it
# e2e_sweep_shims: its Shims, deleted and their finalizers dropped (no node or coordinator of
# this run is left to clear them). First at exit: they select every node, the cargo tests' too.
e2e_sweep_shims() {
  local s
  if [ "$E2E_KUBE_ENV" != shared ] || [ -z "$CLUSTER_KUBECONFIG" ]; then return 0; fi
  for s in $(k get shims -o name 2>/dev/null | grep '/e2e-'); do
    k delete "$s" --wait=false >/dev/null 2>&1 || true
    k patch "$s" --type=merge -p '{"metadata":{"finalizers":null}}' >/dev/null 2>&1 || true
  done
}
# e2e_sweep_nodes: its pods, RuntimeClasses and Nodes, once its kubelets stopped (a running
# kubelet registers its Node again).
e2e_sweep_nodes() {
  local kind names
  if [ "$E2E_KUBE_ENV" != shared ] || [ -z "$CLUSTER_KUBECONFIG" ]; then return 0; fi
  mapfile -t names < <(k get pods -n default -o name 2>/dev/null | grep '/e2e-')
  [ ${#names[@]} = 0 ] || k delete -n default "${names[@]}" --force --grace-period=0 >/dev/null 2>&1 || true
  for kind in runtimeclasses nodes; do
    mapfile -t names < <(k get "$kind" -o name 2>/dev/null | grep '/e2e-')
    [ ${#names[@]} = 0 ] || k delete "${names[@]}" --wait=false >/dev/null 2>&1 || true
  done
}
# e2e_foreign_objects: prints the objects of others in the kube env that would reach this run, one
# a line: Shims without a nodeSelector (its nodes would install them) and ShimExtensions without a
# shimSelector (their hooks would hold its Shims' rollouts).
e2e_foreign_objects() {
  k get shims,shimextensions -o json | python3 -c '
import json, sys
for o in json.load(sys.stdin)["items"]:
    meta, spec = o["metadata"], o.get("spec") or {}
    if meta["name"].startswith("e2e-") or meta.get("deletionTimestamp"):
        continue
    sel = spec.get("shimSelector") or {}
    if o["kind"] == "Shim" and not spec.get("nodeSelector"):
        print("Shim %s (no nodeSelector: every node)" % meta["name"])
    elif o["kind"] == "ShimExtension" and not sel.get("matchLabels") and not sel.get("matchExpressions"):
        print("ShimExtension %s (no shimSelector: every Shim)" % meta["name"])'
}
# e2e_shared_env_check: in a shared kube env, what an earlier run left (killed) removed, and a
# stop naming what others left that would reach this run.
e2e_shared_env_check() {
  local foreign
  [ "$E2E_KUBE_ENV" = shared ] || return 0
  e2e_sweep_shims; e2e_sweep_nodes
  foreign=$(e2e_foreign_objects) || fail "cannot list the Shims and ShimExtensions"
  [ -z "$foreign" ] || fail "kube env ${KUBE_ENV_NAME:-default} holds objects that would reach the e2e's nodes or Shims: $(echo "$foreign" | paste -sd';' | sed 's/;/; /g'). Delete them, or run with E2E_KUBE_ENV=own"
}
# e2e_shared_env_idle: in a shared kube env that runs, a stop before anything is changed (the API
# server restarted, the coordinator Lease taken) while another client talks to its API server
# (cargo tests at work), sampled over 3 s: its own components aside, any TCP client of the port.
# E2E_KUBE_ENV_IDLE=1 (scripts/test, its cargo tests done) skips it.
e2e_shared_env_idle() {
  local port=${KUBE_ENV_PORT:-6443} users=""
  if [ "$E2E_KUBE_ENV" != shared ] || [ "${E2E_KUBE_ENV_IDLE:-0}" = 1 ] ||
    ! cluster_kube_pid kube-apiserver >/dev/null; then return 0; fi
  for _ in 1 2 3 4 5 6; do
    users+=$(ss -Htnp state established "( dport = :$port )" | grep -o 'users:(("[^"]*",pid=[0-9]*' |
      grep -vE '"(kube-apiserver|kube-controller|kube-scheduler)"' || true)$'\n'
    sleep 0.5
  done
  users=$(sed -n 's/users:(("\(.*\)",pid=/\1 pid /p' <<<"$users" | sort -u | paste -sd, -)
  [ -z "$users" ] || fail "kube env ${KUBE_ENV_NAME:-default} on port $port is in use by: $users. Run with E2E_KUBE_ENV=own, or when it is idle"
}
# Everything this run started or made: in a shared kube env its Shims first, then the
# coordinator's Deployment, then the nodes stopped, then its Nodes, pods and RuntimeClasses; then
# the control plane (see the header).
e2e_cleanup() {
  e2e_sweep_shims
  [ "$E2E_KUBE_ENV" != shared ] || cluster_coordinator_remove
  cluster_stop_nodes
  e2e_sweep_nodes
  cluster_stop_control_plane
  rm -rf "$E2E_WORK"
}

# e2e_gvisor_artifact RUNC_SHIM: gVisor's runsc (Debian's) with RUNC_SHIM (the node's own
# containerd line's runc shim) and a launcher, one .tar.gz of four files; prints its path.
e2e_gvisor_artifact() {
  RUNC_SHIM=$1 "$CLUSTER_REPO/tests/shims/build-runsc-artifact" || fail "tests/shims/build-runsc-artifact failed"
}

# node_field NODE SHIM FIELD: that field of Shim SHIM's entry in Node NODE's state annotation
# (phase, reason, message, signed, ...), empty when absent
node_field() {
  k get node "$1" -o 'jsonpath={.metadata.annotations.containerd\.x-k8s\.io/shim-state}' 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read().strip(); print(json.loads(t).get(sys.argv[1],{}).get(sys.argv[2],"") if t else "")' "$2" "$3"
}
# the phase of Shim $2 in Node $1's state annotation
node_phase() { node_field "$1" "$2" phase; }
phase_is() { [ "$(node_phase "$1" "$2")" = "$3" ]; }
# --- signed shims: a private certificate authority playing Fulcio (tests/shims/sign-release) ---
# The signer of every e2e artifact: runwasi's release workflow and its issuer, as runwasi's own
# releases name them (docs/node-owners.md's example), vouched for by the e2e's authority.
E2E_SIGNER=https://github.com/containerd/runwasi/.github/workflows/action-build.yml@refs/heads/main
E2E_ISSUER=https://token.actions.githubusercontent.com
E2E_SIGNING=$E2E_WORK/signing
# e2e_signing_init: the authority and its trusted root ($E2E_SIGNING/trusted_root.json).
e2e_signing_init() {
  "$CLUSTER_REPO/tests/shims/sign-release" "$E2E_SIGNING" init "$E2E_SIGNER" "$E2E_ISSUER" || fail "sign-release init"
}
# e2e_sign_runwasi TARBALL MEMBER: prints the path of TARBALL repacked as runwasi packs its
# releases: MEMBER with MEMBER.sig and MEMBER.pem beside it (no bundle: no signed time).
e2e_sign_runwasi() {
  local out=$E2E_SIGNING/${1##*/}
  out=${out%.tar.gz}-signed.tar.gz
  "$CLUSTER_REPO/tests/shims/sign-release" "$E2E_SIGNING" runwasi "$1" "$2" "$out" || fail "sign-release runwasi $1"
  echo "$out"
}
# e2e_node_requires_signatures ROOT: the node policy baked into the image: every Shim must be
# signed by runwasi's workflow, against the e2e's trusted root; no signed time needed (runwasi's
# .sig and .pem carry none).
e2e_node_requires_signatures() {
  mkdir -p "$1/etc/shim-agent/config.d"
  cp "$E2E_SIGNING/trusted_root.json" "$1/etc/shim-agent/e2e-trusted-root.json"
  cat >"$1/etc/shim-agent/config.d/50-signatures.toml" <<TOML
[signatures]
require = true
trusted-root = "/etc/shim-agent/e2e-trusted-root.json"
allow-without-signed-time = true
identities = [{ identity = "$E2E_SIGNER", issuer = "$E2E_ISSUER" }]
TOML
}
# e2e_signature_yaml runwasi MEMBER | url LOCATION: a Shim's `signature` (appended to
# cluster_shim_yaml's): runwasi's layout, MEMBER signed inside the artifact; or the artifact
# itself signed, its .sig and .pem beside it at LOCATION.sig and LOCATION.pem.
e2e_signature_yaml() {
  echo "  signature:"
  case $1 in
    runwasi) printf '    from: artifact\n    signedFile: %s\n    signature: %s.sig\n    certificate: %s.pem\n' "$2" "$2" "$2" ;;
    url) printf '    from: url\n    signature: %s.sig\n    certificate: %s.pem\n' "$2" "$2" ;;
  esac
  printf '    identities: [{identity: "%s", issuer: "%s"}]\n    allowWithoutSignedTime: true\n' "$E2E_SIGNER" "$E2E_ISSUER"
}

# pod_logs NAME: what the pod's container wrote (kubectl logs: the API server asks the kubelet)
pod_logs() { k logs "$1" 2>&1; }

# e2e_pod NAME RUNTIMECLASS COMMAND: a hostNetwork busybox pod that tolerates the NotReady taint.
e2e_pod() {
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata: {name: $1, namespace: default}
spec:
  runtimeClassName: $2
  hostNetwork: true
  restartPolicy: Never
  automountServiceAccountToken: false
  terminationGracePeriodSeconds: 2
  tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}]
  containers:
  - name: main
    image: localhost/busybox:demo
    imagePullPolicy: Never
    command:
    - /bin/sh
    - -c
    - |
      $3
YAML
}
