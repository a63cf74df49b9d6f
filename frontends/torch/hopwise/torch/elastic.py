"""Shrink in place under PyTorch: when a rank is lost, the survivors agree on who is left and form the default group
again over them, without a restart. DDP cannot follow a group that changes size (its reducer keeps the group and
its size), so the recipe re-wraps the model; the optimizer keeps its state (it holds the model's own tensors).

    ctx = hopwise.torch.ElasticContext("/shared/job.store")   # collective: init_process_group("hopwise")
    ddp = DDP(model)
    step = 0
    while step < steps:
        try:
            loss = loss_fn(ddp(x[step]), y[step]); opt.zero_grad(); loss.backward(); opt.step()
        except RuntimeError as e:           # a collective failed: a rank is lost (or stopped)
            ctx.shrink(str(e))              # the survivors' new group; raises on a rank left out
            ddp = DDP(model)                # re-wrap: rank 0's parameters to every rank, new buckets
            continue                        # the step again: it failed in backward, before opt.step()
        step += 1

The ranks meet through a file store every rank sees (torch.distributed.FileStore), which outlives any of them: a
TCP store dies with the rank that serves it. RANK and WORLD_SIZE come from the launcher (a harness, or
``srun --kill-on-bad-exit=0``); torchrun ends every rank when one dies, so under it use the restart path
(hopwise.torch.Checkpoints) instead. The agreement is hopwise's (hopwise/comm/elastic.h): each survivor marks itself
alive, waits until all have or HOPWISE_ELASTIC_SETTLE_S (3 s) passed, and the first to finish writes the list all
read; a rank that answers later is refused, naming the generation.
"""
import os
import time

import torch.distributed as dist

from . import _C


class ElasticContext:
    def __init__(self, store_path, timeout_s=None):
        self.id = int(os.environ["RANK"])
        self.members = list(range(int(os.environ["WORLD_SIZE"])))
        self.generation = 0
        self.timeout_s = float(timeout_s or os.environ.get("HOPWISE_TIMEOUT_S", 300))
        self.store = dist.FileStore(str(store_path), -1)
        self.events = []  # one dict per membership change: generation, left, members, stood_still_s
        self._form()

    def _form(self):
        prefix = dist.PrefixStore(f"hopwise/elastic/{self.generation}/group", self.store)
        dist.init_process_group("hopwise", store=prefix, rank=self.members.index(self.id),
                                world_size=len(self.members))

    @property
    def rank(self):
        return self.members.index(self.id)

    def shrink(self, why=""):
        """After a collective failed on this rank: agree with the survivors and form the default group over them
        (the old one is destroyed). Returns the event; raises RuntimeError on a rank left out."""
        t0 = time.perf_counter()
        survivors = _C.elastic_agree(self.store, self.generation, self.id, self.members,
                                     os.environ.get("HOPWISE_ELASTIC", "shrink") or "shrink", self.timeout_s, why)
        left = [m for m in self.members if m not in survivors]
        dist.destroy_process_group()
        self.generation += 1
        self.members = list(survivors)
        self._form()
        event = {"generation": self.generation, "left": left, "members": self.members,
                 "stood_still_s": time.perf_counter() - t0}
        self.events.append(event)
        if self.rank == 0:
            print(f"elastic: generation {self.generation}: rank(s) {', '.join(map(str, left))} left; "
                  f"{len(self.members)} rank(s) go on ({', '.join(map(str, self.members))}) after "
                  f"{event['stood_still_s']:.1f} s", flush=True)
        return event
