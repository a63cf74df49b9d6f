#!/usr/bin/env python3
"""dist.all_reduce through torch: the hopwise backend beside gloo, in the same processes, sizes interleaved and
repeated, medians quoted.  torchrun --standalone --nproc_per_node 4 --redirects 1 --tee 1 \\
    scripts/bench-torch-allreduce.py [--min 4K] [--max 64M] [--rounds 5] [--json FILE]
(PYTHONPATH=build/python). Each round times every size on gloo then on hopwise (order alternating by round)."""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import hopwise.torch  # noqa: F401


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def human(n):
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min", default="4K")
    ap.add_argument("--max", default="64M")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    groups = {"gloo": dist.group.WORLD, "hopwise": dist.new_group(backend="hopwise")}
    rank, world = dist.get_rank(), dist.get_world_size()
    sizes, n = [], parse_size(args.min)
    while n <= parse_size(args.max):
        sizes.append(n)
        n *= 4
    times = {(b, s): [] for b in groups for s in sizes}
    for r in range(args.rounds):
        for s in sizes:
            t = torch.ones(s // 4)
            iters = max(3, min(200, (64 << 20) // s // 4))
            order = list(groups) if r % 2 == 0 else list(groups)[::-1]
            for b in order:
                dist.all_reduce(t, group=groups[b])  # warm
                dist.barrier(group=groups["gloo"])
                t0 = time.perf_counter()
                for _ in range(iters):
                    dist.all_reduce(t, group=groups[b])
                elapsed = torch.tensor([(time.perf_counter() - t0) / iters])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=groups["gloo"])
                times[(b, s)].append(elapsed.item() * 1e6)
    if rank == 0:
        print(f"dist.all_reduce, float32 sum, {world} ranks, median of {args.rounds} interleaved rounds (us)")
        print(f"{'size':>6} {'gloo':>10} {'hopwise':>10} {'gloo/hopwise':>13}")
        rows = []
        for s in sizes:
            g, h = statistics.median(times[("gloo", s)]), statistics.median(times[("hopwise", s)])
            rows.append({"bytes": s, "gloo_us": g, "hopwise_us": h, "ratio": g / h})
            print(f"{human(s):>6} {g:10.1f} {h:10.1f} {g / h:12.2f}x")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
