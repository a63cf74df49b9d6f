"""hopwise.torch.ElasticContext on DDP (test_torch_backend.py's test_elastic_shrink and test_elastic_grow): the ranks
train a small model on a global batch of 64 split across them.
  shrink: rank VICTIM kills itself (SIGKILL) at step 10. The survivors catch the failed backward, agree on who is
          left, form the group again, catch up, re-wrap DDP and do the step again.
  grow:   rank 0 starts a newcomer (this script, HOPWISE_ELASTIC_JOIN=1) at once; the members let it in at the step
          10 boundary (they wait there until it has asked), send it their step and state, and every rank checks
          that all hold the same parameters after its first step.
At the end each prints its view: ranks, generation, steps redone, whether every rank holds the same parameters, and
the re-wrap time.

    elastic_worker.py STORE_FILE VICTIM        (shrink)
    elastic_worker.py STORE_FILE -1 grow       (grow; the newcomer is started with "join")
    elastic_worker.py STORE_FILE -1 grow-dies  (the newcomer is killed with SIGKILL once it took its ticket: the
                                                members time it out and go on, 3 ranks)"""
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import hopwise.torch

STEPS, BATCH, BOUNDARY = 30, 64, 10


def say(line):
    os.write(1, (line + "\n").encode())  # one write: the ranks' lines do not interleave


def identical(model):
    """Whether every rank holds the same parameters, bit for bit (collective)."""
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    hi, lo = flat.clone(), flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    return torch.equal(hi, lo)


def start_newcomer(store):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["HOPWISE_ELASTIC_JOIN"] = "1"
    return subprocess.Popen([sys.executable, __file__, store, "-1", "join"], env=env)


def main():
    store, victim = sys.argv[1], int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "shrink"
    torch.manual_seed(0)
    torch.set_num_threads(1)
    newcomer = start_newcomer(store) if mode.startswith("grow") and os.environ.get("RANK") == "0" else None
    ctx = hopwise.torch.ElasticContext(store)
    if mode == "grow-dies" and newcomer is not None:  # killed after its ticket, before any boundary lets it in
        while ctx.store.add(hopwise.torch.elastic.TICKETS, 0) < 1:  # (rank 0 is in every boundary's allreduce)
            time.sleep(0.01)
        newcomer.kill()
        newcomer.wait()
        newcomer = None
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    step = ctx.share_state(model, opt) if ctx.joined_late else 0
    ddp = DDP(model)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(-1)  # learnable: the loss falls
    redone, rewrap_ms, first_loss, loss, same_after_join = 0, 0.0, None, None, None
    while step < STEPS:
        if step == BOUNDARY and ctx.id == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        if mode.startswith("grow") and not ctx.joined_late and step == BOUNDARY and not ctx.events:
            while ctx.store.add(hopwise.torch.elastic.TICKETS, 0) < 1:  # the test's newcomer comes in here
                time.sleep(0.01)
        if mode in ("grow", "grow-dies", "join") and ctx.newcomers_waiting():
            ctx.admit()
            step = ctx.share_state(model, opt, step)
            ddp = DDP(model)
        rank, world = dist.get_rank(), dist.get_world_size()
        lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
        try:
            loss = nn.functional.cross_entropy(ddp(x[step][lo:hi]), y[step][lo:hi])
            opt.zero_grad()
            loss.backward()
            opt.step()
        except RuntimeError as e:
            ctx.shrink(str(e))
            step = ctx.catch_up(model, opt, step)
            t0 = time.perf_counter()
            ddp = DDP(model)
            rewrap_ms = (time.perf_counter() - t0) * 1e3
            redone += 1
            continue
        first_loss = loss.item() if first_loss is None else first_loss
        step += 1
        if mode in ("grow", "join") and step == BOUNDARY + 1:
            same_after_join = identical(model)
    same = identical(model)
    say(f"rank {ctx.id}: elastic ok: {dist.get_world_size()} ranks at the end, generation {ctx.generation}, "
        f"{redone} step(s) redone, parameters identical {same}, loss {first_loss:.3f} -> "
        f"{loss.item():.3f}, re-wrap {rewrap_ms:.0f} ms" +
        (f", identical after the newcomer's first step {same_after_join}" if same_after_join is not None else ""))
    dist.destroy_process_group()
    if newcomer is not None:
        newcomer.wait(timeout=120)


if __name__ == "__main__":
    main()
