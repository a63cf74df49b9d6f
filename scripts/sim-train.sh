#!/usr/bin/env bash
# Projected compute utilization of a training step at scale (hopwise-sim --train), per averaging method, on
# two-level fat trees of 8-rank hosts (16 hosts a leaf switch, ranks packed, as torchrun and mpirun place them):
#   mnist       train_mnist's MLP on CPUs: its compute a step measured here (train_mnist, one rank, batch 128), the
#               reductions and codecs at this machine's rates (kept in tests/sim/emulated-1gbit/compute.txt);
#               25 Gbit/s links, leaf uplinks 4:1.
#   gpt2-small  124 M parameters on GPUs: 15.3 ms a step (6 x 124.4 M x 8192 tokens at 400 TFLOP/s, 40% of an
#               H200's dense bf16), reductions and copies at the H200's measured 1195 and 2044 GB/s, every codec
#               pass at 330 GB/s (PowerSGD's measured step there; int8 encodes at 846); 100 Gbit/s links, 1:1.
# One hopwise-sim CSV and log per model and scale in OUT_DIR, and summary.md (the README's table).
#   scripts/sim-train.sh [OUT_DIR]     (default build/sim-train)
# Environment: MNIST_RANKS ("64 256 1024"), GPT2_RANKS ("64 256"; empty: none), METHODS (hopwise-sim's default
# set), MNIST_MS (train_mnist's compute a step; default measured now: 20.7-43.6 ms here as the machine's load
# varied, so give it to compare runs).
# Wall time (one core): under 2 minutes at 64 ranks, about 10 at 256 (gpt2-small), 10 for mnist at 1024 (the
# ring's 2 x 1023 x 1024 messages a bucket), gpt2-small at 1024 well over an hour.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-build/sim-train}
sim=build/bin/hopwise-sim
[ -x "$sim" ] || { echo "sim-train.sh: $sim is not built (cmake --build build --target hopwise-sim)" >&2; exit 1; }
[ -x build/bin/train_mnist ] || { echo "sim-train.sh: build/bin/train_mnist is not built" >&2; exit 1; }
mkdir -p "$out"
methods=()
for m in ${METHODS:-}; do methods+=(--method "$m"); done

# train_mnist's compute a step at one rank (its mean over an epoch's steps, as its summary reports it).
mnist_ms=${MNIST_MS:-}
if [ -z "$mnist_ms" ]; then
  build/bin/train_mnist --epochs 1 --batch 128 --limit 25600 --json "$out/mnist-1rank.json" >/dev/null
  mnist_ms=$(/usr/bin/python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['compute_ms'], 2))" \
    "$out/mnist-1rank.json")
  echo "sim-train.sh: train_mnist computes $mnist_ms ms a step at batch 128"
fi

run() {  # model ranks link oversub step_ms compute [extra...]
  local model=$1 n=$2 link=$3 over=$4 step=$5 compute=$6
  shift 6
  local hosts=$((n / 8)) leaf
  leaf=$((hosts < 16 ? hosts : 16))
  [ $((hosts / leaf)) -gt 1 ] || over=1
  local name="$model-$link-o$over-r$n" start
  start=$(date +%s)
  "$sim" --platform "fat-tree:hosts=$hosts,ranks-per-host=8,link=$link,oversub=$over,leaf=$leaf" --train "$model" \
    --step-ms "$step" --compute "$compute" --csv "$out/$name.csv" "$@" "${methods[@]}" >"$out/$name.txt"
  echo "sim-train.sh: $name in $(($(date +%s) - start)) s"
}
for n in ${MNIST_RANKS-64 256 1024}; do
  run mnist "$n" 25Gbps 4 "$mnist_ms" "$(cat tests/sim/emulated-1gbit/compute.txt)"
done
for n in ${GPT2_RANKS-64 256}; do
  run gpt2-small "$n" 100Gbps 1 15.3 1195GBps,2044GBps --codec-rate 330GBps
done

/usr/bin/python3 - "$out" <<'EOF'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["| model | fabric | ranks | compute ms | method | step ms | utilization | vs ddp | wire MB/step |",
         "|---|---|---:|---:|---|---:|---:|---:|---:|"]
def order(p):
    model, rest = p.stem.split("-", 1) if not p.stem.startswith("gpt2") else ("gpt2-small", p.stem[11:])
    return (model, int(rest.rsplit("-r", 1)[1]))
for p in sorted(out.glob("*-r*.csv"), key=order):
    rows = list(csv.DictReader(open(p)))
    ddp = next((float(r["step_ms"]) for r in rows if r["method"] == "ddp"), None)
    fabric = p.stem.rsplit("-r", 1)[0].split("-")[-2:]
    for r in rows:
        step = float(r["step_ms"])
        lines.append(f"| {r['model']} | {fabric[0]} {fabric[1].lstrip('o')}:1 | {r['ranks']} | {float(r['compute_ms']):.1f} | "
                     f"{r['method']} | {step:.1f} | {100 * float(r['utilization']):.0f}% | "
                     f"{ddp / step:.2f}x | {float(r['wire_mb']):.2f} |" if ddp else "")
(out / "summary.md").write_text("\n".join(l for l in lines if l) + "\n")
print((out / "summary.md").read_text())
EOF
