#!/usr/bin/env python3
"""How close an uncompressed synchronous step comes to what the link allows: train_mnist on the emulated cluster as it
is (scripts/local-cluster.sh up/shape), one rank per host, against the bound

    first bucket's launch (forward + backward until the first gradients are ready) + wire time + optimizer step,

the wire time being the bytes a rank sends per step at the shaped rate (payload only: TCP/IP and Ethernet headers,
about 4% at a 1500-byte MTU, are on the measured side). Nothing can beat the bound: the link cannot carry a step's
gradients before they exist, and the optimizer cannot run before the last of them arrived. Rounds interleave with
the other runs of the machine; medians quoted.

    scripts/local-cluster.sh up 2 --slots 1 && scripts/local-cluster.sh shape 1gbit
    scripts/bench-wire-step.py --rate 1gbit [--hosts 2] [--rounds 3] [--limit 25600] [-- TRAIN_MNIST_ARGS...]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = str(ROOT / "scripts" / "local-cluster.sh")


def bits_per_s(rate):
    m = re.fullmatch(r"([0-9.]+)(bit|kbit|mbit|gbit)?", rate.lower())
    if not m:
        sys.exit(f"bench-wire-step.py: --rate '{rate}' not understood; write e.g. 1gbit or 100mbit")
    return float(m.group(1)) * {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[m.group(2) or "bit"]


def run(args, extra, out):
    cmd = [CLUSTER, "run", "-np", str(args.hosts), "--map-by", "node", str(ROOT / "build" / "bin" / "train_mnist"),
           "--epochs", "1", "--limit", str(args.limit), "--json", out] + extra
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"bench-wire-step.py: train_mnist failed:\n{p.stdout[-3000:]}")
    with open(out) as f:
        return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", required=True, help="the link's shaped rate, as given to local-cluster.sh shape")
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--limit", type=int, default=25600, help="training images (steps = limit / 128)")
    ap.add_argument("extra", nargs="*", help="more train_mnist arguments (after --)")
    args = ap.parse_args()
    rate = bits_per_s(args.rate)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            d = run(args, args.extra, os.path.join(tmp, f"{r}.json"))
            wire = 1e3 * d["bytes_per_step"] * 8 / rate
            bound = d["first_bucket_ms"] + wire + d["optimizer_ms"]
            rows.append({"step": d["step_ms"], "first": d["first_bucket_ms"], "wire": wire, "opt": d["optimizer_ms"],
                         "compute": d["compute_ms"], "bound": bound, "ratio": d["step_ms"] / bound})
            print(f"round {r + 1}: step {d['step_ms']:.1f} ms, bound {bound:.1f} ms ({d['step_ms'] / bound:.3f}x)",
                  file=sys.stderr, flush=True)
    med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
    print(f"{args.hosts} emulated hosts x 1 rank at {args.rate}, train_mnist {' '.join(args.extra) or 'uncompressed'}, "
          f"median of {args.rounds} run(s)")
    print("| step ms | first bucket ms | wire ms | optimizer ms | bound ms | step / bound | compute ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {med['step']:.1f} | {med['first']:.1f} | {med['wire']:.1f} | {med['opt']:.1f} | {med['bound']:.1f} | "
          f"{med['ratio']:.3f} | {med['compute']:.1f} |")


if __name__ == "__main__":
    main()
