#!/usr/bin/env bash
# The README's test command: install what is needed, build, and run every test through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/mpi-env.sh
scripts/build.sh
cd build
ctest --output-on-failure --timeout 600 "$@"
