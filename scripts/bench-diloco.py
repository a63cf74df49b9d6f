#!/usr/bin/env python3
"""DiLoCo through PyTorch, measured: examples/torch_ddp/train.py --diloco SPEC (hopwise's outer path) beside the same
recipe in plain PyTorch over gloo (scripts/diloco_recipe.py, no hopwise) and DDP on gloo, on the emulated cluster as
it is (scripts/local-cluster.sh up/shape), runs interleaved over rounds, medians quoted.

    scripts/local-cluster.sh up 2 --slots 1 && scripts/local-cluster.sh shape 1gbit
    scripts/bench-diloco.py [--hosts 2] [--ranks-per-host 1] [--epochs 5] [--ddp-epochs E] [--target 0.85] [--rounds 3]
                            [--row ddp | hopwise:SPEC | recipe:H[:CODEC[:OUTER_LR:MOMENTUM]] | torchft:H ...]
                            [--torchft-python PYTHON] [--json FILE] [--partial FILE]

ddp is DDP on gloo; hopwise:SPEC is train.py --diloco SPEC; recipe:H is the plain-PyTorch recipe, its CODEC none or
int8, its outer lr and Nesterov momentum (0.7 and 0.9 unless named) only after a CODEC (recipe:8:none:1:0).
torchft:H runs torchft's DiLoCo (scripts/diloco_torchft.py) with the interpreter of an environment that has this
torch and torchft (pip install torchft; not part of hopwise's setup), given by --torchft-python.

Every run traces its test accuracy every 20 steps off the clock (the ranks' mean model for hopwise, the synced one
for the recipe), so "s to 85%" is training seconds until the trace first reached the target and "accuracy" is the
final model's after the epochs. The median of "s to 85%" is over every run, one that never reached the target counting
as +infinity ("not reached" where that median is); "reached" says in how many runs it did, and DDP's time over the
row's is of these medians. Utilization is one figure for every row: the step's forward, backward and optimizer
step alone (train.py measures it apart before training; the median over the rounds' hopwise and DDP runs, the same
model and batch for all) over the row's measured step time. MB/step (wire): what the host's link sent per step per
rank, evaluations left out (link_bytes_per_step, which train.py, the recipe and the torchft peer all read from the
network namespace's counters), else (a run on one host) what a rank hands its syncs (DDP: its gradients).
Every row is scored on the ranks' mean model."""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_rounds import auto_lines, auto_said, each, interleaved, medians, megabytes, reached, speedup
from cluster_torchrun import run_torchrun

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["ddp", "hopwise:diloco:period=8", "recipe:8", "hopwise:diloco:period=32", "recipe:32",
           "hopwise:diloco:period=32,codec=int8", "recipe:32:int8", "hopwise:diloco:period=32,codec=int4",
           "hopwise:diloco:period=8,outer_lr=1,momentum=0,delay=1,codec=int8", "recipe:8:none:1:0",
           "hopwise:diloco:period=32,fragments=4,delay=1,codec=int8", "hopwise:diloco:auto"]


def command(row, args, out):
    epochs = args.ddp_epochs if row == "ddp" and args.ddp_epochs else args.epochs
    common = ["--epochs", str(epochs), "--trace-accuracy", "--eval-every", "20", "--json", out]
    if row == "ddp":
        return [str(ROOT / "examples" / "torch_ddp" / "train.py"), "--backend", "gloo"] + common
    kind, _, spec = row.partition(":")
    if kind == "hopwise":
        return [str(ROOT / "examples" / "torch_ddp" / "train.py"), "--backend", "hopwise", "--diloco", spec] + common
    parts = spec.split(":")
    if kind == "torchft":
        return [str(ROOT / "scripts" / "diloco_torchft.py"), "--period", parts[0]] + common
    cmd = [str(ROOT / "scripts" / "diloco_recipe.py"), "--period", parts[0]] + common
    if len(parts) > 1 and parts[1] != "none":
        cmd += ["--quantize", parts[1]]
    if len(parts) > 3:
        cmd += ["--outer-lr", parts[2], "--outer-momentum", parts[3]]
    return cmd


