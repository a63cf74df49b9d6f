#!/usr/bin/env bash
# hopwise's allreduce algorithms at 16 to 4096 ranks, simulated (hopwise-sim): two-level fat trees of 8-rank hosts,
# 16 hosts a leaf switch, links of 25 and 100 Gbit/s, leaf uplinks 1:1 and 4:1 oversubscribed, ranks packed. One
# hopwise-sim CSV per fabric and scale in OUT_DIR, a chart per fabric (scripts/plot.py --grid: a panel per scale),
# and summary.md: per fabric and scale, busbw of ring / hd / tree / hier at 16 KiB, 1 MiB and 64 MiB, the best
# algorithm per size, and the lowest auto/best of the cost model and of the tuned pick (the README's table).
#   scripts/sim-scale.sh [OUT_DIR] [RANKS...]     (defaults: build/sim-scale, 16 64 256 1024)
# A fabric takes 6-7 minutes of one core at 1024 ranks (the ring there: about a minute a call), 2 at 256, seconds
# below; the ring at 4096 ranks takes half an hour a call.
# Environment: LINKS ("25Gbps 100Gbps"), OVERSUBS ("1 4"), ALGOS (ring,hd,tree,hier), BEGIN (16K), END (64M),
# FACTOR (8), COMPUTE (hopwise-sim's --compute; default the rates kept in tests/sim/emulated-1gbit/compute.txt,
# measured on an idle machine, so that a busy one does not change the figures).
# Needs build/bin/hopwise-sim. Each run prints its wall time: what a simulated call costs at that scale.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/sim-scale}
shift || true
ranks_list=${*:-16 64 256 1024}
links=${LINKS:-25Gbps 100Gbps}
oversubs=${OVERSUBS:-1 4}
algos=${ALGOS:-ring,hd,tree,hier}
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
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
lines = ["| fabric | ranks | 16 KiB: ring / hd / tree / hier | 1 MiB | 64 MiB | best per size | auto/best, lowest: cost model / tuned |",
         "|---|---:|---|---|---|---|---:|"]
runs = sorted(out.glob("*-r*.csv"), key=lambda p: (not p.stem.startswith("25G"), p.stem.rsplit("-r", 1)[0],
                                                   int(p.stem.rsplit("-r", 1)[1])))
for p in runs:
    rows = {}
    for r in csv.DictReader(open(p)):
        rows.setdefault(int(r["size_bytes"]), {})[r["algo"]] = float(r["busbw_gbs"])
    def trio(b):
        return " / ".join(f"{rows[b][a]:.2f}" if a in rows.get(b, {}) else "-" for a in ("ring", "hd", "tree", "hier"))
    best, lowest, tuned = [], [], []
    for b, algos in sorted(rows.items()):
        peers = {a: v for a, v in algos.items() if a not in ("auto", "tuned")}
        top = max(peers, key=peers.get)
        best.append(f"{size(b)} {top}")
        if "auto" in algos:
            lowest.append(algos["auto"] / peers[top])
        if "tuned" in algos:
            tuned.append(algos["tuned"] / peers[top])
    link, over = p.stem.rsplit("-r", 1)[0].split("-o")
    auto = (f"{min(lowest):.2f}" if lowest else "-") + " / " + (f"{min(tuned):.2f}" if tuned else "-")
    lines.append(f"| {link.replace('Gbps', ' Gbit/s')}, {over}:1 | {p.stem.rsplit('-r', 1)[1]} | {trio(16 << 10)} | "
                 f"{trio(1 << 20)} | {trio(64 << 20)} | {', '.join(best)} | {auto} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
