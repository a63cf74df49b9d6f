#!/usr/bin/env python3
"""Fewer synchronization points, measured: train_mnist under each --averaging method beside PyTorch DDP on gloo
(examples/torch_ddp/train.py), on the emulated cluster as it is (scripts/local-cluster.sh up/shape), runs
interleaved over rounds, medians quoted.

    scripts/local-cluster.sh up 2 --slots 1 && scripts/local-cluster.sh shape 1gbit
    scripts/bench-averaging.py [--ranks-per-host 1] [--epochs 5] [--target 0.85] [--rounds 1] [--json FILE]
                               [--method SPEC ...]

A row is an --averaging spec, optionally with a gradient codec after " / " ("sync / network:int8": synchronous
training with int8 between hosts only).

Per row: bytes a rank sends per step, step time, compute utilization (forward, backward and optimizer step over the
step), seconds and epochs until the test accuracy first reached the target (evaluated every 20 steps off the
clock; hopwise evaluates the ranks' mean model, leaving theirs alone), in how many runs it was reached, the accuracy
after the epochs, its distance from hopwise's synchronous run, and DDP's time to the target over the row's. The
medians of those seconds and epochs are over every run, one that never reached the target counting as +infinity
("not reached" where that median is); DDP's time over the row's is of these medians."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_rounds import each, interleaved, medians, reached, speedup
from cluster_torchrun import run_torchrun

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = str(ROOT / "scripts" / "local-cluster.sh")
DEFAULT = ["sync", "local:period=8", "hier:period=8", "gossip", "gossip:codec=int8", "async:period=8",
           "async:period=4,codec=int8"]
# --set diloco: the outer optimizer's rows beside the methods it grew from (docs/results/averaging.md#diloco)
DILOCO = ["sync", "local:period=8", "async:period=8,delay=1,codec=int8"] + [
    f"diloco:period={h}{c}" for h in (8, 32, 128) for c in ("", ",codec=int8", ",codec=int4", ",codec=topk")] + [
    "diloco:period=8,outer_lr=1,momentum=0,delay=1,codec=int8", "diloco:period=32,fragments=4,delay=1,codec=int8",
    "diloco:auto"]
SETS = {"default": DEFAULT, "diloco": DILOCO}


def ddp_gloo(args, out):
    """DDP on gloo, its whole curve traced (every 20 steps, off the clock) for the time to the target."""
    epochs = args.ddp_epochs or args.epochs
    d = run_torchrun(args.hosts, args.ranks_per_host,
                     [str(ROOT / "examples" / "torch_ddp" / "train.py"), "--backend", "gloo", "--epochs",
                      str(epochs), "--trace-accuracy", "--eval-every", "20", "--json", out], out)
    steps_per_epoch = d["steps"] / epochs  # train.py's own count (its batch, the training set)
    hit = next(((s, t) for s, t, a in d["accuracy_trace"] if a >= args.target), None)
    return {"bytes_per_step": d["gradient_bytes_per_step"], "step_ms": d["step_ms"],
            "utilization": d["utilization"], "seconds_to_target": hit[1] if hit else None,
            "epochs_to_target": hit[0] / steps_per_epoch if hit else None, "accuracy": d["test_accuracy"]}


def hopwise(args, method, out):
    n = args.hosts * args.ranks_per_host
    method, _, codec = (part.strip() for part in method.partition("/"))
    cmd = [CLUSTER, "run", "-np", str(n)] + (["--map-by", "node"] if args.ranks_per_host == 1 else []) + [
        str(ROOT / "build" / "bin" / "train_mnist"), "--epochs", str(args.epochs), "--averaging", method,
        "--target-accuracy", str(args.target), "--eval-every", "20", "--json", out] + (
        ["--compression", codec] if codec else [])
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
    if p.returncode != 0:
        sys.exit(f"bench-averaging.py: {method} failed:\n{p.stdout[-3000:]}")
    with open(out) as f:
        d = json.load(f)
    return {"bytes_per_step": d["bytes_per_step"], "step_ms": d["step_ms"], "utilization": d["compute_utilization"],
            "seconds_to_target": d["seconds_to_target"], "epochs_to_target": d["epochs_to_target"],
            "accuracy": d["test_accuracy"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--method", action="append", default=None)
    ap.add_argument("--set", choices=sorted(SETS), default="default", help="the rows when no --method is given")
    ap.add_argument("--no-ddp", action="store_true", help="skip the DDP on gloo baseline")
    ap.add_argument("--ddp-epochs", type=int, default=0,
                    help="DDP's epochs where they differ (on a slow link: enough to reach the target)")
    ap.add_argument("--json", default="")
    ap.add_argument("--partial", default="", help="JSON file rewritten with every run's figures as each run ends")
    args = ap.parse_args()
    methods = args.method or SETS[args.set]
    rows = (["ddp-gloo"] if not args.no_ddp else []) + methods

    def run_one(r, rnd):
        out = os.path.join(tmp, f"{rnd}-{abs(hash(r))}.json")
        return ddp_gloo(args, out) if r == "ddp-gloo" else hopwise(args, r, out)

    with tempfile.TemporaryDirectory() as tmp:
        runs = interleaved(rows, args.rounds, run_one, args.target, args.partial)
    med = medians(runs, ["bytes_per_step", "step_ms", "utilization", "seconds_to_target", "epochs_to_target",
                         "accuracy"], reach=("seconds_to_target", "epochs_to_target"))
    for r, m in med.items():
        m["reached"] = reached(runs[r], "seconds_to_target")
    sync, ddp = med.get("sync"), med.get("ddp-gloo")
    print(f"{args.hosts} emulated hosts x {args.ranks_per_host} rank(s), {args.epochs} epochs, target "
          f"{args.target:.0%}, median of {args.rounds} round(s)")
    print(f"| method | runs | MB/step | step ms | utilization | s to {args.target:.0%} (median) | reached | each run | "
          f"epochs to {args.target:.0%} | accuracy after {args.epochs} | vs sync | "
          f"DDP's time to {args.target:.0%} / this |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r, m in med.items():
        def f(v, fmt):
            return "not reached" if v is None else format(v, fmt)
        delta = "-" if not sync or r == "ddp-gloo" else f"{100 * (m['accuracy'] - sync['accuracy']):+.2f}"
        speed = "-" if r == "ddp-gloo" else speedup(ddp, m)
        name = "PyTorch DDP, gloo" if r == "ddp-gloo" else f"hopwise {r}"
        print(f"| {name} | {len(runs[r])} | {m['bytes_per_step'] / 1e6:.2f} | {m['step_ms']:.1f} | "
              f"{m['utilization']:.0%} | {f(m['seconds_to_target'], '.1f')} | {m['reached']} | "
              f"{each(runs[r], 'seconds_to_target')} | "
              f"{f(m['epochs_to_target'], '.2f')} | {100 * m['accuracy']:.2f}% | {delta} | {speed} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"medians": med, "runs": runs, "args": vars(args)}, fh, indent=1)


if __name__ == "__main__":
    main()
