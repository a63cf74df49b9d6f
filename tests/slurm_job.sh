#!/bin/bash
# Submits an sbatch script to the emulated cluster's Slurm (scripts/local-cluster.sh slurm), waits for the job and
# prints its output file; exits with the job's status (0 where it COMPLETED). Run from the repository.
#   slurm_job.sh SBATCH_FILE [SBATCH_OPTION...] [-- SCRIPT_ARG...]
# The job is watched through scontrol every half second rather than by sbatch --wait, whose polling backs off to
# tens of seconds.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
slurm=("$repo/scripts/local-cluster.sh" slurm run)
file=$1
shift
options=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
[ $# -eq 0 ] || shift
out=$(mktemp -d /tmp/hopwise-slurm.XXXXXX)
chmod 755 "$out"
job=$("${slurm[@]}" sbatch --parsable --output="$out/job.out" "${options[@]}" "$file" "$@")
job=${job%%;*}
trap '"${slurm[@]}" scancel "$job" 2>/dev/null || true; rm -rf "$out"' EXIT
echo "slurm_job.sh: job $job submitted"
state="" info=""
while :; do
  info=$("${slurm[@]}" scontrol show job "$job" 2>/dev/null || true)
  state=$(grep -o 'JobState=[A-Z_]*' <<<"$info" | cut -d= -f2 || true)
  case $state in
    PENDING | CONFIGURING | RUNNING | COMPLETING | "") sleep 0.5 ;;
    *) break ;;
  esac
done
cat "$out/job.out" 2>/dev/null || echo "slurm_job.sh: the job wrote no output"
code=$(grep -o ' ExitCode=[0-9:]*' <<<"$info" | cut -d= -f2 || true)
echo "slurm_job.sh: job $job ended $state, exit code $code"
[ "$state" = COMPLETED ]
