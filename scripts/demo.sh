#!/usr/bin/env bash
# The README's main command: install what is needed, build, and run the main job under mpirun -np 4.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/mpi-env.sh
scripts/build.sh
ranks=${HOPWISE_DEMO_RANKS:-4}
echo "== hopwise-bench: float32 allreduce, $ranks ranks, every algorithm beside MPI_Allreduce, results checked =="
mpirun -np "$ranks" build/bin/hopwise-bench -b 4K -e 64M -f 4 -a ring,hd,tree,direct,shm,native,auto -c 1 -n 10 -w 2 \
  --overlap --csv build/demo-allreduce.csv
echo "CSV written to build/demo-allreduce.csv"
