#!/usr/bin/env bash
# Starts N ranks of a job without any launcher library, the way a test harness spawns them: each process gets
# RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT (torchrun's
# variables), and nothing else. Unlike mpirun and torchrun it does not end the job when one rank dies, so that
# tests can see what the survivors say. Once one rank has failed, the others get GRACE seconds (default 5) to
# finish and are then killed (a stopped rank would wait forever). Exits with the largest exit status.
#
#   tests/spawn_ranks.sh N [--grace S] COMMAND ARGS...
set -uo pipefail
n=$1
shift
grace=5
if [ "${1:-}" = --grace ]; then
  grace=$2
  shift 2
fi
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
# Polls rather than `wait -n`, which would block past the deadline while a stopped rank never exits.
finished() { [ ! -d "/proc/$1" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }
worst=0
deadline=""
while [ ${#pids[@]} -gt 0 ]; do
  running=()
  for pid in "${pids[@]}"; do
    if finished "$pid"; then
      wait "$pid"
      rc=$?
      [ "$rc" -gt "$worst" ] && worst=$rc
      [ "$rc" -ne 0 ] && [ -z "$deadline" ] && deadline=$(($(date +%s) + grace))
    else
      running+=("$pid")
    fi
  done
  pids=("${running[@]}")
  [ ${#pids[@]} -eq 0 ] && break
  if [ -n "$deadline" ] && [ "$(date +%s)" -ge "$deadline" ]; then
    echo "spawn_ranks.sh: killing ${#pids[@]} rank(s) still running ${grace} s after the first failure" >&2
    kill -KILL "${pids[@]}" 2>/dev/null
    wait
    worst=$((worst > 137 ? worst : 137))
    break
  fi
  sleep 0.1
done
exit "$worst"
