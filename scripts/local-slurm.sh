#!/usr/bin/env bash
# A real Slurm on the emulated cluster (scripts/local-cluster.sh): munge, one slurmctld in host 0 and one slurmd per
# host, each daemon inside its host's network namespace under the host's name, with its own spool, pid and log
# files, and a slurm.conf giving each node the cluster's slots as CPUs. Started through local-cluster.sh:
#
#   scripts/local-cluster.sh slurm up          start the daemons on the cluster that is up; waits for idle nodes
#   scripts/local-cluster.sh slurm run CMD...  CMD inside host 0 with SLURM_CONF set, from the repository
#                                              (sinfo, srun, sbatch --wait, scancel, squeue)
#   scripts/local-cluster.sh slurm down        stop the daemons (local-cluster.sh down does too)
#
# Environment: as local-cluster.sh's (HOPWISE_CLUSTER_PREFIX, HOPWISE_CLUSTER_SUBNET, HOPWISE_CLUSTER_STATE_ROOT).
# Needs root, slurmctld, slurmd, slurm-client and munge (scripts/setup.sh installs them).
set -Eeuo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=${HOPWISE_CLUSTER_PREFIX:-h}
subnet=${HOPWISE_CLUSTER_SUBNET:-10.200.0}
state_root=${HOPWISE_CLUSTER_STATE_ROOT:-/run/hopwise-cluster}
state=$state_root/$prefix
slurm=$state/slurm
conf=$slurm/slurm.conf

die() {
  echo "local-slurm.sh: $*" >&2
  exit 1
}

host() { echo "$prefix$1"; }
address() { echo "$subnet.$(($1 + 1))"; }
in_host() {
  local h
  h=$(host "$1")
  shift
  ip netns exec "$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$h" env SLURM_CONF="${SLURM_CONF:-$conf}" "$@"
}

