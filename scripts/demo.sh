#!/usr/bin/env bash
# The README's main command: install what is needed, build, and run the main job: data-parallel training of an
# MLP on Fashion-MNIST under mpirun -np 4, then a short benchmark of the collectives against MPI's own, then what
# hopwise is for: a language model on two emulated hosts joined by a 100 Mbit/s link, DDP on gloo beside
# hopwise.torch.DiLoCo with diloco:auto (HOPWISE_DEMO_LM=0 leaves it out; it needs root for the emulated hosts).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/mpi-env.sh
scripts/build.sh
ranks=${HOPWISE_DEMO_RANKS:-4}
epochs=${HOPWISE_DEMO_EPOCHS:-5}
echo "== train_mnist: $ranks ranks, $epochs epochs, gradients all-reduced bucket by bucket during backward =="
mpirun -np "$ranks" build/bin/train_mnist --epochs "$epochs" --json build/demo-train.json --trace build/demo-trace.json \
  --monitor interval=10s --util-alert 0.5 --metrics-file build/demo-train.prom --metrics-json build/demo-monitor.jsonl
echo "summary: build/demo-train.json; timeline: build/demo-trace.json (ui.perfetto.dev); monitor: build/demo-monitor.jsonl,"
echo "Prometheus textfile: build/demo-train.prom"
echo
echo "== hopwise-bench: float32 allreduce, $ranks ranks, every algorithm beside MPI_Allreduce, results checked =="
mpirun -np "$ranks" build/bin/hopwise-bench -b 4K -e 16M -f 4 -a all -c 1 -n 10 -w 2 \
  --csv build/demo-allreduce.csv
echo "CSV written to build/demo-allreduce.csv"
echo
echo "== charts (scripts/plot.py): bus bandwidth per algorithm beside MPI's, utilization and exposed time per step, overlap =="
/usr/bin/python3 scripts/plot.py build/demo-allreduce.csv build/demo-monitor.jsonl build/demo-trace.json

if [ "${HOPWISE_DEMO_LM:-1}" = 0 ]; then
  exit 0
fi
echo
echo "== the point: a language model on 2 emulated hosts at 100 Mbit/s, DDP on gloo beside hopwise DiLoCo (diloco:auto) =="
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the emulated hosts are network namespaces, which need root (sudo scripts/demo.sh, or HOPWISE_DEMO_LM=0)"
  exit 0
fi
trap 'scripts/local-cluster.sh down >/dev/null 2>&1 || true' EXIT
scripts/local-cluster.sh down >/dev/null 2>&1 || true
scripts/local-cluster.sh up 2 --slots 1 >/dev/null
scripts/local-cluster.sh shape 100mbit >/dev/null
# A 2-layer GPT (0.9 M parameters) for 160 steps: a few minutes for both rows on 2 cores. The table gives each row's
# time to DDP's final loss (+1%); auto's choice and why are printed below it.
PATH="$(scripts/venv.sh --path)/bin:$PATH" scripts/bench-lm.py --link "100 Mbit/s" --steps 160 --rounds 1 \
  --row ddp --row diloco:diloco:auto --json build/demo-lm.json -- --layers 2 --width 192 --eval-every 10 --warmup 15
/usr/bin/python3 scripts/plot.py build/demo-lm.json
echo "chart: validation loss against training seconds, DDP beside DiLoCo: build/demo-lm.json.png"
