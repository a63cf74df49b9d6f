#!/usr/bin/env bash
# The offline tuning round trip under mpirun, as a user runs it: hopwise-tune writes a tuning file for 2 ranks
# (HOPWISE_DEBUG=CHECK: every call's algorithm compared across the ranks before it runs), a job of the same shape
# reads it and runs no trial, and a job of another shape ignores it with a warning naming the mismatch.
#   tests/tune_roundtrip.sh MPIEXEC HOPWISE_TUNE HOPWISE_BENCH
set -euo pipefail
mpiexec=$1 tune=$2 bench=$3
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
run() { "$mpiexec" --allow-run-as-root --oversubscribe "$@"; }
# From 4 bytes, and int32 too: the bench's own one-int allreduce (its host count) is then in the file as well.
run -np 2 -x HOPWISE_DEBUG=CHECK "$tune" -b 4 -e 256K -d float32,int32 --rounds 2 -o "$dir/t.json"
python3 -c "import json,sys; f=json.load(open(sys.argv[1])); print('file entries', len(f['entries']), 'job', f['job'])" "$dir/t.json"
echo "--- same shape"
run -np 2 -x HOPWISE_TUNING_FILE="$dir/t.json" "$bench" -a auto,ring -b 4K -e 256K -n 3 -w 1
echo "--- another shape"
run -np 3 -x HOPWISE_TUNING_FILE="$dir/t.json" "$bench" -a auto,ring -b 4K -e 4K -n 3 -w 1
echo "--- a malformed file"
echo '{"format": "hopwise-tuning/1",' >"$dir/bad.json"
if run -np 2 -x HOPWISE_TUNING_FILE="$dir/bad.json" "$bench" -a auto -b 4K -e 4K -n 1 -w 0; then
  echo "a malformed tuning file was accepted"
  exit 1
fi
