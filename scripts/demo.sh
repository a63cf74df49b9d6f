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
mpirun -np "$ranks" build/bin/train_mnist --epochs "$epochs" --json build/demo-train.json --trace build/demo-trace.json
echo "summary: build/demo-train.json; timeline: build/demo-trace.json (ui.perfetto.dev)"
echo
echo "== hopwise-bench: float32 allreduce, $ranks ranks, every algorithm beside MPI_Allreduce, results checked =="
mpirun -np "$ranks" build/bin/hopwise-bench -b 4K -e 16M -f 4 -a ring,hd,tree,direct,shm,native,auto -c 1 -n 10 -w 2 \
  --csv build/demo-allreduce.csv
echo "CSV written to build/demo-allreduce.csv"
