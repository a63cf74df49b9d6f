#!/bin/bash
# Faults of a Slurm job on the emulated cluster (scripts/local-cluster.sh slurm): examples/slurm/train_mnist.sbatch
# runs 4 ranks on 2 nodes; once it trains, one of
#   scancel: the job is cancelled; every rank says it got SIGTERM, Slurm says the job was cancelled;
#   kill:    one rank (on the second node) is killed with SIGKILL; srun (--kill-on-bad-exit) names the task and
#            ends the others;
# then the job must end (CANCELLED, FAILED) and no train_mnist may be left on any host (ps in each namespace).
#   slurm_faults.sh scancel|kill      (from the repository, with the cluster's HOPWISE_CLUSTER_PREFIX)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
fault=$1
prefix=${HOPWISE_CLUSTER_PREFIX:-h}
state=${HOPWISE_CLUSTER_STATE_ROOT:-/run/hopwise-cluster}/$prefix
. "$state/cluster.env"
slurm=("$repo/scripts/local-cluster.sh" slurm run)
out=$(mktemp -d /tmp/hopwise-slurm.XXXXXX)
chmod 755 "$out"
job=$("${slurm[@]}" sbatch --parsable --output="$out/job.out" examples/slurm/train_mnist.sbatch --epochs 50 --limit 12800)
job=${job%%;*}
trap '"${slurm[@]}" scancel "$job" 2>/dev/null || true; rm -rf "$out"' EXIT
echo "slurm_faults.sh: job $job submitted"
ranks_on() {  # HOST: the pids of train_mnist processes in its namespace
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" != train_mnist ] || echo "$p"
  done
}
job_state() { "${slurm[@]}" scontrol show job "$job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }
for _ in $(seq 1 600); do grep -qs "25% loss" "$out/job.out" && break; sleep 0.1; done
grep -qs "25% loss" "$out/job.out" || { cat "$out/job.out"; echo "slurm_faults.sh: the job never trained"; exit 1; }
case $fault in
  scancel) "${slurm[@]}" scancel "$job" ;;
  kill)
    pids=($(ranks_on "${prefix}1"))
    [ ${#pids[@]} -gt 0 ] || { echo "slurm_faults.sh: no train_mnist on ${prefix}1"; exit 1; }
    kill -9 "${pids[0]}" ;;
  *) echo "slurm_faults.sh: unknown fault '$fault'" >&2; exit 2 ;;
esac
echo "slurm_faults.sh: $fault done $(date +%s.%N | cut -c1-14)"
t0=$(date +%s)
state=""
for _ in $(seq 1 240); do
  state=$(job_state)
  case $state in PENDING | RUNNING | COMPLETING | CONFIGURING | "") sleep 0.5 ;; *) break ;; esac
done
echo "slurm_faults.sh: job $job ended $state within $(($(date +%s) - t0)) s"
cat "$out/job.out"
left=""
for ((i = 0; i < N; i++)); do
  for p in $(ranks_on "$prefix$i"); do left+=" $prefix$i:$p"; done
done
[ -z "$left" ] || { echo "slurm_faults.sh: train_mnist processes left behind:$left"; exit 1; }
echo "slurm_faults.sh: no train_mnist left on any of the $N hosts"
