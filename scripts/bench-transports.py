#!/usr/bin/env python3
"""hopwise over UCX beside hopwise over MPI, MPI_Allreduce and Gloo, on this host.

Runs hopwise-bench in rounds, the configurations interleaved so that all see the same machine: under mpirun with
HOPWISE_TRANSPORT=mpi and =ucx (each run times MPI_Allreduce on the same buffers), and under torchrun (no MPI:
UCX beside Gloo's allreduce). Prints, per rank count and size, the medians over rounds and the ratios.

  scripts/bench-transports.py [--ranks 2,4] [--rounds 3] [--min 4K] [--max 64M] [--algos auto,ring] [--csv FILE]
"""
import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "build", "bin", "hopwise-bench")


def run(cmd, env, csv_path):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        sys.exit(f"bench-transports: {' '.join(cmd)} failed:\n{r.stdout[-3000:]}")
    with open(csv_path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--algos", default="auto,ring")
    ap.add_argument("--csv", help="write the table as CSV too")
    a = ap.parse_args()
    if not os.access(BENCH, os.X_OK):
        sys.exit(f"bench-transports: {BENCH} is missing; build first (scripts/build.sh)")
    algos = a.algos.split(",")
    # samples[(np, config, algo, size)] = [time_us per round]
    samples = {}
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    tmp = tempfile.mkdtemp(prefix="hopwise-bench-transports-")
    common = ["-b", a.min, "-e", a.max, "-f", "4", "-a", a.algos, "-n", "20", "-w", "5"]
    for rnd in range(a.rounds):
        for np in [int(x) for x in a.ranks.split(",")]:
            for config in ["mpi", "ucx", "torchrun"]:
                out = os.path.join(tmp, f"{config}-{np}-{rnd}.csv")
                if config == "torchrun":
                    cmd = ["torchrun", "--standalone", "--nproc_per_node", str(np), "--redirects", "1", "--tee",
                           "1", "--no_python", BENCH] + common + ["--csv", out]
                else:
                    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-x", f"HOPWISE_TRANSPORT={config}",
                           "-np", str(np), BENCH] + common + ["--csv", out]
                print(f"# round {rnd + 1}/{a.rounds}: {np} ranks, {config}", file=sys.stderr, flush=True)
                for row in run(cmd, env, out):
                    samples.setdefault((np, config, row["algo"], int(row["size_bytes"])), []).append(
                        float(row["time_us"]))
    med = {k: statistics.median(v) for k, v in samples.items()}
    sizes = sorted({k[3] for k in med})
    header = ["ranks", "size"]
    for al in algos:
        header += [f"{al}@mpi_us", f"{al}@ucx_us", f"{al}:ucx/mpi"]
    header += ["MPI_Allreduce_us", "auto@ucx/MPI_Allreduce", "auto@ucx(torchrun)_us", "gloo_us",
               "auto@ucx/gloo"]
    rows = []
    for np in [int(x) for x in a.ranks.split(",")]:
        for s in sizes:
            g = lambda c, al: med.get((np, c, al, s))
            row = [np, s]
            for al in algos:
                m, u = g("mpi", al), g("ucx", al)
                row += [m, u, m / u if m and u else None]
            mpi_ref = statistics.median([x for x in (g("mpi", "mpi"), g("ucx", "mpi")) if x])
            u, t, gl = g("ucx", "auto"), g("torchrun", "auto"), g("torchrun", "gloo")
            row += [mpi_ref, mpi_ref / u if u else None, t, gl, gl / t if gl and t else None]
            rows.append(row)
    fmt = lambda x: "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))
    print(f"# medians of {a.rounds} interleaved rounds; X:ucx/mpi = time over MPI / time over UCX (>1: UCX faster)")
    widths = [max(len(h), 10) for h in header]
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("  ".join(fmt(x).rjust(w) for x, w in zip(r, widths)))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows([[fmt(x) for x in r] for r in rows])


if __name__ == "__main__":
    main()
