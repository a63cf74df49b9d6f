#!/bin/bash
# The file store across runs and restarts, as torchrun users meet them (HOPWISE_STORE=file:///DIR):
#   1. two runs into one directory, one after the other: both pass, and each leaves no directory behind;
#   2. torchrun --max-restarts 1 with rank 1 killed (SIGKILL) in the first attempt, after the ranks met there: the
#      second attempt meets in the same directory (its rank 0 clears the first attempt's keys) and passes;
#   3. a run whose rank died and was not restarted leaves the directory; the next run refuses it as stale, naming it;
#   4. a directory every user may write (mode 0777, no sticky bit) is refused, saying how to make a safe one.
#   file_store_runs.sh TORCHRUN FAULT_DRIVER WORKDIR
set -uo pipefail
torchrun=$1 driver=$2 work=$3
dir=$work/store
rm -rf "$work"
mkdir -p "$work"
run() {
  OMP_NUM_THREADS=1 HOPWISE_STORE="file://$dir" HOPWISE_TIMEOUT_S=30 "$torchrun" --standalone --nproc_per_node 2 \
    --redirects 1 --tee 1 "$@"
}
fail() { echo "FAILED: $*"; exit 1; }

for i in 1 2; do
  run --no_python "$driver" --iters 5 > "$work/run$i.log" 2>&1 || { cat "$work/run$i.log"; fail "run $i"; }
  [ "$(grep -c 'ok after 5 iterations' "$work/run$i.log")" -eq 2 ] || { cat "$work/run$i.log"; fail "run $i: not both ranks ok"; }
  [ ! -e "$dir" ] || { ls -la "$dir"; fail "run $i left $dir behind"; }
done
echo "two runs into one directory: both passed, nothing left behind"

cat > "$work/attempt.sh" <<SCRIPT
#!/bin/sh
# The first attempt's rank 1 dies after the ranks met; the next attempt runs clean.
if [ "\${TORCHELASTIC_RESTART_COUNT:-0}" = 0 ]; then exec "$driver" --iters 5 --fault kill --rank 1 --at 2; fi
exec "$driver" --iters 5
SCRIPT
chmod +x "$work/attempt.sh"
run --max_restarts 1 --no_python "$work/attempt.sh" > "$work/restart.log" 2>&1 || { cat "$work/restart.log"; fail "the restarted job"; }
[ "$(grep -c 'ok after 5 iterations' "$work/restart.log")" -eq 2 ] || { cat "$work/restart.log"; fail "the second attempt: not both ranks ok"; }
echo "a restart met in the first attempt's directory and passed"

run --no_python "$driver" --iters 5 --fault kill --rank 1 --at 2 > "$work/died.log" 2>&1 && fail "a run with a killed rank passed"
[ -e "$dir/job" ] || fail "the run that died left no directory to find stale"
run --no_python "$driver" --iters 5 > "$work/stale.log" 2>&1 && { cat "$work/stale.log"; fail "a stale directory was used"; }
grep -q "store: directory '$dir' holds the keys of job .* (a stale directory of an earlier run?): remove it" \
  "$work/stale.log" ||
  { cat "$work/stale.log"; fail "the stale directory was not named"; }
echo "a directory left by a run that died was refused as stale"

rm -rf "$dir" && mkdir -m 777 "$dir" && chmod 777 "$dir"
run --no_python "$driver" --iters 5 > "$work/open.log" 2>&1 && { cat "$work/open.log"; fail "a world-writable directory was used"; }
grep -q "store: directory '$dir' is writable by other users (mode 0777) without the sticky bit.*chmod o-w" \
  "$work/open.log" || { cat "$work/open.log"; fail "the world-writable directory was not refused, saying what to do"; }
echo "a world-writable directory was refused"
echo "file store runs ok"
