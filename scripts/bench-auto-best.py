#!/usr/bin/env python3
"""auto against the best algorithm of the same run: hopwise-bench -a all at np 2 and 4, plain and --burst 4, the
shapes run round after round (interleaved, so that a busy spell of the machine hurts every shape alike); per size
the median auto/best of the rounds, its range, and what auto chose where it fell below the goal.

    scripts/bench-auto-best.py [--rounds 3] [--nps 2,4] [--bursts 1,4] [-b 4K] [-e 64M] [-n 20] [--goal 0.95]
"""
import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(np_, burst, args):
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), str(ROOT / "build" / "bin" /
           "hopwise-bench"), "-a", "all", "-b", args.b, "-e", args.e, "-n", str(args.n)]
    if burst > 1:
        cmd += ["--burst", str(burst)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"bench-auto-best.py: {' '.join(cmd)} failed:\n{p.stdout[-3000:]}")
    rows, inside = {}, False
    for line in p.stdout.splitlines():
        if line.startswith("# auto against"):
            inside = True
            continue
        if inside and line.startswith("#"):
            break
        f = line.split()
        if inside and len(f) == 4 and f[0].isdigit():
            rows[int(f[0])] = (f[1], f[2], float(f[3]))
    if not rows:
        sys.exit(f"bench-auto-best.py: no auto/best summary in the output of {' '.join(cmd)}:\n{p.stdout[-2000:]}")
    return rows


def size_text(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1024 else f"{b} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--nps", default="2,4")
    ap.add_argument("--bursts", default="1,4")
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-n", type=int, default=20, help="hopwise-bench's iterations per size")
    ap.add_argument("--goal", type=float, default=0.95)
    args = ap.parse_args()
    shapes = [(int(n), int(b)) for n in args.nps.split(",") for b in args.bursts.split(",")]
    results = {s: [] for s in shapes}
    for r in range(args.rounds):
        for s in shapes:
            rows = run(s[0], s[1], args)
            results[s].append(rows)
            low = min(rows.values(), key=lambda x: x[2])
            print(f"round {r + 1}, np {s[0]}{', burst ' + str(s[1]) if s[1] > 1 else ''}: lowest {low[2]:.3f} "
                  f"(auto {low[0]}, best {low[1]})", file=sys.stderr, flush=True)
    names = [f"np {n}" + (f", `--burst {b}`" if b > 1 else "") for n, b in shapes]
    print(f"median auto/best of {args.rounds} rounds of hopwise-bench -a all -n {args.n} (range in brackets)")
    print("| size | " + " | ".join(names) + " |")
    print("|---:|" + "---:|" * len(shapes))
    sizes = sorted(set().union(*(rows.keys() for s in shapes for rows in results[s])))
    met = total = 0
    misses = []
    for b in sizes:
        cells = []
        for s in shapes:
            v = [rows[b][2] for rows in results[s] if b in rows]
            m = statistics.median(v)
            total += 1
            met += m >= args.goal
            cells.append(f"{m:.3f} ({min(v):.2f}-{max(v):.2f})")
            misses += [(s, b, rows[b]) for rows in results[s] if b in rows and rows[b][2] < args.goal]
        print(f"| {size_text(b)} | " + " | ".join(cells) + " |")
    print(f"{met} of {total} medians reach {args.goal}; single runs below it: {len(misses)} of "
          f"{sum(len(rows) for s in shapes for rows in results[s])}")
    for (n, burst), b, (chose, best, ratio) in misses:
        print(f"  np {n}{', burst ' + str(burst) if burst > 1 else ''}, {size_text(b)}: {ratio:.3f}, auto chose "
              f"{chose}, best {best}")


if __name__ == "__main__":
    main()
