# shellcheck shell=bash
# What the emulated cluster's scripts (local-cluster.sh, local-slurm.sh) share: which cluster (prefix, subnet,
# state directory), how its hosts are named and addressed, and how to run a command inside one. Sourced, not run.
#
# Environment: HOPWISE_CLUSTER_PREFIX (host name prefix, default h) and HOPWISE_CLUSTER_SUBNET (first three
# octets of the /24, default 10.200.0) let two clusters coexist; HOPWISE_CLUSTER_STATE_ROOT (default
# /run/hopwise-cluster) holds each cluster's state.

# shellcheck disable=SC2034  # used by the scripts that source this
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
prefix=${HOPWISE_CLUSTER_PREFIX:-h}
subnet=${HOPWISE_CLUSTER_SUBNET:-10.200.0}
state_root=${HOPWISE_CLUSTER_STATE_ROOT:-/run/hopwise-cluster}
state=$state_root/$prefix

die() {
  echo "$(basename "$0"): $*" >&2
  exit 1
}

# Ends in a letter so that the host number after it is unambiguous; short enough for 15-character link names.
[[ $prefix =~ ^[a-z]([a-z0-9]{0,7}[a-z])?$ ]] ||
  die "HOPWISE_CLUSTER_PREFIX='$prefix' must be 1 to 9 lower-case letters or digits, first and last a letter"
[[ $subnet =~ ^(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){2}$ ]] ||
  die "HOPWISE_CLUSTER_SUBNET='$subnet' must be three octets, e.g. 10.200.0"

# Settings written by local-cluster.sh up: N, SLOTS.
load_state() {
  [ -f "$state/cluster.env" ] ||
    die "no cluster '$prefix' is up (no $state/cluster.env); start one with: scripts/local-cluster.sh up N"
  # shellcheck disable=SC1091
  . "$state/cluster.env"
}

host() { echo "$prefix$1"; }
address() { echo "$subnet.$(($1 + 1))"; }

# Runs a command inside host i, with that host's name (Open MPI and Slurm know a node by its host name).
in_host() {
  local h
  h=$(host "$1")
  shift
  ip netns exec "$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$h" "$@"
}

# Benchmarks' own cluster: own_cluster N RATE [slurm] brings up N hosts (after removing a stale one of the same
# prefix), shapes their links to RATE, starts Slurm if asked, and removes it all, with the scratch directory $out,
# when the script exits.
own_cluster() {
  local n=$1 rate=$2 with=${3:-}
  cluster="$repo/scripts/local-cluster.sh"
  out=$(mktemp -d)
  trap '"$cluster" down >/dev/null 2>&1 || true; rm -rf "$out"' EXIT
  "$cluster" down >/dev/null 2>&1 || true
  "$cluster" up "$n" >/dev/null
  [ "$with" != slurm ] || "$cluster" slurm up >/dev/null
  "$cluster" shape "$rate" >/dev/null
}

# Benchmarks build nothing: each program they need (a path from the repository) must be there already.
need_built() {
  local p
  for p in "$@"; do [ -x "$repo/$p" ] || die "$p is missing; run scripts/build.sh first"; done
}
