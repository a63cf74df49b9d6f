#!/usr/bin/env bash
# The whole ctest suite three ways, to find tests that depend on the machine's speed:
#   idle       as scripts/test.sh runs it
#   one-core   taskset -c 0: every rank, progress thread and launcher on one core
#   loaded     beside stress-ng --cpu 2 (two busy workers on this machine's cores)
# then a table of what failed where. Exit 0 only when every test passed in every condition.
#   scripts/test-stress.sh [--only idle,one-core,loaded] [ctest arguments, e.g. -R monitor]
# Logs: build/stress/<condition>.log. Builds first, as scripts/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
conditions=(idle one-core loaded)
if [ "${1:-}" = "--only" ]; then
  IFS=, read -r -a conditions <<<"$2"
  shift 2
fi
for c in "${conditions[@]}"; do
  case "$c" in idle | one-core | loaded) ;; *) echo "test-stress.sh: unknown condition '$c' (idle, one-core, loaded)" >&2; exit 2 ;; esac
done
scripts/setup.sh
. scripts/mpi-env.sh
scripts/build.sh >/dev/null
command -v stress-ng >/dev/null || { echo "test-stress.sh: stress-ng is missing (scripts/setup.sh installs it)" >&2; exit 2; }
out=build/stress
mkdir -p "$out"
stressor=
trap '[ -n "$stressor" ] && kill "$stressor" 2>/dev/null; true' EXIT

declare -A failed_in=()  # test name -> conditions it failed in
declare -A summary=()    # condition -> "passed/total, time"
for c in "${conditions[@]}"; do
  prefix=()
  case "$c" in
    one-core) prefix=(taskset -c 0) ;;
    loaded)
      stress-ng --cpu 2 --timeout 0 --quiet &
      stressor=$!
      ;;
  esac
  echo "== $c: ctest $*"
  t0=$(date +%s)
  rm -f build/Testing/Temporary/LastTestsFailed.log
  (cd build && "${prefix[@]}" ctest --timeout 600 --output-on-failure "$@" >"../$out/$c.log" 2>&1) || true
  t1=$(date +%s)
  if [ -n "$stressor" ]; then
    kill "$stressor" 2>/dev/null || true
    wait "$stressor" 2>/dev/null || true
    stressor=
  fi
  total=$(grep -oE 'tests passed, [0-9]+ tests failed out of [0-9]+' "$out/$c.log" | grep -oE '[0-9]+$' || echo "?")
  nfailed=0
  if [ -f build/Testing/Temporary/LastTestsFailed.log ]; then
    while IFS=: read -r _ name; do
      failed_in[$name]="${failed_in[$name]:-} $c"
      nfailed=$((nfailed + 1))
    done <build/Testing/Temporary/LastTestsFailed.log
  fi
  if [ "$total" = "?" ]; then
    summary[$c]="no test ran (see the log)"
    failed_in[no-test-ran]="${failed_in[no-test-ran]:-} $c"
  else
    summary[$c]="$((total - nfailed))/$total passed in $((t1 - t0)) s"
  fi
  echo "   ${summary[$c]} (log: $out/$c.log)"
done

echo
echo "| condition | result |"
echo "|---|---|"
for c in "${conditions[@]}"; do echo "| $c | ${summary[$c]} |"; done
if [ ${#failed_in[@]} -eq 0 ]; then
  echo
  echo "every test passed in every condition"
  exit 0
fi
echo
header="| test |"
rule="|---|"
for c in "${conditions[@]}"; do header+=" $c |"; rule+="---|"; done
echo "$header"
echo "$rule"
for name in $(printf '%s\n' "${!failed_in[@]}" | sort); do
  row="| $name |"
  for c in "${conditions[@]}"; do
    case " ${failed_in[$name]} " in *" $c "*) row+=" FAILED |" ;; *) row+=" ok |" ;; esac
  done
  echo "$row"
done
exit 1
