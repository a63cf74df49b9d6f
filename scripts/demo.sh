#!/usr/bin/env bash
# The README's main command: install what is needed, build, and run the main job: data-parallel training of an
# MLP on Fashion-MNIST under mpirun -np 4, then a short benchmark of the collectives against MPI's own.
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
