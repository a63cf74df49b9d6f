#!/usr/bin/env bash
# A real Slurm on the emulated cluster (scripts/local-cluster.sh): munge, one slurmctld in host 0 and one slurmd per
# host, each daemon inside its host's network namespace under the host's name, with its own spool, pid and log
# files, and a slurm.conf giving each node the cluster's slots as CPUs. Started through local-cluster.sh:
#
#   scripts/local-cluster.sh slurm up          start the daemons on the cluster that is up; waits for idle nodes
#   scripts/local-cluster.sh slurm run CMD...  CMD inside host 0 with SLURM_CONF set, from the repository
#                                              (sinfo, srun, sbatch --wait, scancel, squeue)
#   scripts/local-cluster.sh slurm slurmd stop|start I   stop host I's slurmd (as a failing node's goes), or start it
#                                              again and wait until the node is back (idle)
#   scripts/local-cluster.sh slurm down        stop the daemons (local-cluster.sh down does too)
#
# Environment: as local-cluster.sh's (HOPWISE_CLUSTER_PREFIX, HOPWISE_CLUSTER_SUBNET, HOPWISE_CLUSTER_STATE_ROOT).
# Needs root, slurmctld, slurmd, slurm-client and munge (scripts/setup.sh installs them).
set -Eeuo pipefail

# shellcheck source=scripts/cluster-env.sh
. "$(dirname "$0")/cluster-env.sh"
slurm=$state/slurm
conf=$slurm/slurm.conf

# Slurm's commands and daemons inside host i, reading this cluster's slurm.conf unless SLURM_CONF names another.
in_node() {
  local i=$1
  shift
  in_host "$i" env SLURM_CONF="${SLURM_CONF:-$conf}" "$@"
}

load_cluster() {
  [ "$(id -u)" -eq 0 ] || die "Slurm's daemons run as root here (they start tasks in the hosts' namespaces); try sudo"
  load_state
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
    # A requeued job waits the step credential's lifetime before it starts again (120 s by default); the emulated
    # nodes launch a step within seconds, so 20 s is ample, and a requeue test does not stand idle for two minutes.
    echo "AuthInfo=cred_expire=20"
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

start_slurmd() {  # I: host I's slurmd, reading its own copy of the configuration
  local etc
  etc=$slurm/etc-$(host "$1")
  SLURM_CONF="$etc/slurm.conf" in_node "$1" slurmd -f "$etc/slurm.conf" -N "$(host "$1")"
}

stop_pid_file() {  # FILE: SIGTERM, 5 s to go, then SIGKILL
  [ -e "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}

node_state() { in_node 0 sinfo -h -N -n "$(host "$1")" -o %T 2>/dev/null | head -1 || true; }

cmd_slurmd() {  # stop|start I
  load_cluster
  [ -e "$slurm/up" ] || die "Slurm is not up on cluster '$prefix': scripts/local-cluster.sh slurm up"
  local what=${1:-} i=${2:-}
  [[ $i =~ ^[0-9]+$ ]] && [ "$i" -lt "$N" ] || die "slurmd: give a host number, 0 to $((N - 1)) (got '$i')"
  case $what in
    stop)
      stop_pid_file "$slurm/slurmd-$(host "$i").pid"
      echo "slurmd stopped on $(host "$i"); its running tasks stay, as on a node whose daemon fails" ;;
    start)
      start_slurmd "$i"
      local st=""
      for _ in $(seq 1 600); do
        st=$(node_state "$i")
        [ "$st" = idle ] && break
        sleep 0.1
      done
      [ "$st" = idle ] || die "$(host "$i") is '$st', not idle, 60 s after its slurmd started (log: $slurm/slurmd-$(host "$i").log)"
      echo "slurmd started on $(host "$i"); the node is idle" ;;
    *) die "slurmd: say stop or start (got '$what')" ;;
  esac
}

cmd_up() {
  load_cluster
  [ ! -e "$slurm/up" ] || die "Slurm is already up on cluster '$prefix'; 'slurm down' first"
  mkdir -p "$slurm"
  write_conf
  start_munge
  in_node 0 slurmctld -f "$conf"
  local i
  for ((i = 0; i < N; i++)); do start_slurmd "$i"; done
  touch "$slurm/up"
  local states=""
  for _ in $(seq 1 300); do
    states=$(in_node 0 sinfo -h -N -o "%N %T" 2>/dev/null || true)
    [ "$(grep -c " idle$" <<<"$states" || true)" -eq "$N" ] && break
    sleep 0.1
  done
  [ "$(grep -c " idle$" <<<"$states" || true)" -eq "$N" ] ||
    die "the nodes are not all idle after 30 s: $(tr '\n' ' ' <<<"$states") (logs: $slurm/*.log)"
  echo "slurm up on cluster '$prefix': slurmctld in $(host 0), a slurmd in each of $(host 0)..$(host $((N - 1)))"
  in_node 0 sinfo
}

cmd_run() {
  load_cluster
  [ -e "$slurm/up" ] || die "Slurm is not up on cluster '$prefix': scripts/local-cluster.sh slurm up"
  cd "$repo"
  in_node 0 "$@"
}

# Every daemon by its pid file; jobs' tasks with them (local-cluster.sh down kills whatever is left in the hosts).
cmd_down() {
  [ -d "$slurm" ] || { echo "slurm is not up on cluster '$prefix'; nothing to stop"; return 0; }
  if [ -f "$state/cluster.env" ] && [ -e "$slurm/up" ]; then
    # shellcheck disable=SC1091
    . "$state/cluster.env"
    in_node 0 scancel --quiet --full --partition emulated 2>/dev/null || true
  fi
  local f
  for f in "$slurm"/slurmd-*.pid "$slurm"/slurmctld.pid; do stop_pid_file "$f" & done
  wait
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
  slurmd) shift; cmd_slurmd "$@" ;;
  down) shift; cmd_down ;;
  *) sed -n '6,11p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
