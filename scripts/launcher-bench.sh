#!/usr/bin/env bash
# The same train_mnist job (4 ranks, 2 per host, one epoch of 12800 images) on 2 emulated hosts with shaped links,
# started by each launcher in turn: mpirun, torchrun (an agent per host), srun --mpi=pmix and srun --mpi=none
# (a real Slurm, scripts/local-slurm.sh). Repetitions interleave the launchers; the table gives each one's median
# step time and its ratio to mpirun's, with the test accuracy.
# Usage: scripts/launcher-bench.sh [RATE] [REPS]   (default 1gbit, 3). Needs root; builds nothing (run
# scripts/build.sh first). Brings up its own cluster "lb" and removes it at the end.
set -Eeuo pipefail

rate=${1:-1gbit}
reps=${2:-3}
export HOPWISE_CLUSTER_PREFIX=lb HOPWISE_CLUSTER_SUBNET=10.204.0
# shellcheck source=scripts/cluster-env.sh
. "$(dirname "$0")/cluster-env.sh"
train=build/bin/train_mnist
need_built "$train"
own_cluster 2 "$rate" slurm
cd "$repo"

flags=(--epochs 1 --limit 12800 --batch 128)
launchers=(mpirun torchrun "srun --mpi=pmix" "srun --mpi=none")
run() {  # LAUNCHER: the job's output
  case $1 in
    mpirun) "$cluster" run -np 4 --map-by slot "$train" "${flags[@]}" ;;
    torchrun) "$cluster" torchrun --nnodes 2 --nproc_per_node 2 "$train" "${flags[@]}" ;;
    srun*) "$cluster" slurm run $1 -N 2 -n 4 "$train" "${flags[@]}" ;;
  esac 2>&1
}
for ((r = 1; r <= reps; r++)); do
  for l in "${launchers[@]}"; do
    run "$l" >"$out/run" || { cat "$out/run"; echo "launcher-bench.sh: $l failed" >&2; exit 1; }
    step=$(grep -o "step [0-9.]* ms" "$out/run" | tail -1 | awk '{print $2}')
    acc=$(grep -o "test accuracy [0-9.]*% after" "$out/run" | tail -1 | awk '{print $3}')
    hosts=$(grep -o "ranks over [a-z]* on [0-9]* host" "$out/run" | head -1)
    echo "$l|$step|$acc|$hosts" >>"$out/rows"
    echo "rep $r: $l: step $step ms, accuracy $acc ($hosts)"
  done
done
echo
echo "train_mnist, 4 ranks on 2 emulated hosts at $rate, median of $reps interleaved runs:"
python3 - "$out/rows" "${launchers[@]}" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("|") for l in open(sys.argv[1])]
order = sys.argv[2:]
med = {l: statistics.median(float(r[1]) for r in rows if r[0] == l) for l in order}
print("| launcher | transport | step (ms) | vs mpirun | test accuracy |")
print("|---|---|---|---|---|")
for l in order:
    mine = [r for r in rows if r[0] == l]
    print(f"| `{l}` | {mine[0][3].split()[2]} | {med[l]:.1f} | {med[l] / med[order[0]]:.2f} | {mine[0][2]} |")
PY
