#!/usr/bin/env bash
# What the default call check costs (HOPWISE_CALL_CHECK=1, each collective's stamp in or beside its first message to
# each peer, or in the shared slots' header) beside no check (=0): hopwise-bench's allreduce at small sizes, where a
# per-call cost would show, through the shared slots (one_shot) and through messages (ring, hd; up to 4 KiB the stamp
# rides in the first message, above it travels alone), 2 ranks under mpirun. The two
# settings alternate run by run (REPS each); each row's figure is the median over the runs of hopwise-bench's own
# median of ITERS calls, beside MPI's own MPI_Allreduce timed interleaved in the same runs. Prints a Markdown
# table. Not in CI: a benchmark, about 2 minutes.
#   scripts/bench-call-check.sh [REPS=7] [ITERS=300]
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-7}
iters=${2:-300}
. scripts/mpi-env.sh
bench=build/bin/hopwise-bench
[ -x "$bench" ] || { echo "bench-call-check: build first (scripts/build.sh)"; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for rep in $(seq "$reps"); do
  for check in 1 0; do
    mpirun --allow-run-as-root --oversubscribe -np 2 -x HOPWISE_CALL_CHECK=$check -x HOPWISE_TUNE=0 \
      "$bench" -b 4K -e 256K -f 4 -a one_shot,ring,hd -n "$iters" -w 20 --csv "$out/c$check-$rep.csv" >/dev/null
  done
done
python3 - "$out" <<'PY'
import csv, glob, statistics, sys
rows, mpi = {}, {}
for path in glob.glob(sys.argv[1] + "/c*.csv"):
    check = path.rsplit("/", 1)[1][1]
    for r in csv.DictReader(open(path)):
        size = int(r["size_bytes"])
        if r["algo"] == "mpi":  # the peer, timed interleaved with our rows in the same run
            mpi.setdefault(size, []).append(float(r["time_us"]))
        elif r["algo"] != "gloo":
            rows.setdefault((size, r["algo"]), {}).setdefault(check, []).append(float(r["time_us"]))
print("| size | algorithm | no check (us) | default check (us) | check / none | MPI_Allreduce (us) | MPI / check |")
print("|---:|---|---:|---:|---:|---:|---:|")
for (size, algo), v in sorted(rows.items()):
    off, on, peer = statistics.median(v["0"]), statistics.median(v["1"]), statistics.median(mpi[size])
    print(f"| {size // 1024} KiB | {algo} | {off:.2f} | {on:.2f} | {on / off:.3f} | {peer:.2f} | {peer / on:.2f} |")
PY
