#!/usr/bin/env bash
# Applies .clang-format to every C++ and CUDA source of the project; --check lists the files that differ from it
# and fails instead (Debian's clang-format).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null || { echo "format.sh: clang-format is missing (apt-get install clang-format)"; exit 2; }
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' '*.c' | grep -v '^tests/support/\|^tests/sanitizers/')
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    clang-format "$f" | cmp -s - "$f" || { echo "not formatted: $f"; bad=1; }
  done
  exit $bad
fi
clang-format -i "${files[@]}"
