#!/usr/bin/env bash
# The Python environment scripts/setup.sh makes for hopwise.torch (torch 2.x from PyPI).
#   scripts/venv.sh --path           where it is ($HOPWISE_VENV, default ~/.cache/hopwise/venv)
#   scripts/venv.sh python ARGS...   runs its python (torchrun, pip, pytest likewise) with ARGS
set -euo pipefail
venv=${HOPWISE_VENV:-${HOME:-/root}/.cache/hopwise/venv}
case "${1:-}" in
  --path) echo "$venv" ;;
  "") echo "usage: scripts/venv.sh --path | PROGRAM ARGS... (python, torchrun, pip, pytest)" >&2; exit 2 ;;
  *)
    program=$1
    shift
    [ -x "$venv/bin/$program" ] || { echo "venv.sh: $venv/bin/$program is missing; run scripts/setup.sh" >&2; exit 1; }
    exec "$venv/bin/$program" "$@"
    ;;
esac
