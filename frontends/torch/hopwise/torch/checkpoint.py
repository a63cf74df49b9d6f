"""Checkpoints that a kill cannot tear, and a restart that resumes from the newest step every rank holds: for
trainers that torchrun --max-restarts (or a requeued batch job) starts again after a rank dies.

    ckpt = hopwise.torch.Checkpoints("/scratch/job/ckpt")      # files /scratch/job/ckpt.step<S>.rank<R>
    found = ckpt.load_newest()                                  # collective: (step, state) or None (a fresh run)
    if found:
        start, state = found
        model.load_state_dict(state["model"]); opt.load_state_dict(state["optimizer"]); ...
    for step in range(start, steps):
        ...
        if (step + 1) % 50 == 0:
            ckpt.save(step + 1, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                                 "hook": hook_state, "averager": avg.state_dict()})   # collective

Each rank writes its own file (its momentum, and under an averaging method its parameters, are its own) to a
temporary name, flushes and syncs it; only once every rank's file is whole does each rename its own into place and
sync the directory, and each keeps its two newest steps: a rank killed between the others' renames and its own
still shares the step before. On load the ranks agree on the newest step all of them hold; they all load it or all
fail, naming the ranks. A run's id, drawn at its fresh start and carried through its resumes, keeps files of
different runs from mixing. Files are read with torch.load(weights_only=True): tensors, numbers, strings and the
types registered as safe (hopwise's HookState is), nothing that runs code.
"""
import os
import random
import re

import torch
import torch.distributed as dist

_FORMAT = "hopwise-checkpoint"
_KEPT = 2


class Checkpoints:
    def __init__(self, path, group=None):
        self.path = str(path)
        self.group = group
        self.run = None  # the run's id: from the loaded files, or drawn at the first save of a fresh run

    def _rank(self):
        return dist.get_rank(self.group)

    def file(self, step, rank=None):
        return f"{self.path}.step{step}.rank{self._rank() if rank is None else rank}"

    def steps(self, temporary=False):
        """This rank's steps on disk, newest first."""
        folder = os.path.dirname(self.path) or "."
        pattern = re.compile(re.escape(os.path.basename(self.path)) + r"\.step(\d+)\.rank" + str(self._rank()) +
                             (r"\.tmp" if temporary else "") + "$")
        found = []
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            m = pattern.match(name)
            if m:
                found.append(int(m.group(1)))
        return sorted(found, reverse=True)

    def _gather(self, mine):
        every = [None] * dist.get_world_size(self.group)
        dist.all_gather_object(every, mine, group=self.group)
        return every

    def _draw_run(self):
        box = [f"{random.SystemRandom().getrandbits(64):016x}" if self._rank() == 0 else None]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, 0) if self.group else 0, group=self.group)
        return box[0]

    def save(self, step, state):
        """Every rank's file of `step`; raises on every rank, naming the ranks that could not write (the last
        checkpoint stands). Collective."""
        if self.run is None:
            self.run = self._draw_run()
        path = self.file(step)
        tmp = path + ".tmp"
        failure = None
        try:
            with open(tmp, "wb") as f:
                torch.save({"format": _FORMAT, "version": 1, "step": step, "run": self.run,
                            "ranks": dist.get_world_size(self.group), "state": state}, f)
                f.flush()
                os.fsync(f.fileno())
        except Exception as e:  # every rank must learn of it: all rename or none does
            failure = f"{type(e).__name__}: {e}"
        failed = [r for r, v in enumerate(self._gather(failure)) if v is not None]
        if failed:
            try:
                os.remove(tmp)
            except OSError:
                pass
            raise RuntimeError(f"hopwise: checkpoint of step {step} not saved: rank(s) "
                               f"{', '.join(map(str, failed))} could not write theirs"
                               f"{f' (here: {failure})' if failure else ''}; the last checkpoint stands")
        os.replace(tmp, path)
        folder = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
        for old in self.steps()[_KEPT:]:
            _remove(self.file(old))
        for stale in self.steps(temporary=True):  # left by a killed attempt
            _remove(self.file(stale) + ".tmp")

    def load_newest(self):
        """(step, state) of the newest step every rank holds, or None when no rank holds a file. Raises on every
        rank, naming ranks and steps, when some rank holds files but no step is common, when the common step's
        files are of different runs or of another world size, or when some rank cannot read its file. Collective."""
        offers = self._gather(self.steps())
        if not any(offers):
            self.run = None
            return None
        common = set(offers[0]).intersection(*offers[1:])
        if not common:
            held = "; ".join(f"rank {r}: {', '.join(map(str, s)) or 'none'}" for r, s in enumerate(offers))
            raise RuntimeError(f"hopwise: checkpoint {self.path}: no step that every rank holds ({held}); files "
                               f"lost or of another job? point elsewhere, or remove {self.path}.step* to start afresh")
        step = max(common)
        saved, failure = None, None
        try:
            saved = torch.load(self.file(step), map_location="cpu", weights_only=True)
            if not isinstance(saved, dict) or saved.get("format") != _FORMAT or saved.get("step") != step:
                raise ValueError(f"{self.file(step)} is not a hopwise checkpoint of step {step}")
        except Exception as e:
            failure = f"{type(e).__name__}: {e}"
        found = self._gather(failure if failure else (saved["run"], saved["ranks"]))
        bad = [r for r, v in enumerate(found) if isinstance(v, str)]
        if bad:
            raise RuntimeError(f"hopwise: checkpoint {self.path}: rank(s) {', '.join(map(str, bad))} could not read "
                               f"their file of step {step}" + (f" (here: {failure})" if failure else ""))
        runs = [v[0] for v in found]
        if len(set(runs)) > 1:
            differ = [r for r, run in enumerate(runs) if run != runs[0]]
            raise RuntimeError(f"hopwise: checkpoint {self.path}: the ranks' files of step {step} are of different "
                               f"runs ({', '.join(f'rank {r}: {run}' for r, run in enumerate(runs))}); rank(s) "
                               f"{', '.join(map(str, differ))} differ from rank 0 (files of different runs mixed?)")
        world = dist.get_world_size(self.group)
        if saved["ranks"] != world:
            raise RuntimeError(f"hopwise: checkpoint {self.path}: saved by {saved['ranks']} ranks, this job has "
                               f"{world}")
        self.run = saved["run"]
        return step, saved["state"]


def _remove(path):
    try:
        os.remove(path)
    except OSError:
        pass
