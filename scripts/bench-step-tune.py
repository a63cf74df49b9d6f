#!/usr/bin/env python3
"""What step tuning buys: train_mnist with the cost model's choices (HOPWISE_TUNE=0), with the tuner's choices by
calls (HOPWISE_STEP_TUNE=0) and with those choices confirmed by whole steps (the default), rounds interleaved,
medians quoted. The step figures are whole-run means: every trial the tuners run is paid inside them.

    scripts/bench-step-tune.py [--np 4] [--rounds 5] [--epochs 1] [--cluster] [-- TRAIN_MNIST_ARGS...]

--cluster runs on the emulated cluster as it is (scripts/local-cluster.sh up/shape) instead of mpirun here.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = [("cost model (HOPWISE_TUNE=0)", {"HOPWISE_TUNE": "0"}),
           ("tuned by calls (HOPWISE_STEP_TUNE=0)", {"HOPWISE_STEP_TUNE": "0"}),
           ("tuned by calls, confirmed by steps", {"HOPWISE_STEP_TUNE": "1"})]


def run(args, env, out):
    train = [str(ROOT / "build" / "bin" / "train_mnist"), "--epochs", str(args.epochs), "--json", out] + args.extra
    if args.cluster:
        cmd = [str(ROOT / "scripts" / "local-cluster.sh"), "run", "-np", str(args.np)]
        for k, v in env.items():
            cmd += ["-x", f"{k}={v}"]
        cmd += train
    else:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(args.np)]
        for k, v in env.items():
            cmd += ["-x", f"{k}={v}"]
        cmd += train
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"bench-step-tune.py: train_mnist failed:\n{p.stdout[-3000:]}")
    tuned = [line for line in p.stdout.splitlines() if line.startswith(("tuned (", "step-tuned"))]
    with open(out) as f:
        return json.load(f), tuned


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--cluster", action="store_true")
    ap.add_argument("extra", nargs="*", help="more train_mnist arguments (after --)")
    args = ap.parse_args()
    results = {name: [] for name, _ in CONFIGS}
    choices = {name: [] for name, _ in CONFIGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for i, (name, env) in enumerate(CONFIGS):
                d, tuned = run(args, env, os.path.join(tmp, f"{r}-{i}.json"))
                results[name].append(d)
                choices[name].append(tuned)
                print(f"round {r + 1}, {name}: step {d['step_ms']:.2f} ms, utilization "
                      f"{100 * d['compute_utilization']:.0f}%", file=sys.stderr, flush=True)
                for line in tuned:
                    print(f"    {line}", file=sys.stderr, flush=True)
    base = statistics.median(d["step_ms"] for d in results[CONFIGS[0][0]])
    where = "the emulated cluster" if args.cluster else "this machine"
    print(f"train_mnist {' '.join(args.extra) or ''} on {args.np} ranks, {where}, {args.epochs} epoch(s), "
          f"median of {args.rounds} interleaved rounds")
    print("| choices by | step ms | utilization | accuracy | cost model's step / this |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in CONFIGS:
        step = statistics.median(d["step_ms"] for d in results[name])
        util = statistics.median(d["compute_utilization"] for d in results[name])
        acc = statistics.median(d["test_accuracy"] for d in results[name])
        print(f"| {name} | {step:.2f} | {100 * util:.0f}% | {100 * acc:.2f}% | {base / step:.3f} |")


if __name__ == "__main__":
    main()
