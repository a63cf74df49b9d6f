#!/usr/bin/env bash
# Shaped-link benchmarks on the emulated cluster (scripts/local-cluster.sh), each comparison measured in one run
# of hopwise-bench so that the ratio is between rows timed side by side:
#   1. planned ring vs rank-order ring, 2 hosts x 2 ranks placed --map-by node (discovery on vs off)
#   2. hierarchical vs flat (planned) ring, 2 hosts x 2 ranks
#   3. compression on 64 MiB, 2 hosts x 1 rank: none, fp16, int8, PowerSGD rank 4 (a 4096 x 4096 matrix)
# Usage: scripts/cluster-bench.sh [RATE] [ITERS]   (default 1gbit, 5). Needs root; builds nothing (run
# scripts/build.sh first). Brings up its own cluster "cb" and removes it at the end.
set -Eeuo pipefail

rate=${1:-1gbit}
iters=${2:-5}
export HOPWISE_CLUSTER_PREFIX=cb HOPWISE_CLUSTER_SUBNET=10.203.0
# shellcheck source=scripts/cluster-env.sh
. "$(dirname "$0")/cluster-env.sh"
bench="build/bin/hopwise-bench"
need_built "$bench"
own_cluster 2 "$rate"

# time_us of each row of a CSV, keyed by algo (column 5) and size (column 1).
rows() { awk -F, 'NR > 1 { gsub(/"/, "", $5); print $1, $5, $7 }' "$1"; }

echo "== 1. planned vs rank-order ring: 2 hosts x 2 ranks, --map-by node, links at $rate"
for discovery in 1 0; do
  "$cluster" run -np 4 --map-by node -x HOPWISE_TOPO_DISCOVERY=$discovery \
    "$bench" -b 1M -e 64M -f 8 -a ring -n "$iters" -w 1 -c 1 --csv "$out/ring$discovery.csv" >/dev/null
done
join <(rows "$out/ring1.csv" | awk '$2 == "ring" { print $1, $3 }' | sort) \
     <(rows "$out/ring0.csv" | awk '$2 == "ring" { print $1, $3 }' | sort) |
  sort -n | awk 'BEGIN { printf "%12s %14s %16s %8s\n", "bytes", "planned_us", "rank_order_us", "ratio" }
                { printf "%12d %14.0f %16.0f %8.2f\n", $1, $2, $3, $3 / $2 }'

echo "== 2. hierarchical vs flat ring: 2 hosts x 2 ranks, --map-by node, links at $rate"
"$cluster" run -np 4 --map-by node "$bench" -b 1M -e 64M -f 8 -a ring,hier -n "$iters" -w 1 -c 1 \
  --csv "$out/hier.csv" >/dev/null
for a in ring hier mpi; do rows "$out/hier.csv" | awk -v a=$a '$2 == a { print $1, $3 }' | sort > "$out/$a.t"; done
join "$out/ring.t" "$out/hier.t" | join - "$out/mpi.t" | sort -n |
  awk 'BEGIN { printf "%12s %10s %10s %10s %10s\n", "bytes", "ring_us", "hier_us", "mpi_us", "ring/hier" }
       { printf "%12d %10.0f %10.0f %10.0f %10.2f\n", $1, $2, $3, $4, $2 / $3 }'

echo "== 3. compression, 64 MiB: 2 hosts x 1 rank, links at $rate"
"$cluster" run -np 2 --map-by node "$bench" -b 64M -e 64M -a ring -C none -C fp16 -C int8 -C powersgd:rank=4 \
  -n "$iters" -w 1 -c 1 --csv "$out/codecs.csv" >/dev/null
# Compressed rows quote their codec (specs hold commas): the time is the 7th field before the quote.
awk '/"/ { split($0, q, "\""); split(q[1], f, ","); t[q[2]] = f[7]; order[++n] = q[2] }
  END { printf "%-34s %12s %10s\n", "codec", "time_us", "speedup"
        for (i = 1; i <= n; ++i) printf "%-34s %12.0f %10.2f\n", order[i], t[order[i]], t["none"] / t[order[i]] }' \
  "$out/codecs.csv"
