#!/usr/bin/env python3
"""The headline on a language model: examples/torch_lm/train.py under every method on the emulated cluster as it is
(scripts/local-cluster.sh up/shape), runs interleaved over rounds, medians quoted, a table and a chart.

    scripts/local-cluster.sh up 2 --slots 1 && scripts/local-cluster.sh shape 100mbit
    scripts/bench-lm.py [--ranks-per-host 1] [--steps 300] [--rounds 3] [--json FILE] [--row ROW ...] [-- FLAGS]
    /usr/bin/python3 scripts/plot.py FILE          # the chart: validation loss against wall time, utilization

Rows: ddp (DDP on gloo, the reference), ddp-hopwise (DDP on hopwise), hook:SPEC (DDP on hopwise with a codec, e.g.
hook:int8:ef=1, hook:powersgd:rank=4), averaging:SPEC (local:period=H, async:period=H,delay=1,codec=int8),
diloco:SPEC (hopwise's DiLoCo, any spec or diloco:auto), recipe:H[:int8][:LR:MOMENTUM] (the plain-PyTorch DiLoCo
recipe over gloo, no hopwise; its outer lr and Nesterov momentum, 0.7 and 0.9 unless named), torchft:H[:LR:MOMENTUM]
(torchft's DiLoCo, with --torchft-python: an environment with this torch and torchft, pip install torchft; not part
of hopwise's setup), fsdp (FSDP2 on gloo), fsdp-hopwise (FSDP2 on hopwise, uncompressed), fsdp:GRADS[/PARAMS]
(FSDP2 on hopwise with hopwise.torch.fsdp.compress: e.g. fsdp:int8:ef=1/int8, fsdp:int4:ef=1, fsdp:none/int8).
FLAGS after -- go to every run (the model's size, --batch, --lr, ...). Every row trains the
same model from the same seed on the same tokens with the same global batch (with --seed-per-round, round k's rows
from seed k + 1: early training can be chaotic enough that one seed's ordering of rows says little).

Figures per row: step ms (training time / steps; evaluation is off the clock), utilization (one compute figure for
every row: the median over all runs of train.py's forward, backward and AdamW step measured apart, over the row's
step), MB/step (what the host's link sent per step per rank, train.py's link_bytes_per_step, where measured; else
what a rank hands its collectives per step), the validation loss (bits per byte) after the same tokens, and the
training seconds until the validation loss first reached the reference row's final loss within 1% (relative; the
medians of its runs; --reference, DDP on gloo unless named; with --seed-per-round the reference's run of the same
seed, and "vs" the median of each run's loss over its seed's reference), checked every --eval-every steps. That time's median is
over every run, one that never reached the target counting as +infinity ("not reached" where that median is), and
"reached" says in how many runs it did; the reference's time over the row's is of these medians. FSDP2 on gloo
counts no bytes of its own: its row shows FSDP2 on hopwise uncompressed's, the same collectives."""
import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_rounds import auto_lines, auto_said, each, interleaved, median, median_reached, megabytes, reached, speedup
from cluster_torchrun import run_torchrun

ROOT = Path(__file__).resolve().parents[1]
TRAIN = str(ROOT / "examples" / "torch_lm" / "train.py")
DEFAULT = ["ddp", "ddp-hopwise", "hook:int8:ef=1", "hook:powersgd:rank=4", "averaging:local:period=16",
           "averaging:async:period=8,delay=1,codec=int8", "diloco:diloco:period=16", "recipe:16",
           "diloco:diloco:period=64", "recipe:64", "diloco:diloco:period=64,codec=int4",
           "diloco:diloco:period=64,fragments=4,delay=1,codec=int8", "diloco:diloco:auto"]
TOLERANCE = 0.01  # "DDP's loss": within 1% of it


def peer_flags(kind, spec):
    """recipe:H[:int8][:LR:MOMENTUM] and torchft:H[:LR:MOMENTUM]: train.py's flags."""
    parts = spec.split(":")
    outer = []
    if len(parts) >= 3:
        outer = ["--outer-lr", parts[-2], "--outer-momentum", parts[-1]]
        parts = parts[:-2]
    if not parts[0].isdigit() or (kind == "torchft" and len(parts) > 1) or len(parts) > 2:
        sys.exit(f"bench-lm.py: row '{kind}:{spec}': {kind}:H" + ("[:int8]" if kind == "recipe" else "") +
                 "[:LR:MOMENTUM]")
    return ["--backend", "gloo", f"--{kind}", ":".join(parts), *outer]


