#!/bin/bash
# The restart path as a user meets it: a trainer (train_mnist, or the torch example) under torchrun --max-restarts
# with --checkpoint-every and --resume auto; once a checkpoint is in place, one rank is killed with SIGKILL (rank 1,
# then in a second run rank 0, which serves the job's store; or RUNS=x10: ten kills of random ranks in one run). torchrun stops the others and starts every rank again;
# they agree on the newest step all of them hold, resume there and finish by themselves with the test accuracy of an
# uninterrupted run of the same flags and seed (the same model: a resumed step is computed as it was). Prints each
# run's wall time and the time the kill cost.
#   restart_check.sh TORCHRUN WORKDIR NPROC PROGRAM [ARGS...]   (torchrun's program: --no-python BIN ARGS, or SCRIPT ARGS;
#   TORCHRUN scripts/local-cluster.sh: across 2 emulated hosts, NPROC/2 ranks on each, PROGRAM a binary and its ARGS)
# EVERY (10) steps between checkpoints; the kill comes KILL_DELAY (0) s after step KILL_AFTER's (10) checkpoint.
set -euo pipefail
every=${EVERY:-10} kill_after=${KILL_AFTER:-10} kill_delay=${KILL_DELAY:-0}
torchrun=$1 dir=$2 np=$3
shift 3
program=("$@")
rm -rf "$dir"
mkdir -p "$dir"
launch() {  # NAME [RESTARTS]: a torchrun job writing $dir/NAME.{log,json}, checkpoints $dir/NAME.step*
  local how=(--standalone --nproc-per-node "$np" --monitor-interval 0.2)
  # TORCHRUN may be scripts/local-cluster.sh: one agent per emulated host, each host's ranks restarted by its own.
  [[ $torchrun == *local-cluster.sh ]] && how=(torchrun --nnodes 2 --nproc_per_node "$((np / 2))")
  "$torchrun" "${how[@]}" --max-restarts "$((${2:-1} + 1))" "${program[@]}" \
    --checkpoint-every "$every" --resume auto --checkpoint "$dir/$1" --json "$dir/$1.json" > "$dir/$1.log" 2>&1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
accuracy() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['test_accuracy'])" "$1"; }
rank_pid() {  # the pid of rank $1 of this script's job $2 (torchrun's agent has no RANK); empty: none running
  local pid
  for pid in $(pgrep -f -- "--checkpoint $dir/$2 " || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | grep -qx "RANK=$1"; then echo "$pid"; return 0; fi
  done
  return 0
}
fresh_step() {  # NAME MARKER MIN: a step >= MIN whose checkpoint every rank wrote after MARKER (empty: none yet)
  local f s
  for f in "$dir/$1".step*.rank0; do
    [ -e "$f" ] && [ "$f" -nt "$2" ] || continue
    s=${f#"$dir/$1.step"}
    s=${s%.rank0}
    [ "$s" -ge "$3" ] && [ "$dir/$1.step$s.rank$((np - 1))" -nt "$2" ] && { echo "$s"; return 0; }
  done
  return 0
}

t0=$(now)
launch straight || { cat "$dir/straight.log"; echo "the uninterrupted run failed"; exit 1; }
straight_s=$(since "$t0")
straight=$(accuracy "$dir/straight.json")
echo "uninterrupted: test accuracy $straight, ${straight_s} s"

# RUNS: one job per word: a rank's number (that rank killed once), or xN (N kills, each of a random rank, after
# every EVERY steps); default "1 0".
for run in ${RUNS:-1 0}; do
  name=kill$run kills=1
  [[ $run == x* ]] && kills=${run#x}
  t0=$(now)
  # Each kill waits for a checkpoint that every rank of the running attempt wrote (newer than the last kill): a
  # step's files from before a kill, and ranks that torchrun is still stopping, belong to the attempt already lost.
  marker="$dir/$name.last-kill"
  : > "$marker"
  launch "$name" "$kills" &
  job=$!
  for ((k = 0; k < kills; k++)); do
    step="" pid=""
    for _ in $(seq 1 6000); do
      step=$(fresh_step "$name" "$marker" "$((k == 0 ? kill_after : 0))")
      [ -n "$step" ] && break
      kill -0 "$job" 2> /dev/null || break
      sleep 0.05
    done
    sleep "$kill_delay"
    victim=$run
    [[ $run == x* ]] && victim=$((RANDOM % np))
    [ -n "$step" ] && pid=$(rank_pid "$victim" "$name")
    [ -n "$pid" ] || { wait "$job" || true; cat "$dir/$name.log"; echo "rank $victim was not found running (kill $((k + 1)) of $kills)"; exit 1; }
    kill -9 "$pid"
    : > "$marker"
    echo "killed rank $victim (pid $pid) at $(since "$t0") s, after step $step's checkpoint"
  done
  rc=0
  wait "$job" || rc=$?
  took=$(since "$t0")
  [ "$rc" = 0 ] || { cat "$dir/$name.log"; echo "the job did not finish by itself after the kills (rc $rc)"; exit 1; }
  # torchrun says each failed attempt (each host's agent, its own ranks'); an attempt killed before its first line
  # printed no resume line.
  failed=$(grep -c "failed (exitcode" "$dir/$name.log" || true)
  [ "$failed" -ge "$kills" ] || { cat "$dir/$name.log"; echo "$kills kill(s) but torchrun saw $failed failure(s)"; exit 1; }
  grep -q "resumed at step" "$dir/$name.log" || { cat "$dir/$name.log"; echo "no restarted attempt resumed"; exit 1; }
  got=$(accuracy "$dir/$name.json")
  echo "$kills kill(s): resumed at steps $(grep -o 'resumed at step [0-9]*' "$dir/$name.log" | awk '{printf "%s%s", sep, $4; sep=", "}'); test accuracy $got (uninterrupted $straight); ${took} s (+$(awk -v a="$took" -v b="$straight_s" 'BEGIN { printf "%.1f", a - b }') s)"
  /usr/bin/python3 -c "import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 0.003)" "$got" "$straight" ||
    { echo "the restarted run's accuracy is more than 0.3 point from the uninterrupted run's"; exit 1; }
done
ls "$dir"/*.tmp 2> /dev/null && { echo "a kill left a temporary file that a later save did not remove"; exit 1; }
echo "restart path ok"
