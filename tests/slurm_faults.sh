#!/bin/bash
# Faults of a Slurm job on the emulated cluster (scripts/local-cluster.sh slurm): examples/slurm/train_mnist.sbatch
# runs 4 ranks on 2 nodes; once it trains, one of
#   scancel: the job is cancelled; every rank says it got SIGTERM, Slurm says the job was cancelled;
#   kill:    one rank (on the second node) is killed with SIGKILL; srun (--kill-on-bad-exit) names the task and
#            ends the others;
#   slurmd:  the second node's slurmd is stopped, as a failing node's goes. Its ranks run on, out of Slurm's reach:
#            once Slurm declares the node down it ends the job (NODE_FAIL) and the first node's ranks, and the
#            stranded ranks must then name their lost peers and exit by themselves (per-task output files, which
#            the node writes itself, show it). The slurmd is started again afterwards;
#   requeue: the job (sbatch --requeue, checkpointing every 20 steps, --resume auto) is requeued mid-epoch
#            (scontrol requeue, as a preemption does); it runs again, resumes from the newest step every rank holds
#            and ends COMPLETED with the accuracy of the same job run straight through;
# then the job must end and no train_mnist may be left on any host (ps in each namespace).
#   slurm_faults.sh scancel|kill|slurmd|requeue   (from the repository, with the cluster's HOPWISE_CLUSTER_PREFIX)
set -euo pipefail
fault=$1
# shellcheck source=scripts/cluster-env.sh
. "$(dirname "$0")/../scripts/cluster-env.sh"
load_state
cd "$repo"
slurm=("$repo/scripts/local-cluster.sh" slurm)
out=$(mktemp -d /tmp/hopwise-slurm.XXXXXX)
chmod 755 "$out"
submit() {  # [SBATCH_OPTION...] -- [TRAIN_MNIST_FLAG...]: the job's id
  local opts=()
  while [ "$1" != -- ]; do opts+=("$1"); shift; done
  shift
  local id
  id=$("${slurm[@]}" run sbatch --parsable "${opts[@]}" examples/slurm/train_mnist.sbatch "$@")
  echo "${id%%;*}"
}
job_state() { "${slurm[@]}" run scontrol show job "$1" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true; }
wait_end() {  # JOB: waits (up to 4 minutes) until it ends; prints its state
  local st=""
  for _ in $(seq 1 480); do
    st=$(job_state "$1")
    case $st in PENDING | RUNNING | COMPLETING | CONFIGURING | REQUEUED | "") sleep 0.5 ;; *) break ;; esac
  done
  echo "$st"
}
accuracy() { grep -o "test accuracy [0-9.]*% after" "$1" | tail -1 | awk '{print $3}'; }
ranks_on() {  # HOST: the pids of train_mnist processes in its namespace
  local p
  for p in $(ip netns pids "$1" 2>/dev/null); do
    [ "$(cat /proc/"$p"/comm 2>/dev/null)" != train_mnist ] || echo "$p"
  done
}

trap '"${slurm[@]}" run scancel "${job:-0}" "${straight:-0}" 2>/dev/null || true; rm -rf "$out"' EXIT
case $fault in
  requeue)
    # The same reduction order in both jobs (no tuning), so that equal training gives equal bits.
    flags=(--limit 12800 --algo ring)
    job=$(submit --requeue --open-mode=append --output="$out/job.out" -- "${flags[@]}" --checkpoint "$out/ckpt" \
      --checkpoint-every 20 --resume auto) ;;
  slurmd)
    # Each task's output in a file of its own, written by its node: the stranded ranks' lines outlive srun.
    # --no-requeue: Slurm would otherwise requeue a batch job whose node failed (the requeue case tests that).
    job=$(HOPWISE_TIMEOUT_S=10 SLURM_STDOUTMODE="$out/task-%t.out" SLURM_STDERRMODE="$out/task-%t.out" \
      submit --no-requeue --output="$out/job.out" -- --epochs 50 --limit 12800) ;;
  scancel | kill) job=$(submit --output="$out/job.out" -- --epochs 50 --limit 12800) ;;
  *) echo "slurm_faults.sh: unknown fault '$fault'" >&2; exit 2 ;;
