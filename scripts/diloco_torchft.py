#!/usr/bin/env python3
"""DiLoCo through torchft (torchft.local_sgd.DiLoCo, pip install torchft; not part of hopwise's setup): the same
model, data, batch split, evaluation and --json keys as scripts/diloco_recipe.py, so that a bench may set it beside
the plain recipe and hopwise's diloco. Exits 0 with a message when torchft is not installed (a bench skips the row).

    VENV/bin/python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/diloco_torchft.py --period 8 \
        --epochs 0.2 --json out.json      (VENV: an environment with this torch and torchft 0.2.0)

Each torchrun rank is one torchft replica group of size 1 (its own TCPStore and torchft Manager, min_replica_size
= the world); rank 0 runs the lighthouse (torchft._torchft.LighthouseServer) in its own process. torchrun's gloo
group only carries the lighthouse's address, the evaluation counts and barriers; the pseudo-gradients go over
torchft's ProcessGroupGloo. The outer optimizer is SGD(lr --outer-lr, momentum --outer-momentum, nesterov=True) on
the model's parameters; torchft keeps the synced copy on the CPU. should_quantize needs CUDA in torchft 0.2.0 (on a
CPU it records an error and every sync is discarded), so there is no --quantize here. Timing as the recipe's, on
rank 0: the whole step and its compute (forward, backward, inner step; on a syncing step forward and backward only,
since torchft syncs inside the inner step: that step's inner step counts as sync time). The run is cut to whole
periods (torchft's last sync ends it). Tried on one machine (standalone); across emulated hosts the addresses are
the hosts' own (untried). Denormals are flushed to zero, as train.py does."""
import argparse
import json
import os
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch_ddp"))
import train as ddp_example  # noqa: E402