def fsdp_flags(spec):
    """fsdp:GRADS[/PARAMS] -> train.py's flags."""
    grads, _, params = spec.partition("/")
    return ["--backend", "hopwise", "--fsdp", "--fsdp-grads", grads or "none", "--fsdp-params", params or "none"]


def command(row, args, out):
    kind, _, spec = row.partition(":")
    flags = peer_flags(kind, spec) if kind in ("recipe", "torchft") else fsdp_flags(spec) if kind == "fsdp" and spec \
        else {"fsdp": ["--backend", "gloo", "--fsdp"], "fsdp-hopwise": ["--backend", "hopwise", "--fsdp"],
        "ddp": ["--backend", "gloo"], "ddp-hopwise": ["--backend", "hopwise"],
        "hook": ["--backend", "hopwise", "--ddp-hook", spec],
        "averaging": ["--backend", "hopwise", "--averaging", spec],
        "diloco": ["--backend", "hopwise", "--diloco", spec]}.get(kind)
    if flags is None:
        sys.exit(f"bench-lm.py: row '{row}': ddp, ddp-hopwise, hook:SPEC, averaging:SPEC, diloco:SPEC, recipe:H, "
                 "torchft:H, fsdp, fsdp-hopwise, fsdp:GRADS[/PARAMS]")
    return [TRAIN, *flags, "--steps", str(args.steps), "--eval-every", str(args.eval_every), "--sample", "0",
            "--json", out, *args.flags]


def run(row, args, out, rnd):
    env = {"PYTHONPATH": str(ROOT / "build" / "python")}
    seed = ["--seed", str(rnd + 1)] if args.seed_per_round else []  # round k: seed k + 1, every row alike
    python = args.torchft_python if row.startswith("torchft:") else None
    d = run_torchrun(args.hosts, args.ranks_per_host, command(row, args, out) + seed, out, env, python=python)
    return {"step_ms": d["step_ms"], "compute_ms": d["compute_ms"], "bytes_per_step": d["bytes_per_step"],
            "link_bytes_per_step": d.get("link_bytes_per_step"), "val_bpb": d["val_bpb"], "trace": d["val_trace"],
            "train_s": d["train_s"], "tokens": d["tokens"],
            "parameters": d["parameters"], **auto_said(d)}


def row_medians(rs):
    """A row's medians; its time to the target's over every run (one not reached: +inf), and in how many it was. get:
    a resumed --partial file's runs may predate link_bytes_per_step (None: not measured)."""
    m = {k: median([x.get(k) for x in rs]) for k in ("step_ms", "bytes_per_step", "link_bytes_per_step", "val_bpb")}
    return {**m, "seconds_to_target": median_reached(rs, "seconds_to_target"),
            "reached": reached(rs, "seconds_to_target")}


def seconds_to(trace, target):
    return next((s for _, s, bpb in trace if bpb <= target), None)


def label(row):
    kind, _, spec = row.partition(":")
    if kind == "fsdp" and spec:
        grads, _, params = spec.partition("/")
        return f"FSDP2, hopwise: grads {grads or 'none'}, params {params or 'none'}"
    return {"ddp": "DDP, gloo", "ddp-hopwise": "DDP, hopwise", "fsdp": "FSDP2, gloo",
            "fsdp-hopwise": "FSDP2, hopwise, uncompressed"}.get(row) or {
        "hook": f"DDP + hopwise {spec} hook", "averaging": f"hopwise {spec}", "diloco": f"hopwise {spec}",
        "recipe": f"plain-PyTorch recipe {peer_words(spec)}", "torchft": f"torchft DiLoCo {peer_words(spec)}"}[kind]


def peer_words(spec):
    """4:int8:1:0 -> 'H=4 int8, outer lr 1 momentum 0'."""
    parts = spec.split(":")
    outer = f", outer lr {parts[-2]} momentum {parts[-1]}" if len(parts) >= 3 else ""
    return f"H={' '.join(parts[:-2] if outer else parts)}{outer}"


