#!/usr/bin/env bash
# hopwise's allreduce algorithms at 16 to 4096 ranks, simulated (hopwise-sim): two-level fat trees of 8-rank hosts,
# 16 hosts a leaf switch, links of 25 and 100 Gbit/s, leaf uplinks 1:1 and 4:1 oversubscribed, ranks packed. One
# hopwise-sim CSV per fabric and scale in OUT_DIR, a chart per fabric (scripts/plot.py --grid: a panel per scale),
# and the best algorithm per size (summary.md).
#   scripts/sim-scale.sh [OUT_DIR] [RANKS...]     (defaults: build/sim-scale, 16 64 256 1024 4096)
# Environment: LINKS ("25Gbps 100Gbps"), OVERSUBS ("1 4"), ALGOS (ring,hd,tree), BEGIN (16K), END (64M), FACTOR (8),
# COMPUTE (hopwise-sim's --compute; default the rates kept in tests/sim/emulated-1gbit/compute.txt, measured on an
# idle machine, so that a busy one does not change the figures).
# Needs build/bin/hopwise-sim. Each run prints its wall time: what a simulated call costs at that scale.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/sim-scale}
shift || true
ranks_list=${*:-16 64 256 1024 4096}
links=${LINKS:-25Gbps 100Gbps}
oversubs=${OVERSUBS:-1 4}
algos=${ALGOS:-ring,hd,tree}
begin=${BEGIN:-16K}
end=${END:-64M}
factor=${FACTOR:-8}
compute=${COMPUTE:-$(cat tests/sim/emulated-1gbit/compute.txt)}
sim=build/bin/hopwise-sim
[ -x "$sim" ] || { echo "sim-scale.sh: $sim is not built (cmake --build build --target hopwise-sim)" >&2; exit 1; }
mkdir -p "$out"
per_host=8
for link in $links; do
  for o in $oversubs; do
    csvs=()
    for n in $ranks_list; do
      hosts=$((n / per_host))
      leaf=$((hosts < 16 ? hosts : 16))
      over=$o
      [ $((hosts / leaf)) -gt 1 ] || over=1  # one leaf switch: no uplinks to oversubscribe
      [ $((leaf % over)) -eq 0 ] || over=1
      name="$link-o$o-r$n"
      start=$(date +%s%N)
      "$sim" --platform "fat-tree:hosts=$hosts,ranks-per-host=$per_host,link=$link,oversub=$over,leaf=$leaf" \
        -a "$algos" -b "$begin" -e "$end" -f "$factor" --compute "$compute" --csv "$out/$name.csv" >"$out/$name.txt"
      echo "sim-scale.sh: $name ($hosts hosts, leaf $leaf, ${over}:1) in $((($(date +%s%N) - start) / 1000000)) ms"
      csvs+=("$out/$name.csv")
    done
    /usr/bin/python3 scripts/plot.py --grid "$out/$link-o$o.png" --title "allreduce bus bandwidth, $link links, leaf uplinks $o:1 (simulated)" "${csvs[@]}" >/dev/null
  done
done
/usr/bin/python3 - "$out" <<'EOF'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["| fabric | ranks | best algorithm per size (busbw GB/s) |", "|---|---:|---|"]
for p in sorted(out.glob("*-r*.csv"), key=lambda p: (p.stem.rsplit("-r", 1)[0], int(p.stem.rsplit("-r", 1)[1]))):
    best = {}
    for r in csv.DictReader(open(p)):
        b, bw = int(r["size_bytes"]), float(r["busbw_gbs"])
        if b not in best or bw > best[b][1]:
            best[b] = (r["algo"], bw)
    fabric, ranks = p.stem.rsplit("-r", 1)
    cells = ", ".join(f"{b >> 10}K {a} {bw:.2f}" if b < 1 << 20 else f"{b >> 20}M {a} {bw:.2f}" for b, (a, bw) in sorted(best.items()))
    lines.append(f"| {fabric} | {ranks} | {cells} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