def run(row, args, out):
    env = {"PYTHONPATH": str(ROOT / "build" / "python")}
    python = None
    if row.startswith("torchft:"):
        if not args.torchft_python:
            sys.exit("bench-diloco.py: a torchft row needs --torchft-python (an environment with torch and torchft)")
        python = args.torchft_python
    d = run_torchrun(args.hosts, args.ranks_per_host, command(row, args, out), out, env, python=python)
    hit = next(((s, t) for s, t, a in d["accuracy_trace"] if a >= args.target), None)
    # a hopwise row's bytes are its syncs' (hopwise.torch.stats() also counts the evaluation probes' averages)
    sent = d["diloco_stats"]["bytes"] / max(1, d["steps"]) if d.get("diloco_stats") else d["bytes_per_step"]
    # train.py's link count only: diloco_recipe.py and diloco_torchft.py write 0 there, for not measured
    wire = d.get("link_bytes_per_step")
    return {"step_ms": d["step_ms"], "compute_ms": d["compute_ms"], "bytes_per_step": sent, "link_bytes_per_step": wire,
            "seconds_to_target": hit[1] if hit else None, "accuracy": d["test_accuracy"],
            "own_utilization": d["utilization"], **auto_said(d)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--epochs", type=float, default=5)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--row", action="append", default=None)
    ap.add_argument("--ddp-epochs", type=float, default=0,
                    help="DDP's epochs where they differ (on a slow link: enough to reach the target)")
    ap.add_argument("--torchft-python", default="", help="the interpreter for torchft rows")
    ap.add_argument("--json", default="")
    ap.add_argument("--partial", default="", help="JSON file rewritten with every run's figures as each run ends")
    args = ap.parse_args()
    rows = args.row or DEFAULT
    with tempfile.TemporaryDirectory() as tmp:
        def run_one(r, rnd):
            return run(r, args, os.path.join(tmp, f"{rnd}-{abs(hash(r))}.json"))
        runs = interleaved(rows, args.rounds, run_one, args.target, args.partial)
    compute = [m["compute_ms"] for r, rs in runs.items() if r == "ddp" or r.startswith("hopwise") for m in rs]
    ref = statistics.median(compute) if compute else 0.0
    med = medians(runs, ["step_ms", "bytes_per_step", "link_bytes_per_step", "seconds_to_target", "accuracy",
                         "own_utilization"], reach=("seconds_to_target",))
    for r, m in med.items():
        m["reached"] = reached(runs[r], "seconds_to_target")
    ddp = med.get("ddp")
    print(f"{args.hosts} emulated hosts x {args.ranks_per_host} rank(s), {args.epochs:g} epochs, target "
          f"{args.target:.0%}, median of {args.rounds} round(s); a step's forward, backward and optimizer step "
          f"alone: {ref:.1f} ms")
    print(f"| row | runs | MB/step (wire) | step ms | utilization | s to {args.target:.0%} (median) | reached | "
          f"each run | accuracy after {args.epochs:g} | vs DDP | DDP's time to {args.target:.0%} / this |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for r, m in med.items():
        name = {"ddp": "PyTorch DDP, gloo"}.get(
            r, r.replace("hopwise:", "hopwise ").replace("recipe:", "plain-PyTorch recipe H=")
            .replace("torchft:", "torchft DiLoCo H="))
        to = "not reached" if m["seconds_to_target"] is None else f"{m['seconds_to_target']:.1f}"
        delta = "-" if not ddp or r == "ddp" else f"{100 * (m['accuracy'] - ddp['accuracy']):+.2f}"
        speed = "-" if r == "ddp" else speedup(ddp, m)
        print(f"| {name} | {len(runs[r])} | {megabytes(m)} | {m['step_ms']:.1f} | "
              f"{min(1.0, ref / m['step_ms']):.0%} | {to} | {m['reached']} | {each(runs[r], 'seconds_to_target')} | "
              f"{100 * m['accuracy']:.2f}% | {delta} | {speed} |")
    for r in runs:  # what diloco:auto chose and decided last, run by run
        for i, x in enumerate(runs[r]):
            for said in auto_lines(x):
                print(f"{r} run {i + 1}: {said}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"medians": med, "runs": runs, "compute_ms": ref, "args": vars(args)}, fh, indent=1)


if __name__ == "__main__":
    main()