def main():
    argv = sys.argv[1:]
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks-per-host", type=int, default=1)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--row", action="append", default=None)
    ap.add_argument("--link", default="", help="the link's rate, for the table and chart (e.g. 100 Mbit/s)")
    ap.add_argument("--json", default="")
    ap.add_argument("--seed-per-round", action="store_true",
                    help="round k trains every row from seed k + 1 (the medians then span seeds)")
    ap.add_argument("--reference", default="ddp", help="the row whose final loss is the target (e.g. fsdp)")
    ap.add_argument("--torchft-python", default="", help="the interpreter for torchft rows")
    ap.add_argument("--partial", default="", help="JSON file rewritten with every run's figures as each run ends")
    ap.add_argument("--resume", default="", help="an interrupted sitting's --partial file: its runs are kept")
    args = ap.parse_args(argv)
    args.flags = flags
    rows = args.row or DEFAULT
    if any(r.startswith("torchft:") for r in rows) and not args.torchft_python:
        sys.exit("bench-lm.py: a torchft row needs --torchft-python (an environment with this torch and torchft)")
    ref_row = args.reference
    if ref_row not in rows:
        sys.exit(f"bench-lm.py: the rows need the reference row {ref_row}: its final loss is every row's target")
    with tempfile.TemporaryDirectory() as tmp:
        def run_one(r, rnd):
            return run(r, args, os.path.join(tmp, f"{rnd}-{abs(hash(r))}.json"), rnd)
        done = None
        if args.resume:
            with open(args.resume) as fh:
                done = json.load(fh)
        runs = interleaved(rows, args.rounds, run_one, 0, args.partial, done=done,
                           describe=lambda m: f"{m['step_ms']:.0f} ms/step, {m['val_bpb']:.4f} bits per byte")
    ref = statistics.median(m["compute_ms"] for rs in runs.values() for m in rs)
    target = median([m["val_bpb"] for m in runs[ref_row]]) * (1 + TOLERANCE)
    # With a seed per round, each run is scored against the reference's run of the same seed (its final loss + 1%,
    # and its loss beside it): seeds move the final loss by more than the 1% tolerance.
    refs = [m["val_bpb"] for m in runs[ref_row]]
    for rs in runs.values():
        for k, m in enumerate(rs):
            own = refs[k] if args.seed_per_round and k < len(refs) else median(refs)
            m["target_bpb"] = own * (1 + TOLERANCE)
            m["seconds_to_target"] = seconds_to(m["trace"], m["target_bpb"])
            m["vs_reference"] = m["val_bpb"] / own - 1
    med = {r: row_medians(rs) for r, rs in runs.items()}
    for r, rs in runs.items():
        med[r]["vs_reference"] = median([m["vs_reference"] for m in rs])
    for k in ("bytes_per_step", "link_bytes_per_step"):
        if "fsdp" in med and med["fsdp"][k] is None and "fsdp-hopwise" in med:
            med["fsdp"][k] = med["fsdp-hopwise"][k]  # the same collectives
    ddp = med[ref_row]
    first = runs[ref_row][0]
    print(f"{args.hosts} emulated hosts x {args.ranks_per_host} rank(s){', ' + args.link if args.link else ''}: GPT "
          f"of {first['parameters']:,} parameters, {args.steps} steps ({first['tokens']:,} tokens), median of "
          f"{args.rounds} round(s); a step's forward, backward and AdamW step alone: {ref:.0f} ms; {label(ref_row)}'s "
          f"final loss {ddp['val_bpb']:.4f} bits per byte, the target "
          + (f"each seed's own final loss +{TOLERANCE:.0%} ({', '.join(f'{m:.4f}' for m in refs)})"
             if args.seed_per_round else f"{target:.4f} (+{TOLERANCE:.0%})"))
    print(f"| row | runs | MB/step (wire) | step ms | utilization | s to {label(ref_row)}'s loss (median) | reached | "
          f"each run | final bpb | vs {label(ref_row)} | its time / this | step / its step |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
    for r, m in med.items():
        to = "not reached" if m["seconds_to_target"] is None else f"{m['seconds_to_target']:.0f}"
        rel = "-" if r == ref_row else f"{100 * m['vs_reference']:+.2f}%"  # the median over runs, each its seed's
        speed = "-" if r == ref_row else speedup(ddp, m)
        print(f"| {label(r)} | {len(runs[r])} | {megabytes(m)} | {m['step_ms']:.0f} | "
              f"{min(1.0, ref / m['step_ms']):.0%} | {to} | {m['reached']} | "
              f"{each(runs[r], 'seconds_to_target', '.0f')} | "
              f"{m['val_bpb']:.4f} | {rel} | {speed} | {m['step_ms'] / ddp['step_ms']:.2f} |")
    for r, rs in runs.items():
        for m in rs:
            for said in auto_lines(m):
                print(f"{r}: {said}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"kind": "bench-lm", "medians": med, "runs": runs, "compute_ms": ref, "target_bpb": target,
                       "labels": {r: label(r) for r in rows}, "args": vars(args)}, fh, indent=1)


if __name__ == "__main__":
    main()
