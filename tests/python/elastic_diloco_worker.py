"""hopwise.torch.DiLoCo through a change of replicas (ElasticContext, no restart): 3 replicas train a small model,
each on its own slice of every step's batch, syncing a fragment every 2 steps (period 4, 2 fragments, one step
behind compute, the papers' outer Nesterov step).
  kill-fragment: replica VICTIM kills itself (SIGKILL) between syncs (nothing of it in flight);
  kill-sync:     replica VICTIM kills itself right after it launched a fragment's sync (in flight on the others);
  stop:          replica VICTIM is stopped (SIGSTOP) for STOP_S seconds, past the others' timeout, then continued:
                 the others go on without it, and it is refused by name;
  grow:          rank 0 starts a newcomer (this script, "join") at once; the members let it in after a full average
                 at the step 10 boundary: it takes the synced model, the outer momentum and the step count.
  torchrun:      each replica is its own torchrun (--max-restarts) naming its place (I N); replica VICTIM kills
                 itself at step 10 on its first attempt, torchrun starts it again and it joins the running job
                 (TORCHELASTIC_RESTART_COUNT > 0): the members go on without it, then let it in at a boundary.
The survivors catch the failed step, detach the averager, agree (ctx.shrink), and regroup: the outer state goes on,
the broken sync is redone over them. Each prints its view at the end: replicas, generation, whether all hold the
same parameters after the last full average, the loss at the start, just before the event and at the end, and what
the regroup said.

    elastic_diloco_worker.py STORE_FILE MODE VICTIM [I N]"""
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import hopwise.torch
from elastic_worker import identical, say  # DDP's elastic worker's: one write a line, bit-for-bit equality

STEPS, BATCH, BOUNDARY = 40, 60, 10
SPEC = "diloco:period=4,fragments=2,delay=1,outer_lr=0.7,momentum=0.9"


def main():
    store, mode = sys.argv[1], sys.argv[2]
    victim = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    place = {"replica": int(sys.argv[4]), "replicas": int(sys.argv[5])} if len(sys.argv) > 5 else {}
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    newcomer = None
    if mode == "grow" and os.environ.get("RANK") == "0":
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        newcomer = subprocess.Popen([sys.executable, __file__, store, "join"], env=dict(env, HOPWISE_ELASTIC_JOIN="1"))
    ctx = hopwise.torch.ElasticContext(store, **place)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    diloco = hopwise.torch.DiLoCo(model, opt, SPEC, join=ctx.joined_late)  # a newcomer takes the members' state
    said = ""
    if ctx.joined_late:
        said = f"joined at step {diloco.steps}" + (f" (torchrun's attempt {attempt})" if attempt else "")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, BATCH, 32, generator=g)
    y = (x @ torch.randn(32, 4, generator=g)).argmax(-1)  # learnable: the loss falls
    losses = {}
    while diloco.steps < STEPS:
        step = diloco.steps
        if mode == "grow" and not ctx.joined_late and step == BOUNDARY and not ctx.events:
            while ctx.store.add(hopwise.torch.elastic.TICKETS, 0) < 1:  # the test's newcomer comes in here
                time.sleep(0.01)
            if ctx.newcomers_waiting():
                diloco.full_average()  # the newcomer starts from the synced model
                ctx.admit()
                said = diloco.regroup()
        if mode == "torchrun" and step % 10 == 0:
            if step == 2 * BOUNDARY and not ctx.joined_late:  # torchrun's restart of the victim comes in here
                while ctx.store.add(hopwise.torch.elastic.TICKETS, 0) < 1:
                    time.sleep(0.01)
            try:
                if ctx.newcomers_waiting(step):  # the restarted replica's ticket: let in after a full average
                    diloco.full_average()
                    ctx.admit()
                    said = diloco.regroup()
            except RuntimeError as e:  # the victim is gone: the others go on
                diloco.detach()
                ctx.shrink(str(e))
                said = diloco.regroup()
        rank, world = dist.get_rank(), dist.get_world_size()
        lo, hi = rank * BATCH // world, (rank + 1) * BATCH // world
        loss = nn.functional.cross_entropy(model(x[step][lo:hi]), y[step][lo:hi])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
        try:
            diloco.step()
        except RuntimeError as e:  # a replica is lost or stopped: the survivors go on from the outer state
            diloco.detach()
            ctx.shrink(str(e))
            said = diloco.regroup()
        if ctx.id == victim and diloco.steps == BOUNDARY + (1 if mode == "kill-fragment" else 0) and attempt == 0:
            if mode == "stop":  # a child stops this process and continues it later
                subprocess.Popen(["/bin/sh", "-c", f"kill -STOP {os.getpid()}; sleep {os.environ.get('STOP_S', '12')}; "
                                                   f"kill -CONT {os.getpid()}"])
                time.sleep(1)
            else:
                os.kill(os.getpid(), signal.SIGKILL)
    diloco.full_average()
    same = identical(model)
    before = losses.get(BOUNDARY - 1, float("nan"))
    after = [losses[s] for s in range(BOUNDARY + 1, BOUNDARY + 5) if s in losses] or [float("nan")]  # a newcomer's
    say(f"rank {ctx.id}: elastic diloco ok: {dist.get_world_size()} replicas at the end, generation {ctx.generation}, "
        f"parameters identical {same}, loss {losses[min(losses)]:.3f} -> {before:.3f} before the event -> "
        f"{max(after):.3f} at most after -> {losses[STEPS - 1]:.3f}, steps {diloco.steps}; {said}")
    dist.destroy_process_group()
    if newcomer is not None:
        newcomer.wait(timeout=120)


if __name__ == "__main__":
    main()
