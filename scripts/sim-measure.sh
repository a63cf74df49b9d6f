#!/usr/bin/env bash
# What the simulation is validated against: allreduce times per algorithm on the emulated cluster (its own, shaped
# to RATE), for the shapes hopwise-sim then simulates. Writes one hopwise-bench CSV per shape into OUT_DIR:
#   2x1.csv, 2x2.csv (2 hosts, 1 or 2 ranks each, --map-by node), 4x1.csv (4 hosts), and latency.csv (8-byte
#   allreduce of 2 ranks on 2 hosts: 2 messages a step, the per-message time the platform's latency stands for),
#   and compute.txt (this machine's reduction and copy rates, hopwise-sim's --compute, as the validation uses them).
#   scripts/sim-measure.sh [OUT_DIR] [RATE] [ITERS]      (defaults: tests/sim/emulated-1gbit, 1gbit, 5)
# Needs root (network namespaces) and build/bin/hopwise-bench; about 10 minutes on 2 cores.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
dest=$(realpath -m "${1:-tests/sim/emulated-1gbit}")
rate=${2:-1gbit}
iters=${3:-5}
export HOPWISE_CLUSTER_PREFIX=sm HOPWISE_CLUSTER_SUBNET=10.204.0
. scripts/cluster-env.sh
bench="build/bin/hopwise-bench"
need_built "$bench"
need_built build/bin/hopwise-sim
compute_rates() {
  build/bin/hopwise-sim --platform fat-tree:hosts=2,ranks-per-host=1,link=1Gbps -a ring -b 4 -e 4 |
    sed -n 's/^# element-wise work: reduce \([0-9.]*\) GB\/s, copy \([0-9.]*\) GB\/s.*/\1GBps,\2GBps/p' >"$1"
  [ -s "$1" ] || { echo "sim-measure.sh: hopwise-sim printed no element-wise rates" >&2; exit 1; }
}
mkdir -p "$dest"
algos=ring,hd,tree,one_shot
for shape in 2x1 2x2 4x1; do
  hosts=${shape%x*} per=${shape#*x}
  own_cluster "$hosts" "$rate"
  echo "sim-measure.sh: $shape at $rate"
  "$cluster" run -np $((hosts * per)) --map-by node "$bench" -b 1M -e 64M -f 4 -a "$algos" -n "$iters" -w 1 -c 1 \
    --csv "$dest/$shape.csv" >/dev/null
  if [ "$shape" = 2x1 ]; then
    "$cluster" run -np 2 --map-by node "$bench" -b 8 -e 8 -a ring -n 200 -w 20 --csv "$dest/latency.csv" >/dev/null
  fi
  "$cluster" down >/dev/null 2>&1 || true
  trap - EXIT
  rm -rf "$out"
done
# This machine's reduction and copy rates as hopwise-sim measures them: the validation charges these, not those of
# the machine it runs on.
compute_rates "$dest/compute.txt"
echo "sim-measure.sh: wrote $(ls "$dest" | tr '\n' ' ')in $dest ($(date -u +%F), $rate, $iters iterations)"