def own_address():
    """This host's address toward MASTER_ADDR (a UDP connect sends nothing)."""
    master = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if master in ("localhost", "127.0.0.1"):
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master, 9))
        return s.getsockname()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--period", type=int, default=8)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--epochs", type=float, default=1)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--target-accuracy", type=float, default=0)
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--trace-accuracy", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--data", default=os.environ.get("HOPWISE_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    args = ap.parse_args()
    try:
        from torchft import Manager, ProcessGroupGloo
        from torchft._torchft import LighthouseServer
        from torchft.local_sgd import DiLoCo
    except ImportError as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"diloco_torchft.py: skipped: torchft is not installed ({e}); pip install torchft into an "
                  "environment with this torch to run it")
        return
    from importlib.metadata import version
    torchft_version = version("torchft")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.set_flush_denormal(True)  # as train.py (a run slowed 2x once values decayed into denormals)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lead = rank == 0
    me = own_address()
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world) if lead else None
    where = [f"http://{me}:{lighthouse.address().rsplit(':', 1)[1]}" if lead else None]
    dist.broadcast_object_list(where, 0)

    x = ddp_example.load_images(f"{args.data}/train-images-idx3-ubyte.gz")
    y = ddp_example.load_labels(f"{args.data}/train-labels-idx1-ubyte.gz")
    tx = ddp_example.load_images(f"{args.data}/t10k-images-idx3-ubyte.gz")
    ty = ddp_example.load_labels(f"{args.data}/t10k-labels-idx1-ubyte.gz")
    model = ddp_example.make_model(args.model, args.hidden)
    inner = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    outer = torch.optim.SGD(model.parameters(), lr=args.outer_lr, momentum=args.outer_momentum, nesterov=True)
    store = dist.TCPStore(me, 0, is_master=True, wait_for_workers=False)  # this replica group's own store
    t = timedelta(seconds=60)
    manager = Manager(pg=ProcessGroupGloo(timeout=t), min_replica_size=world, use_async_quorum=False,
                      load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                                  inner.load_state_dict(sd["inner"])),
                      state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
                      replica_id=f"rank{rank}", rank=0, world_size=1, store_addr=me, store_port=store.port,
                      lighthouse_addr=where[0], hostname=me, timeout=t, quorum_timeout=t, connect_timeout=t)
    loss_fn = nn.CrossEntropyLoss()
    local = args.batch // world
    steps = int(args.epochs * (x.shape[0] // args.batch))
    params = sum(p.numel() for p in model.parameters())
    spec = f"torchft-diloco:period={args.period},outer_lr={args.outer_lr},momentum={args.outer_momentum}"
    if lead:
        print(f"diloco_torchft.py: torchft {torchft_version}, {world} replicas, {spec}, "
              f"{steps} steps, lighthouse {where[0]}", flush=True)

    def batch(i):
        lo = (i * args.batch + rank * local) % (x.shape[0] - local)
        return x[lo:lo + local], y[lo:lo + local]

    def accuracy():
        """The ranks' mean model (as every other row is scored), every rank a slice of the test set; their own
        models are left as they are."""
        own = [p.detach().clone() for p in model.parameters()]
        model.eval()
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.data)
                p.data /= world
            mine = slice(rank * len(tx) // world, (rank + 1) * len(tx) // world)
            right = torch.tensor([(model(tx[mine]).argmax(1) == ty[mine]).sum().item(), len(ty[mine])])
            for p, o in zip(model.parameters(), own):
                p.copy_(o)
        model.train()
        dist.all_reduce(right)
        return right[0].item() / right[1].item()

    # whole periods only: torchft syncs inside the inner step, so the run ends on a sync
    steps = max(args.period, steps // args.period * args.period)
    dist.barrier()
    compute_s, sync_s, syncs, paused, reached, trace = 0.0, 0.0, 0, 0.0, None, []
    with DiLoCo(manager, [model], inner, outer, sync_every=args.period, backup_device=torch.device("cpu"),
                pin_memory=False):
        link_before, eval_link = ddp_example.link_sent(), 0.0
        t0 = time.perf_counter()
        for i in range(steps):
            c0 = time.perf_counter()
            xb, yb = batch(i)
            inner.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            c1 = time.perf_counter()
            inner.step()  # torchft's post-step hook syncs every --period steps
            c2 = time.perf_counter()
            if (i + 1) % args.period == 0:
                syncs += 1
                sync_s += c2 - c1
                compute_s += c1 - c0
            else:
                compute_s += c2 - c0
            if (args.target_accuracy or args.trace_accuracy) and ((i + 1) % args.eval_every == 0 or i == steps - 1):
                e0, l0 = time.perf_counter(), ddp_example.link_sent()
                acc = accuracy()
                eval_link += ddp_example.link_sent() - l0 if l0 is not None else 0
                trace.append((i + 1, e0 - t0 - paused, acc))
                if args.target_accuracy and acc >= args.target_accuracy:
                    reached = (i + 1, e0 - t0 - paused)
                paused += time.perf_counter() - e0
                if reached:
                    steps = i + 1
                    break
        dist.barrier()
        train_s = time.perf_counter() - t0 - paused
        link = ddp_example.link_bytes_per_step(link_before, eval_link, steps)  # train.py's count
    errored = manager.errored()
    test_accuracy = accuracy()
    step_ms = train_s / max(1, steps) * 1e3
    payload = params * 4
    result = {
        "backend": "gloo", "hook": "none", "averaging": "diloco-torchft", "diloco": spec, "period": args.period,
        "inner": "sgd", "inner_lr": args.lr, "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
        "quantize": "none", "model": args.model, "ranks": world, "steps": steps, "syncs": syncs,
        "torchft_version": torchft_version, "torchft_errored": str(errored) if errored else None,
        "step_ms": step_ms, "compute_ms": compute_s / max(1, steps) * 1e3, "utilization": min(1.0, compute_s / train_s),
        "test_accuracy": test_accuracy, "target_accuracy": args.target_accuracy,
        "steps_to_target": reached[0] if reached else None, "time_to_target_s": reached[1] if reached else None,
        "accuracy_trace": trace, "images_per_s": steps * args.batch / train_s, "resumed_at": 0, "train_s": train_s,
        "gradient_bytes_per_step": payload, "bytes_per_step": payload * syncs / max(1, steps), "wire_bytes_per_step": 0,
        "link_bytes_per_step": link,
        "diloco_stats": {"syncs": syncs, "bytes": payload * syncs, "bytes_per_sync": payload,
                         "comm_ms": sync_s * 1e3, "sync_ms": sync_s * 1e3 / max(1, syncs), "hidden_ms": 0.0,
                         "hidden_fraction": 0.0},
    }
    if lead:
        print(f"diloco_torchft.py: {steps} steps, {syncs} syncs ({result['diloco_stats']['sync_ms']:.1f} ms each) in "
              f"{train_s:.1f} s: step {step_ms:.1f} ms, compute {result['compute_ms']:.1f} ms (utilization "
              f"{result['utilization']:.0%}), test accuracy {test_accuracy:.4f}" + (f"; torchft error: {errored}"
                                                                                     if errored else ""))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()
    manager.shutdown(wait=False)
    if lighthouse:
        lighthouse.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
