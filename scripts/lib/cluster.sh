# shellcheck shell=bash
# shellcheck disable=SC2034  # CLUSTER_ROOT, CLUSTER_WASM_*: read by the scripts that source it
# A local cluster as shim-agent's users run it, for scripts/demo, tests/e2e and tests/deployment:
# a control plane (.ci/kube-env: etcd, kube-apiserver, controller manager with the controllers a
# Deployment needs, scheduler), the .deb installed into a Debian node image (.ci/node-env) the way
# an image builder does, the node booted with systemd-nspawn and joined with a real kubelet, the
# coordinator as the manifests' Deployment (its image loaded into the nodes' containerd, its pods
# on the joined nodes), real runtimes as file:// artifacts.
# Source it from bash with `set -euo pipefail` (it sources scripts/lib.sh: step, info, ok, fail);
# call cluster_cleanup from an EXIT trap.
#
# Set before sourcing:
#   CLUSTER_NAME   this run's name (demo, e2e, deploy): its work folder CLUSTER_WORK (default
#                  /var/tmp/shim-agent-NAME), its artifacts /srv/shim-agent-NAME, the label
#                  shim-agent.dev/cluster=NAME on the nodes it joins (where its coordinator pods go)
#   the kube env instance, as .ci/kube-env/env.sh reads it: KUBE_ENV_NAME, KUBE_ENV_PORT,
#   KUBE_ENV_ETCD_PORT, KUBE_ENV_ETCD_PEER_PORT, KUBE_ENV_KCM_PORT, KUBE_ENV_SCHED_PORT (unset:
#   the default instance, the cargo tests'); and the kubelets' ports KUBELET_PORT,
#   KUBELET_HEALTHZ_PORT (the nodes share the host's network)
#   CLUSTER_KUBE_OWN=1   the instance is this run's own: stopped and wiped at exit; otherwise
#                  it may be shared, and only what this run started or replaced is stopped or
#                  restored (the scheduler, a controller manager without the Deployment's controllers)
# Binaries: KUBEBUILDER_ASSETS (see .ci/kube-env/assets.sh); containerd 2.x builds:
# CONTAINERD_BUILDS_DIR (holding unpack.sh, as scripts/test uses) or INFRA_CONTAINERD_BINS.

# shellcheck source-path=SCRIPTDIR source=../lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
CLUSTER_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER_KUBE_ENV=$CLUSTER_REPO/.ci/kube-env
CLUSTER_NODE_ENV=$CLUSTER_REPO/.ci/node-env
CLUSTER_NAME=${CLUSTER_NAME:?set CLUSTER_NAME before sourcing scripts/lib/cluster.sh}
export KUBE_ENV_SCHEDULER=1
CLUSTER_WORK=${CLUSTER_WORK:-/var/tmp/shim-agent-$CLUSTER_NAME}
CLUSTER_NODES=()      # machines booted (or prepared) by this run, stopped and purged at exit
CLUSTER_KUBE_UP=0     # 1 once cluster_control_plane_up ran: cluster_cleanup stops what it must
CLUSTER_KUBE_STARTED= # what of the instance this run started: all, kube-scheduler, or nothing
# The controllers the coordinator's Deployment needs beside the kube env's default ones.
CLUSTER_KCM_EXTRA=deployment-controller,replicaset-controller,disruption-controller
CLUSTER_KCM_ORIG=""   # a shared instance's controller manager this run replaced: the --controllers
                      # it ran with (started so again at exit), or none (there was none: stopped)

# Every env the run needs, or the first one missing (printed), with status 1.
cluster_missing_env() {
  if [ "$(id -u)" != 0 ]; then echo "needs root (systemd-nspawn, dpkg --root)"; return 0; fi
  if ! "$CLUSTER_KUBE_ENV/assets.sh" >/dev/null 2>&1; then
    echo "no control-plane binaries (set KUBEBUILDER_ASSETS: etcd, kube-apiserver, kubectl, kube-controller-manager, kube-scheduler, kubelet)"
    return 0
  fi
  return 1
}

