"""hopwise.torch.ElasticContext on DDP (test_torch_backend.py's test_elastic_shrink): 4 ranks train a small model on a
global batch of 64 split across them; rank VICTIM kills itself (SIGKILL) at step 10. The survivors catch the failed
backward, agree on who is left, form the group again, re-wrap DDP and do the step again; at the end each prints its
view: ranks, generation, steps redone, whether every survivor holds the same parameters, and the re-wrap time.

    elastic_worker.py STORE_FILE VICTIM"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hopwise.torch

STEPS, BATCH = 30, 64


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks' lines do not interleave


def main():
    store, victim = sys.argv[1], int(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    ctx = hopwise.torch.ElasticContext(store)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(-1)  # learnable: the loss falls
    step, redone, rewrap_ms, first_loss, loss = 0, 0, 0.0, None, None
    while step < STEPS:
        if step == 10 and ctx.id == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        rank, world = dist.get_rank(), dist.get_world_size()
        lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
        try:
            loss = nn.functional.cross_entropy(ddp(x[step][lo:hi]), y[step][lo:hi])
            opt.zero_grad()
            loss.backward()
            opt.step()
        except RuntimeError as e:
            ctx.shrink(str(e))
            t0 = time.perf_counter()
            ddp = DDP(model)
            rewrap_ms = (time.perf_counter() - t0) * 1e3
            redone += 1
            continue
        first_loss = loss.item() if first_loss is None else first_loss
        step += 1
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    hi_, lo_ = flat.clone(), flat.clone()
    dist.all_reduce(hi_, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo_, op=dist.ReduceOp.MIN)
    say(f"rank {ctx.id}: elastic ok: {dist.get_world_size()} ranks at the end, generation {ctx.generation}, "
          f"{redone} step(s) redone, parameters identical {torch.equal(hi_, lo_)}, loss {first_loss:.3f} -> "
          f"{loss.item():.3f}, re-wrap {rewrap_ms:.0f} ms")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
