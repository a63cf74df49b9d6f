#!/usr/bin/env bash
# Configures and builds into build/ (executables in build/bin/). Extra arguments go to cmake's configure step.
# HOPWISE_WERROR=ON makes a warning in hopwise's own code an error (CI sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DHOPWISE_WERROR="${HOPWISE_WERROR:-OFF}" "$@" >/dev/null
cmake --build build -j"$(nproc)"