# containerd 2.x upstream builds (containerd-vX.Y.Z, ctr-vX.Y.Z, containerd-shim-runc-v2-vX.Y.Z):
# prints their folder, or nothing.
cluster_containerd_bins() {
  local builds=${CONTAINERD_BUILDS_DIR:-$CLUSTER_REPO/../shared/containerd}
  if [ -n "${INFRA_CONTAINERD_BINS:-}" ]; then echo "$INFRA_CONTAINERD_BINS"
  elif [ -x "$builds/unpack.sh" ]; then "$builds/unpack.sh"
  fi
}

# --- the package ------------------------------------------------------------------------------
# Builds the .deb (scripts/package when the repository has it, else cargo-deb) and prints its path.
cluster_build_deb() {
  local out deb target=${CARGO_TARGET_DIR:-$CLUSTER_REPO/target}
  if [ -x "$CLUSTER_REPO/scripts/package" ]; then
    out=$("$CLUSTER_REPO/scripts/package" | tail -n 5) || return 1
    deb=$(grep -E '\.deb$' <<<"$out" | tail -n 1)
  else
    if ! command -v cargo-deb >/dev/null && [ ! -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo-deb" ]; then
      echo "installing cargo-deb (cargo install --locked cargo-deb)" >&2
      cargo install --locked --quiet cargo-deb >&2 || return 1
    fi
    (cd "$CLUSTER_REPO" && cargo deb --locked --quiet >&2) || return 1
    deb=$(find "$target/debian" -maxdepth 1 -name "shim-agent_*.deb" -printf "%T@ %p\n" | sort -rn | head -n 1 | cut -d" " -f2-)
  fi
  [ -f "$deb" ] || { echo "no .deb found after the build" >&2; return 1; }
  echo "$deb"
}

# --- the control plane ------------------------------------------------------------------------
CLUSTER_KUBECONFIG=""
k() { "$CLUSTER_ASSETS/kubectl" --kubeconfig "$CLUSTER_KUBECONFIG" "$@"; }
# `kubectl logs` works: the API server reaches the kubelet at the Node's InternalIP (the host's
# address: the node shares its network) with a client certificate of the instance's CA, and the
# kubelet listens there (KUBELET_ADDRESS, read by kubelet-node.sh prepare).
export KUBELET_ADDRESS=${KUBELET_ADDRESS:-0.0.0.0}
# cluster_kube_pid NAME: the pid of the instance's component NAME (kube-apiserver, ...), if it runs.
cluster_kube_pid() { (. "$CLUSTER_KUBE_ENV/env.sh" && pid_alive "$1"); }
# cluster_kube_kill PID SECS: as down.sh stops a component: SIGTERM, SIGKILL after SECS seconds.
cluster_kube_kill() {
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < $2 * 4; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
  kill -KILL "$pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
}
# cluster_kcm_lacks CONTROLLERS: some controller of CLUSTER_KCM_EXTRA is not in the comma list
# CONTROLLERS (a controller manager's --controllers).
cluster_kcm_lacks() {
  local c
  [[ ",$1," != *",*,"* ]] || return 1
  for c in ${CLUSTER_KCM_EXTRA//,/ }; do [[ ",$1," == *",$c,"* ]] || return 0; done
  return 1
}
# The instance started, or taken as it runs (up.sh starts only what is missing: here the
# scheduler, which the cargo tests' instance runs without). up.sh keeps a running API server
# as it is, so one started without a kubelet client certificate (scripts/test starts the cargo
# tests' so) is stopped first and started again with one. The controller manager runs the
# deployment, replicaset and disruption controllers too (the coordinator's Deployment): a running
# one without them (the cargo tests' runs the kube env's default list) is stopped and started
# again with its list and them; cluster_stop_control_plane starts it again as it was.
cluster_control_plane_up() {
  local pid have pki=${KUBE_ENV_STATE:-/var/tmp/kube-env}/${KUBE_ENV_NAME:-default}/pki
  CLUSTER_ASSETS=$("$CLUSTER_KUBE_ENV/assets.sh")
  CLUSTER_KUBE_UP=1
  if ! cluster_kube_pid kube-apiserver >/dev/null; then CLUSTER_KUBE_STARTED=all
  elif ! cluster_kube_pid kube-scheduler >/dev/null; then CLUSTER_KUBE_STARTED=kube-scheduler
  fi
  # the kube env's default list (env.sh's), or the caller's, and the Deployment's controllers
  have=${KUBE_ENV_KCM_CONTROLLERS:-$(unset KUBE_ENV_KCM_CONTROLLERS; . "$CLUSTER_KUBE_ENV/env.sh" && echo "$KCM_CONTROLLERS")}
  cluster_kcm_lacks "$have" && have+=,$CLUSTER_KCM_EXTRA
  export KUBE_ENV_KCM_CONTROLLERS=$have
  if [ "$CLUSTER_KUBE_STARTED" != all ] && [ "${CLUSTER_KUBE_OWN:-0}" != 1 ]; then
    if ! pid=$(cluster_kube_pid kube-controller-manager); then CLUSTER_KCM_ORIG=none
    else
      have=$(tr '\0' '\n' <"/proc/$pid/cmdline" | sed -n 's/^--controllers=//p')
      if cluster_kcm_lacks "$have"; then
        info "restarting the controller manager of kube env ${KUBE_ENV_NAME:-default} with the deployment, replicaset and disruption controllers (the coordinator's Deployment)"
        CLUSTER_KCM_ORIG=$have
        export KUBE_ENV_KCM_CONTROLLERS=$have,$CLUSTER_KCM_EXTRA
        cluster_kube_kill "$pid" 10
      fi
    fi
  fi
  "$CLUSTER_KUBE_ENV/pki.sh"
  "$CLUSTER_KUBE_ENV/identity.sh" kube-apiserver-kubelet-client system:masters >/dev/null
  export KUBE_ENV_APISERVER_ARGS="--kubelet-client-certificate=$pki/kube-apiserver-kubelet-client.crt --kubelet-client-key=$pki/kube-apiserver-kubelet-client.key --kubelet-preferred-address-types=InternalIP ${KUBE_ENV_APISERVER_ARGS:-}"
  if pid=$(cluster_kube_pid kube-apiserver) &&
    ! tr '\0' '\n' <"/proc/$pid/cmdline" | grep -q '^--kubelet-client-certificate='; then
    info "restarting the API server of kube env ${KUBE_ENV_NAME:-default} with a kubelet client certificate (kubectl logs)"
    # SIGKILL after 15 s (it stops listening at once, but may take a minute to exit while
    # clients hold connections; up.sh would keep it meanwhile)
    cluster_kube_kill "$pid" 15
    # A scheduler that another client started lived through that restart (and maybe
    # earlier ones); one such scheduler in CI never placed a pod again. up.sh starts a
    # fresh one, which this run then owns and stops.
    if pid=$(cluster_kube_pid kube-scheduler); then
      cluster_kube_kill "$pid" 10
      CLUSTER_KUBE_STARTED=kube-scheduler
    fi
  fi
  CLUSTER_KUBECONFIG=$("$CLUSTER_KUBE_ENV/up.sh" | tail -n 1)
  export CLUSTER_KUBECONFIG CLUSTER_ASSETS
}
# --- the coordinator: the manifests' Deployment, its pods on this run's nodes ------------------
# As an operator deploys it (docs/operators.md#run-a-coordinator; running it on trusted nodes, or
# as `shim-agent coordinate` anywhere with credentials of its own, is documented there too): the
# image scripts/image builds from a release binary, loaded into each node's containerd (no
# registry here), and the manifests applied with an overlay for what this environment lacks.
# Node agents hold no cluster-wide verbs (docs/design.md §7): the finalizer, the RuntimeClasses,
# the Shims' status and the rollout slots are its work.
CLUSTER_COORD_NS=shim-agent-system
CLUSTER_COORD_SEL=app.kubernetes.io/component=coordinator
CLUSTER_NODE_LABEL=shim-agent.dev/cluster   # =CLUSTER_NAME on the nodes this run joins
CLUSTER_COORD_IMAGE=${CLUSTER_COORD_IMAGE:-}   # the image's OCI archive: cluster_node_join imports it
# cluster_coordinator_image [BIN]: the coordinator's image built by scripts/image from BIN (a
# release binary: the package's), or from the binary scripts/package stages; CLUSTER_COORD_IMAGE
# names its archive. An archive already named there is kept.
cluster_coordinator_image() {
  [ -z "$CLUSTER_COORD_IMAGE" ] || return 0
  CLUSTER_COORD_IMAGE=$(cd "$CLUSTER_REPO" && scripts/image ${1:+"$1"}) || fail "scripts/image failed"
  [ -f "$CLUSTER_COORD_IMAGE" ] || fail "scripts/image printed no archive: $CLUSTER_COORD_IMAGE"
}
# cluster_coordinator_deploy BASE [REPLICAS]: the manifests, BASE a kustomize base (a folder:
# deploy/kustomize) or a shim-agent binary (the package's: its `shim-agent manifests`), applied
# with this environment's overlay: host network (no CNI; so at most one replica a node: each
# listens on 8080), the not-ready taint tolerated (no CNI: no node is Ready), only the nodes this
# run joined (a shared kube env holds the cargo tests' Nodes, with no kubelet), the image never
# pulled (cluster_node_join loaded it), the API server itself as the pods reach it (no
# kube-proxy); REPLICAS, if given, instead of the manifests' two. Prints what kubectl applied;
# returns once the CRDs are established; the pods start as the nodes join
# (cluster_coordinator_wait).
cluster_coordinator_deploy() {
  local overlay=$CLUSTER_WORK/coordinator
  rm -rf "$overlay"; mkdir -p "$overlay/base"
  if [ -d "$1" ]; then cp -r "$1/." "$overlay/base/"
  else
    "$1" manifests >"$overlay/base/manifests.yaml" || fail "$1 manifests"
    printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [manifests.yaml]\n' >"$overlay/base/kustomization.yaml"
  fi
  cat >"$overlay/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [base]
patches:
- target: {kind: Deployment, name: shim-agent-coordinator}
  patch: |
    apiVersion: apps/v1
    kind: Deployment
    metadata: {name: shim-agent-coordinator, namespace: $CLUSTER_COORD_NS}
    spec:
$( [ -z "${2:-}" ] || printf '      replicas: %s\n' "$2" )
      template:
        spec:
          hostNetwork: true
          nodeSelector: {$CLUSTER_NODE_LABEL: $CLUSTER_NAME}
          tolerations: [{key: node.kubernetes.io/not-ready, operator: Exists, effect: NoSchedule}]
          affinity:
            podAntiAffinity:
              requiredDuringSchedulingIgnoredDuringExecution:
              - topologyKey: kubernetes.io/hostname
                labelSelector: {matchLabels: {app.kubernetes.io/component: coordinator}}
          containers:
          - name: coordinator
            imagePullPolicy: Never
            env:
            - {name: KUBERNETES_SERVICE_HOST, value: "127.0.0.1"}
            - {name: KUBERNETES_SERVICE_PORT, value: "${KUBE_ENV_PORT:-6443}"}
YAML
  # This control plane's API server is an OpenShift build of Kubernetes: its ServiceAccount
  # admission adds the ConfigMap openshift-service-ca.crt to every pod's token volume, which a
  # plain cluster has no such thing to fill: give it one (the cluster's CA), or no pod starts.
  k get namespace "$CLUSTER_COORD_NS" >/dev/null 2>&1 || k create namespace "$CLUSTER_COORD_NS" >/dev/null
  k -n "$CLUSTER_COORD_NS" create configmap openshift-service-ca.crt \
    --from-file=service-ca.crt="${KUBE_ENV_STATE:-/var/tmp/kube-env}/${KUBE_ENV_NAME:-default}/pki/ca.crt" \
    --dry-run=client -o yaml | k apply -f - >/dev/null
  k apply --server-side --force-conflicts -k "$overlay"
  k wait --for condition=established --timeout=60s crd/shims.containerd.x-k8s.io >/dev/null
}
# cluster_coordinator_holder: the coordinator Lease's holder (a pod's name), if any.
cluster_coordinator_holder() {
  k -n "$CLUSTER_COORD_NS" get shimlease shim-agent-coordinator -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null
}
# cluster_coordinator_elected [NOT]: a Ready coordinator pod (not NOT) holds the Lease.
cluster_coordinator_elected() {
  local h
  h=$(cluster_coordinator_holder) && [ -n "$h" ] && [ "$h" != "${1:-}" ] &&
    [ "$(k -n "$CLUSTER_COORD_NS" get pod "$h" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
# cluster_coordinator_wait [SECS] [NOT]: a coordinator pod (not NOT) elected within SECS (120).
cluster_coordinator_wait() {
  eventually "${1:-120}" "a coordinator pod${2:+ other than $2} Ready and holding the coordinator Lease" cluster_coordinator_elected "${2:-}"
}
# cluster_coordinator_pods: its pods, NAME NODE PHASE, one a line.
cluster_coordinator_pods() {
  k -n "$CLUSTER_COORD_NS" get pods -l "$CLUSTER_COORD_SEL" \
    -o 'jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase}{"\n"}{end}' 2>/dev/null
}
# cluster_coordinator_remove: the Deployment and its pods deleted (from a shared kube env, at
# exit): at once for those on nodes gone; the others stop and release the Lease on SIGTERM.
cluster_coordinator_remove() {
  [ -n "$CLUSTER_KUBECONFIG" ] || return 0
  k -n "$CLUSTER_COORD_NS" delete deployment shim-agent-coordinator --cascade=foreground --wait=false >/dev/null 2>&1 || true
  k -n "$CLUSTER_COORD_NS" delete pods -l "$CLUSTER_COORD_SEL" --timeout=20s >/dev/null 2>&1 ||
    k -n "$CLUSTER_COORD_NS" delete pods -l "$CLUSTER_COORD_SEL" --force --grace-period=0 >/dev/null 2>&1 || true
}
# What the coordinator did: its pods, the Deployment's and the pods' events, each pod's log.
cluster_coordinator_diagnose() {
  local p
  echo "--- the coordinator's pods (kubectl -n $CLUSTER_COORD_NS get pods -o wide)"; k -n "$CLUSTER_COORD_NS" get pods -o wide 2>&1 || true
  echo "--- the coordinator Lease's holder: $(cluster_coordinator_holder)"
  echo "--- kubectl -n $CLUSTER_COORD_NS describe deployment,pods (last 60)"; k -n "$CLUSTER_COORD_NS" describe deployment,pods 2>&1 | tail -n 60 || true
  for p in $(k -n "$CLUSTER_COORD_NS" get pods -l "$CLUSTER_COORD_SEL" -o name 2>/dev/null); do
    echo "--- kubectl logs $p (last 60)"; k -n "$CLUSTER_COORD_NS" logs "$p" --tail=60 --request-timeout=20s 2>&1 || true
  done
}

# --- artifacts: file:// URLs, at the same path on the host (where `install --root` reads them
# while baking the image) and in the node (where the agent reads them): an air-gapped node's
# way, with no server to run (the node image has no CA certificates, on purpose).
CLUSTER_ART=/srv/shim-agent-$CLUSTER_NAME
# cluster_artifact NAME ARCHIVE: the artifact ARCHIVE (a shim's release .tar.gz) as Shim NAME's,
# at $CLUSTER_ART/NAME.tar.gz (one artifact can serve several Shims); prints its sha256.
cluster_artifact() {
  mkdir -p "$CLUSTER_ART"
  cp "$2" "$CLUSTER_ART/$1.tar.gz"
  sha256sum "$CLUSTER_ART/$1.tar.gz" | cut -d' ' -f1
}

# --- a real runtime, built only from what the package registries hold (tests/shims/README.md) ---
# The Wasm shim (containerd-shim-wasmi-v1: runwasi's containerd-shim-wasm with wasmi, from
# crates.io) and its image. Both are cached under SHIM_AGENT_TEST_CACHE; a cold shim build takes
# minutes (logged with its time). Sets CLUSTER_WASM_SHIM (the runwasi-style .tar.gz) and
# CLUSTER_WASM_IMAGE_TAR (an OCI archive of $CLUSTER_WASM_IMAGE: /hello.wasm prints "hello from
# wasm", /sleep.wasm runs until killed).
CLUSTER_WASM_IMAGE=docker.io/library/shim-agent-wasm-hello:v1
cluster_wasm_artifacts() {
  local t=$SECONDS
  CLUSTER_WASM_SHIM=$(nice -n 10 "$CLUSTER_REPO/tests/shims/build-wasm-shim") || fail "tests/shims/build-wasm-shim failed"
  CLUSTER_WASM_SHIM_SECS=$((SECONDS - t))
  CLUSTER_WASM_IMAGE_TAR=$("$CLUSTER_REPO/tests/shims/build-wasm-image") || fail "tests/shims/build-wasm-image failed"
}
# cluster_import_image MACHINE ROOT ARCHIVE: an OCI archive into the booted node's k8s.io
# namespace. --all-platforms: a wasi/wasm image is no platform of the node's; --local:
# containerd 2.x unpacks it at import (its transfer service would not, and CRI could not create
# the container).
cluster_import_image() {
  mkdir -p "$2/var/tmp/images"
  cp "$3" "$2/var/tmp/images/${3##*/}"
  X "$1" ctr -n k8s.io images import --local --all-platforms "/var/tmp/images/${3##*/}" >/dev/null
}
# The artifacts into the node image, at the same path (with the signatures beside them).
cluster_publish_artifacts() { mkdir -p "$1$CLUSTER_ART"; cp "$CLUSTER_ART"/* "$1$CLUSTER_ART/"; }
# cluster_shim_yaml NAME SHA256 [SELECTOR_KEY=VALUE] [wasm-check]: a Shim for that artifact;
# with wasm-check, its node proves the Wasm engine runs before the label (a check container of
# $CLUSTER_WASM_IMAGE running /hello.wasm in a sandbox of the new handler).
cluster_shim_yaml() {
  cat <<YAML
apiVersion: containerd.x-k8s.io/v1alpha1
kind: Shim
metadata:
  name: $1
spec:
YAML
  [ -z "${3:-}" ] || printf '  nodeSelector: {"%s": "%s"}\n' "${3%%=*}" "${3#*=}"
  cat <<YAML
  fetchStrategy:
    type: anonymousHttp
    anonHttp:
      location: file://$CLUSTER_ART/$1.tar.gz
      sha256: $2
  runtimeClass:
    name: $1
YAML
  [ "${4:-}" != wasm-check ] || cat <<YAML
  check:
    container:
      image: $CLUSTER_WASM_IMAGE
      command: ["/hello.wasm"]
      success: {exitCode: 0, outputContains: "hello from wasm"}
      timeoutSeconds: 60
YAML
}

# --- the node ---------------------------------------------------------------------------------
# cluster_node_image MACHINE CONTAINERD(debian|X.Y.Z): a fresh, unbooted working copy of the
# node-env rootfs at /var/tmp/node-env/MACHINE (CLUSTER_ROOT), with that containerd and the
# kubelet baked in.
cluster_node_image() {
  local m=$1 v=$2 bins=""
  [ "$v" = debian ] || { bins=$(cluster_containerd_bins); [ -n "$bins" ] || fail "no containerd $v builds"; }
  CLUSTER_NODES+=("$m")
  env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$m" "$CLUSTER_NODE_ENV/make-rootfs.sh" >&2
  env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$m" INFRA_CONTAINERD="$v" \
    INFRA_CONTAINERD_BINS="${bins:-/nonexistent}" INFRA_FRESH=only "$CLUSTER_NODE_ENV/boot.sh" 2>&1 | sed 's/^/    /' >&2
  local r=/var/tmp/node-env/$m
  [ -x "$r/usr/bin/containerd" ] || fail "no working copy at $r"
  "$CLUSTER_KUBE_ENV/kubelet-node.sh" prepare "$r" "$m" >&2
  CLUSTER_ROOT=$r
}
# Boot a prepared working copy (host network: the API server is on 127.0.0.1; v1 controllers, the
# same for 1.6 and 2.x: containerd 2.x gives every pod sandbox cpu shares, and the Wasm shim's
# youki writes cpu.weight for any container with cpu shares, which needs the cpu controller; on
# unified cgroups without it, 1.6 would need CRI's disable_cgroup = true).
# The node boots unjoined, as an image builder's node does: cluster_node_join joins it later.
cluster_node_boot() {
  local m=$1 v=$2 bins=""
  [ "$v" = debian ] || bins=$(cluster_containerd_bins)
  env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$m" INFRA_CONTAINERD="$v" INFRA_CONTAINERD_BINS="${bins:-/nonexistent}" \
    INFRA_FRESH=0 INFRA_NETWORK=host INFRA_CGROUP=hybrid "$CLUSTER_NODE_ENV/boot.sh" 2>&1 >/dev/null | sed 's/^/    /'
}
# cluster_node_join MACHINE: as `kubeadm join` on the booted node: the images, the CA and the
# kubelet's kubeconfig written into it, the kubelet started (kubelet-node.sh join); before, the
# coordinator's image (CLUSTER_COORD_IMAGE) loaded into its containerd; after, the Node labelled
# CLUSTER_NODE_LABEL=CLUSTER_NAME: the coordinator's pods may run there.
cluster_node_join() {
  [ -z "$CLUSTER_COORD_IMAGE" ] || cluster_import_image "$1" "/var/tmp/node-env/$1" "$CLUSTER_COORD_IMAGE"
  env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$1" "$CLUSTER_KUBE_ENV/kubelet-node.sh" join | sed 's/^/    /'
  k label node "$1" --overwrite "$CLUSTER_NODE_LABEL=$CLUSTER_NAME" >/dev/null
}
# X MACHINE CMD...: run CMD inside the node.
X() { local m=$1; shift; env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$m" "$CLUSTER_NODE_ENV/exec.sh" "$@"; }
cluster_node_stop() {
  env -u INFRA_ROOT -u INFRA_RUN INFRA_MACHINE="$1" "$CLUSTER_NODE_ENV/stop.sh" --purge >/dev/null 2>&1 || true
  rm -rf "/var/tmp/node-env/run/$1"   # its console log
}
# cluster_node_remove MACHINE: a joined node taken out of the cluster: cordoned, the coordinator's
# pods on it deleted while its kubelet runs (the elected one releases the Lease on SIGTERM; the
# ReplicaSet starts another on a node still joined, if any), stopped and purged, its Node
# deleted, and what of its pods is left deleted at once (no kubelet is left to confirm, and no
# node-lifecycle controller runs here to evict them).
cluster_node_remove() {
  k cordon "$1" >/dev/null 2>&1 || true
  k -n "$CLUSTER_COORD_NS" delete pods -l "$CLUSTER_COORD_SEL" --field-selector "spec.nodeName=$1" --timeout=30s >/dev/null 2>&1 || true
  cluster_node_stop "$1"
  k delete node "$1" --wait=false >/dev/null 2>&1 || true
  k -n "$CLUSTER_COORD_NS" delete pods -l "$CLUSTER_COORD_SEL" --field-selector "spec.nodeName=$1" --force --grace-period=0 >/dev/null 2>&1 || true
}

# containerd's config as the agent may change it (config.toml, conf.d/*), one line per file.
cluster_config_digest() {
  local r=$1 f
  for f in "$r"/etc/containerd/config.toml "$r"/etc/containerd/conf.d/*; do
    [ -e "$f" ] && printf '%s %s\n' "$(sha256sum <"$f" | cut -c1-64)" "${f#"$r"}"
  done
  return 0
}

# --- polling and reading ----------------------------------------------------------------------
# eventually SECS WHAT CMD...: CMD succeeds within SECS seconds, else fail naming WHAT.
eventually() {
  local t=$1 what=$2; shift 2
  local end=$((SECONDS + t))
  while [ "$SECONDS" -lt "$end" ]; do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  "$@" >/dev/null 2>&1 || fail "$what (not within ${t}s)"
}
node_label() { k get node "$1" -o "jsonpath={.metadata.labels.containerd\.x-k8s\.io/$2}" 2>/dev/null; }
has_label() { [ "$(node_label "$1" "$2")" = true ]; }
lacks_label() { [ -z "$(node_label "$1" "$2")" ]; }
pod_phase() { k get pod "$1" -o 'jsonpath={.status.phase}' 2>/dev/null; }
pod_phase_is() { [ "$(pod_phase "$1")" = "$2" ]; }
exists() { k get "$@" >/dev/null 2>&1; }
gone() { ! k get "$@" >/dev/null 2>&1; }
shim_ready() { [ "$(k get shim "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }

# cluster_wasm_pod NAME RUNTIMECLASS [MODULE]: a hostNetwork pod of the Wasm image; its
# entrypoint (/hello.wasm) or /MODULE. Its own pid namespace (the default; a shared one fails on
# 2.3.4).
cluster_wasm_pod() {
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
    image: $CLUSTER_WASM_IMAGE
    imagePullPolicy: Never
$( [ -z "${3:-}" ] || printf '    command: ["/%s"]\n' "$3" )
YAML
}

# What went wrong: the agent's and the kubelet's journals, the coordinator's pods and logs, the objects.
cluster_diagnose() {
  local m=$1
  echo "---------------- diagnostics for $m ----------------"
  if [ -f "/var/tmp/node-env/run/$m/env" ]; then
    echo "--- journalctl -u shim-agent (in $m)"; X "$m" journalctl -u shim-agent --no-pager -n 150 -o short-precise 2>&1 || true
    echo "--- journalctl -u kubelet (in $m, last 60)"; X "$m" journalctl -u kubelet --no-pager -n 60 -o short-precise 2>&1 || true
    echo "--- journalctl -u containerd (in $m, last 40)"; X "$m" journalctl -u containerd --no-pager -n 40 -o short-precise 2>&1 || true
    echo "--- shim-agent status (in $m)"; X "$m" shim-agent status 2>&1 || true
  fi
  if [ -n "$CLUSTER_KUBECONFIG" ]; then
    cluster_coordinator_diagnose
    echo "--- kubectl describe shims"; k describe shims 2>&1 || true
    echo "--- the rollout slots (holder, owners, reservation)"
    k get shimleases -A -o custom-columns='NAME:.metadata.name,HOLDER:.spec.holderIdentity,OWNERS:.metadata.ownerReferences[*].name,OWNER_UIDS:.metadata.ownerReferences[*].uid,LABELS:.metadata.labels' 2>&1 || true
    echo "--- kubectl describe node $m"; k describe node "$m" 2>&1 || true
    echo "--- kubectl describe pods"; k describe pods 2>&1 || true
    echo "--- kubectl get runtimeclasses,events"; k get runtimeclasses 2>&1 || true; k get events -A --sort-by=.lastTimestamp 2>&1 | tail -30 || true
    local logs=${KUBE_ENV_STATE:-/var/tmp/kube-env}/${KUBE_ENV_NAME:-default}/logs
    echo "--- kube-scheduler's log (last 20)"; tail -n 20 "$logs/kube-scheduler.log" 2>&1 | cut -c1-300 || true
  fi
}

# Stops everything this run started: the nodes (purged; the coordinator's pods with them), the
# artifacts, the control plane (its own instance: wiped), the work folder.
cluster_cleanup() {
  cluster_stop_nodes
  cluster_stop_control_plane
  rm -rf "$CLUSTER_WORK"
}
cluster_stop_nodes() {
  local m
  for m in "${CLUSTER_NODES[@]}"; do cluster_node_stop "$m"; done
  CLUSTER_NODES=()
  rm -rf "$CLUSTER_ART"
}
# Its own instance (CLUSTER_KUBE_OWN=1) stopped and wiped, pki and logs too; a shared one
# stopped if this run started it (its data kept), else only the scheduler this run added
# stopped, and the controller manager it replaced started again as it was (or the one it added
# stopped).
cluster_stop_control_plane() {
  local pid
  [ "$CLUSTER_KUBE_UP" = 1 ] || return 0
  if [ "${CLUSTER_KUBE_OWN:-0}" = 1 ]; then
    "$CLUSTER_KUBE_ENV/down.sh" --wipe >/dev/null 2>&1 || true
    rm -rf "${KUBE_ENV_STATE:-/var/tmp/kube-env}/${KUBE_ENV_NAME:-default}"
  elif [ "$CLUSTER_KUBE_STARTED" = all ]; then
    "$CLUSTER_KUBE_ENV/down.sh" >/dev/null 2>&1 || true
  else
    if [ "$CLUSTER_KUBE_STARTED" = kube-scheduler ] && pid=$(cluster_kube_pid kube-scheduler); then
      kill "$pid" 2>/dev/null || true
    fi
    if [ -n "$CLUSTER_KCM_ORIG" ]; then
      if pid=$(cluster_kube_pid kube-controller-manager); then cluster_kube_kill "$pid" 10; fi
      if [ "$CLUSTER_KCM_ORIG" != none ]; then
        KUBE_ENV_KCM_CONTROLLERS=$CLUSTER_KCM_ORIG KUBE_ENV_SCHEDULER=0 "$CLUSTER_KUBE_ENV/up.sh" >/dev/null 2>&1 ||
          echo "could not start the controller manager of kube env ${KUBE_ENV_NAME:-default} again (--controllers=$CLUSTER_KCM_ORIG)" >&2
      fi
      CLUSTER_KCM_ORIG=""
    fi
  fi
  CLUSTER_KUBE_UP=0
}