load_cluster() {
  [ "$(id -u)" -eq 0 ] || die "Slurm's daemons run as root here (they start tasks in the hosts' namespaces); try sudo"
  [ -f "$state/cluster.env" ] || die "no cluster '$prefix' is up; start one first: scripts/local-cluster.sh up N"
  # shellcheck disable=SC1091
  . "$state/cluster.env"
  local missing=()
  for t in slurmctld slurmd sinfo srun sbatch munged; do
    command -v "$t" >/dev/null 2>&1 || [ -x "/usr/sbin/$t" ] || missing+=("$t")
  done
  [ ${#missing[@]} -eq 0 ] || die "missing ${missing[*]}: install slurmctld, slurmd, slurm-client and munge (scripts/setup.sh)"
}

write_conf() {
  mkdir -p "$slurm/ctld"
  {
    echo "# Written by scripts/local-slurm.sh for the emulated cluster '$prefix' ($N hosts, $SLOTS slots each)."
    echo "ClusterName=hopwise-$prefix"
    echo "SlurmctldHost=$(host 0)($(address 0))"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "StateSaveLocation=$slurm/ctld"
    echo "SlurmdSpoolDir=$slurm/spool-%n"
    echo "SlurmctldPidFile=$slurm/slurmctld.pid"
    echo "SlurmdPidFile=$slurm/slurmd-%n.pid"
    echo "SlurmctldLogFile=$slurm/slurmctld.log"
    echo "SlurmdLogFile=$slurm/slurmd-%n.log"
    # No cgroups: the hosts are namespaces of one kernel, and a container may not delegate its cgroup tree.
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "AccountingStorageType=accounting_storage/none"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_CPU"
    echo "MpiDefault=none"
    echo "ReturnToService=2"
    # The hosts share this machine's cores: each node's CPUs are the cluster's slots, whatever the kernel counts.
    echo "SlurmdParameters=config_overrides"
    echo "SlurmdTimeout=30"
    echo "KillWait=5"
    local i
    for ((i = 0; i < N; i++)); do
      echo "NodeName=$(host "$i") NodeAddr=$(address "$i") CPUs=$SLOTS State=UNKNOWN"
    done
    echo "PartitionName=emulated Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
  } >"$conf"
  # slurmd reads cgroup.conf beside slurm.conf and sets up its cgroup plugin even when no job uses it: name the
  # hierarchy this machine mounts (v2 where /sys/fs/cgroup is cgroup2, else v1) rather than let it guess.
  local version=v1
  [ "$(stat -f -c %T /sys/fs/cgroup 2>/dev/null)" != cgroup2fs ] || version=v2
  printf 'CgroupPlugin=cgroup/%s\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n' "$version" >"$slurm/cgroup.conf"
  # Each slurmd reads its own copy, beside which its mpi.conf gives PMIx a temporary directory of the node's own:
  # the hosts share /tmp, where srun --mpi=pmix would make the same directory on every node.
  for ((i = 0; i < N; i++)); do
    local h
    h=$(host "$i")
    mkdir -p "$slurm/spool-$h" "$slurm/tmp-$h" "$slurm/etc-$h"
    cp "$conf" "$slurm/cgroup.conf" "$slurm/etc-$h/"
    echo "PMIxCliTmpDirBase=$slurm/tmp-$h" >"$slurm/etc-$h/mpi.conf"
  done
}

start_munge() {
  if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null >/dev/null 2>&1; then return; fi
  [ -s /etc/munge/munge.key ] || die "no /etc/munge/munge.key: reinstall munge (its package creates the key)"
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  runuser -u munge -- /usr/sbin/munged
  echo started >"$slurm/munge-started"
  for _ in $(seq 1 50); do munge -n </dev/null >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged did not answer within 5 s (see /var/log/munge/munged.log)"
}

cmd_up() {
  load_cluster
  [ ! -e "$slurm/up" ] || die "Slurm is already up on cluster '$prefix'; 'slurm down' first"
  mkdir -p "$slurm"
  write_conf
  start_munge
  in_host 0 slurmctld -f "$conf"
  local i
  for ((i = 0; i < N; i++)); do
    SLURM_CONF="$slurm/etc-$(host "$i")/slurm.conf" in_host "$i" slurmd -f "$slurm/etc-$(host "$i")/slurm.conf" -N "$(host "$i")"
  done
  touch "$slurm/up"
  local states=""
  for _ in $(seq 1 300); do
    states=$(in_host 0 sinfo -h -N -o "%N %T" 2>/dev/null || true)
    [ "$(grep -c " idle$" <<<"$states" || true)" -eq "$N" ] && break
    sleep 0.1
  done
  [ "$(grep -c " idle$" <<<"$states" || true)" -eq "$N" ] ||
    die "the nodes are not all idle after 30 s: $(tr '\n' ' ' <<<"$states") (logs: $slurm/*.log)"
  echo "slurm up on cluster '$prefix': slurmctld in $(host 0), a slurmd in each of $(host 0)..$(host $((N - 1)))"
  in_host 0 sinfo
}

cmd_run() {
  load_cluster
  [ -e "$slurm/up" ] || die "Slurm is not up on cluster '$prefix': scripts/local-cluster.sh slurm up"
  cd "$repo"
  in_host 0 "$@"
}

# Every daemon by its pid file; jobs' tasks with them (local-cluster.sh down kills whatever is left in the hosts).
cmd_down() {
  [ -d "$slurm" ] || { echo "slurm is not up on cluster '$prefix'; nothing to stop"; return 0; }
  if [ -f "$state/cluster.env" ] && [ -e "$slurm/up" ]; then
    # shellcheck disable=SC1091
    . "$state/cluster.env"
    in_host 0 scancel --quiet --full --partition emulated 2>/dev/null || true
  fi
  local f pid
  for f in "$slurm"/slurmd-*.pid "$slurm"/slurmctld.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  # munged serves every cluster on this machine: stopped only by the cluster that started it, once no other
  # cluster's Slurm is up.
  local others
  others=$(find "$state_root" -mindepth 3 -maxdepth 3 -path "*/slurm/up" ! -path "$slurm/up" 2>/dev/null | head -1)
  if [ -e "$slurm/munge-started" ] && [ -z "$others" ]; then pkill -x munged 2>/dev/null || true; fi
  rm -rf "${slurm:?}"
  echo "slurm down on cluster '$prefix'"
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  run) shift; [ $# -gt 0 ] || die "run: give a command, e.g. sinfo"; cmd_run "$@" ;;
  down) shift; cmd_down ;;
  *) sed -n '6,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
