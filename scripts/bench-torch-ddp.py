#!/usr/bin/env python3
"""DDP on hopwise beside DDP on gloo across emulated hosts: examples/torch_ddp/train.py under
scripts/local-cluster.sh torchrun (one rank per host), configurations interleaved over rounds, medians quoted.

    scripts/local-cluster.sh up 2 --slots 1 && scripts/local-cluster.sh shape 1gbit
    scripts/bench-torch-ddp.py [--epochs 1] [--rounds 2] [--json FILE] [--config BACKEND/HOOK ...]

Prints step, compute (no_sync), utilization, test accuracy, and the speed-up over gloo; "time to gloo's
accuracy" is the time gloo's run first reached its final accuracy over the time this row took to reach it, in
the same round (both checked every 20 steps, off the clock; up to twice gloo's epochs), else "not reached". Accuracy and step time are this row's
at the point it stopped.
(Debian's torchrun agents of a gloo job sometimes linger at exit; a run ends once its JSON is written.)"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from cluster_torchrun import run_torchrun

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ["gloo/none", "hopwise/none", "hopwise/int8:ef=1", "hopwise/powersgd:rank=4", "hopwise/torch-powersgd:rank=4"]


def run(config, args, out, target=0.0):
    backend, hook = config.split("/", 1)
    env = {"PYTHONPATH": str(ROOT / "build" / "python")}
    cmd = [str(ROOT / "examples" / "torch_ddp" / "train.py"), "--backend", backend, "--hook", hook,
           "--epochs", str(args.epochs), "--model", args.model, "--bucket-mb", str(args.bucket_mb), "--json", out]
    if target:  # up to twice as long, stopping at gloo's accuracy
        cmd += ["--target-accuracy", str(target), "--epochs", str(2 * args.epochs)]
    elif config == "gloo/none":  # the baseline's own curve, checked alike
        cmd += ["--trace-accuracy"]
    return run_torchrun(args.hosts, 1, cmd, out, env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--config", nargs="*", action="extend", default=None)  # --config A B, or --config A --config B
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    args.config = args.config or DEFAULT
    results = {c: [] for c in args.config}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            # gloo first (its accuracy after the epochs is every other row's target), the others alternating
            others = [c for c in args.config if c != "gloo/none"]
            order = (["gloo/none"] if "gloo/none" in args.config else []) + (others if r % 2 == 0 else others[::-1])
            target = 0.0
            for c in order:
                out = os.path.join(tmp, f"{r}-{abs(hash(c))}.json")
                results[c].append(run(c, args, out, target if c != "gloo/none" else 0.0))
                if c == "gloo/none":
                    # gloo's accuracy after its epochs, and when its own curve first reached it (checked alike)
                    g = results[c][-1]
                    target = g["test_accuracy"]
                    g["time_to_target_s"] = next(t for _, t, a in g["accuracy_trace"] if a >= target)
                results[c][-1]["gloo_train_s"] = results["gloo/none"][-1]["time_to_target_s"] if target else None
                print(f"round {r + 1}: {c}: {results[c][-1]['step_ms']:.1f} ms/step", file=sys.stderr, flush=True)
    med = {c: {k: statistics.median(x[k] for x in rs) for k in ("step_ms", "compute_ms", "utilization", "test_accuracy",
                                                                  "train_s", "wire_bytes_per_step", "bytes_per_step")}
           for c, rs in results.items()}
    for c, rs in results.items():  # per round: gloo's training time over this row's time to gloo's accuracy
        ratios = [x["gloo_train_s"] / x["time_to_target_s"] for x in rs if x.get("time_to_target_s") and x.get("gloo_train_s")]
        med[c]["to_accuracy"] = statistics.median(ratios) if len(ratios) == len(rs) else None
    base = med.get("gloo/none")
    print(f"DDP, {args.hosts} emulated hosts x 1 rank, model {args.model}, {args.epochs} epoch(s), median of "
          f"{args.rounds} interleaved rounds")
    print(f"{'backend/hook':<32} {'step ms':>8} {'compute':>8} {'util':>5} {'accuracy':>9} {'vs gloo':>8} "
          f"{'time to gloo acc':>17}")
    for c, m in med.items():
        speed = f"{base['step_ms'] / m['step_ms']:7.2f}x" if base else f"{'-':>8}"  # gloo/none not in --config
        reach = ("-" if c == "gloo/none" or not base else
                 f"{m['to_accuracy']:.2f}x shorter" if m["to_accuracy"] else "not reached")
        print(f"{c:<32} {m['step_ms']:8.1f} {m['compute_ms']:8.1f} {m['utilization']:5.0%} {m['test_accuracy']:9.4f} "
              f"{speed} {reach:>17}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"medians": med, "runs": results}, f, indent=1)


if __name__ == "__main__":
    main()
