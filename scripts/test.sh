#!/usr/bin/env bash
# The README's test command: install what is needed, build, and run every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/mpi-env.sh
scripts/build.sh
cd build
# The in-process GoogleTest cases run HOPWISE_TEST_JOBS at a time (4: they wait on each other's threads as much as
# they compute; the 786 labelled unit took 85 s so on 2 cores, 159 s one at a time); every test that starts
# processes runs alone (RUN_SERIAL, tests/CMakeLists.txt).
ctest --output-on-failure --timeout 600 -j "${HOPWISE_TEST_JOBS:-4}" "$@"
