# shellcheck shell=bash
# shellcheck disable=SC2034  # E2E_FAILED_CONTEXT: read by tests/e2e/run
# What only the end-to-end test needs, on top of the local cluster of scripts/lib/cluster.sh
# (shared with scripts/demo): its kube env instance, the gVisor artifact, a busybox pod, the
# node's state annotation, pod logs.
# Source it from bash with `set -euo pipefail`; call cluster_cleanup from an EXIT trap.
#
# Its own instance and ports, so it runs beside scripts/test's kube env and node env:
#   KUBE_ENV_NAME=e2e KUBE_ENV_PORT=6643 KUBE_ENV_ETCD_PORT=23990 KUBE_ENV_ETCD_PEER_PORT=24000
#   KUBE_ENV_KCM_PORT=10457 KUBE_ENV_SCHED_PORT=10459 KUBELET_PORT=10650 KUBELET_HEALTHZ_PORT=10648
# E2E_WORK: its work folder (default /var/tmp/shim-agent-e2e).

export KUBE_ENV_NAME=${KUBE_ENV_NAME:-e2e} KUBE_ENV_PORT=${KUBE_ENV_PORT:-6643}
export KUBE_ENV_ETCD_PORT=${KUBE_ENV_ETCD_PORT:-23990} KUBE_ENV_ETCD_PEER_PORT=${KUBE_ENV_ETCD_PEER_PORT:-24000}
export KUBE_ENV_KCM_PORT=${KUBE_ENV_KCM_PORT:-10457} KUBE_ENV_SCHED_PORT=${KUBE_ENV_SCHED_PORT:-10459}
export KUBELET_PORT=${KUBELET_PORT:-10650} KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT:-10648}
E2E_WORK=${E2E_WORK:-/var/tmp/shim-agent-e2e}
CLUSTER_NAME=e2e CLUSTER_WORK=$E2E_WORK
# shellcheck source-path=SCRIPTDIR source=../../scripts/lib/cluster.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/cluster.sh"
E2E_FAILED_CONTEXT="" # the node to describe when something fails

# CRD, namespace, RBAC and admission policy, from the packaged binary ($1).
e2e_apply_manifests() {
  "$1" manifests | k apply --server-side -f - >/dev/null
  k wait --for condition=established --timeout=60s crd/shims.containerd.x-k8s.io >/dev/null
}

# e2e_gvisor_artifact RUNC_SHIM: gVisor's runsc (Debian's) with RUNC_SHIM (the node's own
# containerd line's runc shim) and a launcher, one .tar.gz of four files; prints its path.
e2e_gvisor_artifact() {
  RUNC_SHIM=$1 "$CLUSTER_REPO/tests/shims/build-runsc-artifact" || fail "tests/shims/build-runsc-artifact failed"
}

# the phase of Shim $2 in Node $1's state annotation
node_phase() {
  k get node "$1" -o 'jsonpath={.metadata.annotations.containerd\.x-k8s\.io/shim-state}' 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read().strip(); print(json.loads(t).get(sys.argv[1],{}).get("phase","") if t else "")' "$2"
}
phase_is() { [ "$(node_phase "$1" "$2")" = "$3" ]; }
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
