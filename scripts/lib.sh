# shellcheck shell=bash
# What the repository's scripts share: their loggers and the install of a missing tool with apt.
# Source it from bash, by a path relative to the script (so that it works from any directory),
# before the script changes directory:
#   . "$(dirname "$0")/lib.sh"                    scripts/*
#   . "$(dirname "$0")/../../scripts/lib.sh"      tests/*/*
#
#   log MESSAGE...           "[NAME HH:MM:SS] MESSAGE" on stderr; NAME is LOG_NAME, set before
#                            sourcing, else the script's file name
#   step/info/ok MESSAGE...  a long run's progress on stdout, with the seconds since it started:
#                            "[  12.3s] == MESSAGE" (a new step), "[  12.3s]    MESSAGE",
#                            "[  12.3s] ok MESSAGE"
#   fail MESSAGE...          "[  12.3s] FAIL MESSAGE" on stderr, and exit 1
#   apt_install PACKAGE...   installs Debian packages with apt, quietly, saying so with log
#                            (needs root: without it, says what is missing and returns 1)
#   apt_install_missing COMMAND[=PACKAGE]...
#                            apt_install the package of each COMMAND not on PATH (PACKAGE
#                            defaults to COMMAND), all in one apt run
#   debian_tool PACKAGE PATH a file of a Debian package, downloaded and unpacked (not
#                            installed) into a cache; prints its path

LOG_NAME=${LOG_NAME:-${0##*/}}
log() { printf '[%s %(%H:%M:%S)T] %s\n' "$LOG_NAME" -1 "$*" >&2; }

LIB_T0=$(date +%s.%N)
elapsed() { awk -v a="$LIB_T0" -v b="$(date +%s.%N)" 'BEGIN{printf "%6.1f", b-a}'; }
step() { printf '\n[%ss] == %s\n' "$(elapsed)" "$*"; }
info() { printf '[%ss]    %s\n' "$(elapsed)" "$*"; }
ok() { printf '[%ss] ok %s\n' "$(elapsed)" "$*"; }
fail() { printf '[%ss] FAIL %s\n' "$(elapsed)" "$*" >&2; exit 1; }

apt_install() {
  [ "$(id -u)" = 0 ] || { log "missing $* (run as root, or install them)"; return 1; }
  log "installing $*"
  apt-get update -qq >/dev/null 2>&1 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

apt_install_missing() {
  local want packages=()
  for want in "$@"; do
    command -v "${want%%=*}" >/dev/null || packages+=("${want#*=}")
  done
  [ ${#packages[@]} = 0 ] || apt_install "${packages[@]}"
}

# debian_tool PKG PATH: the file PATH (e.g. usr/bin/promtool) of Debian's package PKG, downloaded
# and unpacked (not installed: no daemon starts, nothing else changes) into
# /var/tmp/shim-agent-tools/PKG/ (SHIM_AGENT_TOOLS) and reused from there; prints its path.
debian_tool() {
  local pkg=$1 dir=${SHIM_AGENT_TOOLS:-/var/tmp/shim-agent-tools}/$1
  if [ ! -x "$dir/root/$2" ]; then
    mkdir -p "$dir/deb"
    rm -f "$dir"/deb/*.deb
    # apt-get download fails when the package index is missing (a fresh machine): update it
    # once, then try again
    if ! (cd "$dir/deb" && apt-get download "$pkg") >/dev/null 2>&1; then
      apt-get update >/dev/null 2>&1 || true
      (cd "$dir/deb" && apt-get download "$pkg") >/dev/null 2>&1 || { log "cannot download Debian's $pkg package"; return 1; }
    fi
    rm -rf "$dir/root"
    dpkg-deb -x "$dir"/deb/"${pkg}"_*.deb "$dir/root"
    [ -x "$dir/root/$2" ] || { log "no $2 in Debian's $pkg package"; return 1; }
  fi
  echo "$dir/root/$2"
}
