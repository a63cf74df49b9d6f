#!/bin/bash
# Submits an sbatch script to the emulated cluster's Slurm (scripts/local-cluster.sh slurm), waits for the job and
# prints its output file; exits with the job's status. Run from the repository.
#   slurm_job.sh SBATCH_FILE [SBATCH_OPTION...] [-- SCRIPT_ARG...]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
file=$1
shift
options=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
[ $# -eq 0 ] || shift
out=$(mktemp -d /tmp/hopwise-slurm.XXXXXX)
trap 'rm -rf "$out"' EXIT
chmod 755 "$out"
rc=0
"$repo/scripts/local-cluster.sh" slurm run sbatch --wait --output="$out/job.out" "${options[@]}" "$file" "$@" || rc=$?
cat "$out/job.out" 2>/dev/null || echo "slurm_job.sh: the job wrote no output ($out/job.out)"
echo "slurm_job.sh: sbatch --wait exited with $rc"
exit "$rc"
