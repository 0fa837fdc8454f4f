# shellcheck shell=bash
# Shared settings for the node-env scripts (.ci/node-env/, adapted from a reference recipe).
# Source it; every value can be overridden from the environment.
: "${INFRA_DIR:=/var/tmp/node-env}"                 # run state (pid files, env, logs)
: "${INFRA_VAR:=/var/tmp/node-env}"             # rootfs storage (disk, not tmpfs)
: "${INFRA_MACHINE:=infractd}"                       # container / machine name
# pristine rootfs built once; its own directory, because the reference recipe this was adapted
# from caches a different package set under $INFRA_VAR/base (sharing it would rebuild each time)
: "${INFRA_BASE:=$INFRA_VAR/base-shim-agent}"
: "${INFRA_ROOT:=$INFRA_VAR/$INFRA_MACHINE}"         # working copy that boots (ends in the name)
: "${INFRA_RUN:=$INFRA_DIR/run/$INFRA_MACHINE}"      # pid files, env, socket links, logs (ditto)
: "${INFRA_MIRROR:=http://deb.debian.org/debian}"
: "${INFRA_SUITE:=bookworm}"
: "${INFRA_BOOTSTRAP:=mmdebstrap}"                   # mmdebstrap (~45 s) | debootstrap (~70 s)
: "${INFRA_CGROUP:=unified}"                         # unified (cgroup v2 in the container) | hybrid (v1 controllers)
: "${INFRA_BOOT_TIMEOUT:=90}"
# containerd of the node: `debian` (the rootfs' own 1.6.20 with Debian's version 2 config), or a
# version X.Y.Z whose upstream builds containerd-vX.Y.Z, ctr-vX.Y.Z and
# containerd-shim-runc-v2-vX.Y.Z are in $INFRA_CONTAINERD_BINS (boot.sh puts them into a fresh
# working copy with that build's `containerd config default`: version 3 for 2.2, 4 for 2.3)
: "${INFRA_CONTAINERD:=debian}"
: "${INFRA_CONTAINERD_BINS:=/var/tmp/containerd-bins}"
# No ca-certificates, on purpose: a minimal node without a CA store must still fetch file://
# artifacts (tests/node/kube.rs runs the agent inside it).
: "${INFRA_PACKAGES:=systemd,systemd-sysv,dbus,containerd,runc,iproute2,procps,busybox-static}"

# Cgroup directories the container is started in: for every hierarchy the caller is
# in, <caller's cgroup>/infra-systemd/<machine>.  unified: only the cgroup v2 one;
# hybrid: every v1 hierarchy too.  boot.sh records the list in $INFRA_RUN/cgroups.
infra_cgroup_dirs() {
  local n ctrl path base
  while IFS=: read -r n ctrl path; do
    if [ -z "$ctrl" ]; then
      base=/sys/fs/cgroup/unified; [ -f /sys/fs/cgroup/cgroup.controllers ] && base=/sys/fs/cgroup
    elif [ "$INFRA_CGROUP" = hybrid ]; then
      base=/sys/fs/cgroup/${ctrl#name=}; base=${base%%,*}
    else continue; fi
    [ -d "$base" ] && echo "${base}${path%/}/infra-systemd/$INFRA_MACHINE"
  done </proc/self/cgroup
}
INFRA_PATH_IN=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { printf '[infra %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# A shell that sourced a machine's env file has that machine's INFRA_ROOT and INFRA_RUN: with
# another INFRA_MACHINE they would make boot.sh replace, and stop.sh kill, the wrong machine.
for _v in INFRA_ROOT INFRA_RUN; do
  [ "${!_v##*/}" = "$INFRA_MACHINE" ] ||
    die "$_v=${!_v} is not machine $INFRA_MACHINE's (from another machine's env file?); unset INFRA_ROOT INFRA_RUN"
done
unset _v
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}'; }

# "pid starttime" of a process, so that a recycled PID is never signalled.
proc_id() { [ -r "/proc/$1/stat" ] && awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

# PID of the systemd-nspawn we started, if it is still that process.
nspawn_pid() {
  local f="$INFRA_RUN/nspawn.pid" pid st
  [ -f "$f" ] || return 1
  read -r pid st <"$f" || return 1
  [ -n "$pid" ] && [ "$(proc_id "$pid")" = "$st" ] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q "systemd-nspawn .*-M $INFRA_MACHINE " || return 1
  echo "$pid"
}

# PID (host view) of the container's PID 1, if it is still that process.
leader_pid() {
  local f="$INFRA_RUN/leader.pid" pid st
  [ -f "$f" ] || return 1
  read -r pid st <"$f" || return 1
  [ -n "$pid" ] && [ "$(proc_id "$pid")" = "$st" ] || return 1
  echo "$pid"
}

# Run a command inside the container (all namespaces of its PID 1, clean env).
in_ct() {
  local l
  l=$(leader_pid) || die "container $INFRA_MACHINE is not running"
  nsenter -t "$l" -a -r -w env -i PATH="$INFRA_PATH_IN" HOME=/root TERM=dumb \
    SYSTEMD_PAGER=cat LANG=C.UTF-8 "$@"
}
