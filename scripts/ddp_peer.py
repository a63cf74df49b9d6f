#!/usr/bin/env python3
"""PyTorch DDP (gloo) on the same model, data, global batch and ranks as train_mnist: the peer row for the
reducer. Launch like the trainer:  mpirun -np 2 $(scripts/venv.sh --path)/bin/python scripts/ddp_peer.py --steps 200
Needs the torch environment scripts/setup.sh makes. Prints DDP's step time, its step time without
communication (no_sync), and the difference: the communication DDP left exposed. Denormals are flushed to zero,
as in the trainers (--keep-denormals leaves them)."""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np

try:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError:
    sys.exit("ddp_peer.py needs PyTorch: run scripts/setup.sh, then this with scripts/venv.sh python")


def load_images(path):
    with gzip.open(path) as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    return np.frombuffer(data, np.uint8, offset=16).reshape(n, 784).astype(np.float32) / 255.0


def load_labels(path):
    with gzip.open(path) as f:
        return np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128, help="global batch, split across ranks")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--json", default="")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="leave denormal floats on (by default flushed to zero, as train_mnist and train.py do)")
    args = ap.parse_args()
    if not args.keep_denormals:  # the trainers it is compared with flush them too
        torch.set_flush_denormal(True)

    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
    world = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.set_num_threads(1)  # one core per rank, as the C++ trainer
    dist.init_process_group("gloo", rank=rank, world_size=world)

    root = os.environ.get("HOPWISE_MNIST_DIR", "/usr/share/datasets/fashion-mnist")
    x = torch.from_numpy(load_images(f"{root}/train-images-idx3-ubyte.gz"))
    y = torch.from_numpy(load_labels(f"{root}/train-labels-idx1-ubyte.gz"))
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10))
    ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    local = args.batch // world

    def step(i, sync):
        lo = (i * args.batch + rank * local) % (x.shape[0] - local)
        xb, yb = x[lo:lo + local], y[lo:lo + local]
        opt.zero_grad(set_to_none=False)
        if sync:
            loss_fn(ddp(xb), yb).backward()
        else:
            with ddp.no_sync():
                loss_fn(ddp(xb), yb).backward()
        opt.step()

    def timed(sync):
        for i in range(10):
            step(i, sync)
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(args.steps):
            step(i, sync)
        dist.barrier()
        return (time.perf_counter() - t0) / args.steps * 1e3

    # Interleave halves so that both see the same machine.
    with_comm = (timed(True) + timed(True)) / 2
    without = (timed(False) + timed(False)) / 2
    if rank == 0:
        exposed = max(0.0, with_comm - without)
        print(f"pytorch ddp (gloo, {world} ranks, batch {args.batch}, bucket {args.bucket_mb} MB): step {with_comm:.2f} ms, "
              f"without communication {without:.2f} ms, exposed communication {exposed:.2f} ms")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"ranks": world, "step_ms": with_comm, "compute_ms": without, "exposed_comm_ms": exposed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