esac
echo "slurm_faults.sh: job $job submitted"
trained="25% loss"
[ "$fault" != requeue ] || trained="50% loss"  # past the checkpoint of step 40
log="$out/job.out"
[ "$fault" != slurmd ] || log="$out/task-0.out"
for _ in $(seq 1 600); do grep -qs "$trained" "$log" && break; sleep 0.1; done
grep -qs "$trained" "$log" || { cat "$log"; echo "slurm_faults.sh: the job never trained"; exit 1; }
# The job's second node: where Slurm placed it, whichever of the cluster's hosts that is.
second=$("${slurm[@]}" run scontrol show hostnames "$("${slurm[@]}" run squeue -h -j "$job" -o %N)" | sed -n 2p)
[ -n "$second" ] || { echo "slurm_faults.sh: job $job has no second node"; exit 1; }
echo "slurm_faults.sh: the job runs on 2 nodes; the second is $second"
t0=$(date +%s)
case $fault in
  scancel) "${slurm[@]}" run scancel "$job" ;;
  requeue)
    "${slurm[@]}" run scontrol requeue "$job"
    # The same job straight through, while Slurm holds the requeued one (the step credential's lifetime): the
    # nodes are free then, and the requeued job starts after it.
    straight=$(submit --output="$out/straight.out" -- "${flags[@]}")
    st=$(wait_end "$straight")
    echo "slurm_faults.sh: the straight job $straight ended $st: accuracy $(accuracy "$out/straight.out")"
    [ "$st" = COMPLETED ] || { cat "$out/straight.out"; echo "slurm_faults.sh: the straight job did not complete"; exit 1; } ;;
  kill)
    mapfile -t pids < <(ranks_on "$second")
    [ ${#pids[@]} -gt 0 ] || { echo "slurm_faults.sh: no train_mnist on $second"; exit 1; }
    kill -9 "${pids[0]}" ;;
  slurmd) "${slurm[@]}" slurmd stop "${second#"$prefix"}" ;;
esac
echo "slurm_faults.sh: $fault done"
ended=$(wait_end "$job")
echo "slurm_faults.sh: job $job ended $ended within $(($(date +%s) - t0)) s"
cat "$out/job.out"
case $fault in
  requeue)
    echo "slurm_faults.sh: requeued job: accuracy $(accuracy "$out/job.out"), straight: $(accuracy "$out/straight.out")"
    [ -n "$(accuracy "$out/job.out")" ] && [ "$(accuracy "$out/job.out")" = "$(accuracy "$out/straight.out")" ] ||
      { echo "slurm_faults.sh: the requeued job's accuracy differs from the straight job's"; exit 1; } ;;
  slurmd)
    # The stranded ranks (2 and 3) go by themselves once their peers are gone: within hopwise's timeout.
    for _ in $(seq 1 300); do [ -z "$(ranks_on "$second")" ] && break; sleep 0.1; done
    echo "slurm_faults.sh: $second's ranks were gone $(($(date +%s) - t0)) s after its slurmd stopped"
    # Each task's failure line (UCX's and Slurm's lines of the teardown may follow it), else its last lines.
    for t in 2 3; do
      line=$(grep -m1 "train_mnist: hopwise: rank" "$out/task-$t.out" || grep -v "% loss" "$out/task-$t.out" | tail -3)
      echo "task $t: $(tr '\n' ' ' <<< "$line")"
    done
    "${slurm[@]}" slurmd start "${second#"$prefix"}" ;;
esac
left=""
for ((i = 0; i < N; i++)); do
  for p in $(ranks_on "$prefix$i"); do left+=" $prefix$i:$p"; done
done
[ -z "$left" ] || { echo "slurm_faults.sh: train_mnist processes left behind:$left"; exit 1; }
echo "slurm_faults.sh: no train_mnist left on any of the $N hosts"
