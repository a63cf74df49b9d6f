"""Elastic training under PyTorch, without a restart. Shrink: when a rank is lost, the survivors agree on who is
left and form the default group again over them. Grow: a process started later (HOPWISE_ELASTIC_JOIN=1) is let in
at a step boundary and receives rank 0's step, parameters and optimizer state. DDP cannot follow a group that
changes size (its reducer keeps the group and its size), so the recipe re-wraps the model; the optimizer keeps its
state (it holds the model's own tensors).

    ctx = hopwise.torch.ElasticContext("/shared/job.store")   # collective: init_process_group("hopwise")
    step = ctx.share_state(model, opt, 0) if ctx.joined_late else 0   # a newcomer: the job's step and state
    ddp = DDP(model)
    while step < steps:
        if ctx.newcomers_waiting():         # HOPWISE_ELASTIC=shrink,grow: at a step boundary, all members agree
            ctx.admit()                     # the group formed again, the newcomers in it
            step = ctx.share_state(model, opt, step)
            ddp = DDP(model)
        try:
            loss = loss_fn(ddp(x[step]), y[step]); opt.zero_grad(); loss.backward(); opt.step()
        except RuntimeError as e:           # a collective failed: a rank is lost (or stopped)
            ctx.shrink(str(e))              # the survivors' new group; raises on a rank left out
            step = ctx.catch_up(model, opt, step)   # where the furthest survivor stands
            ddp = DDP(model)                # re-wrap: rank 0's parameters to every rank, new buckets
            continue                        # the step again: it failed in backward, before opt.step()
        step += 1

The ranks meet through a file store every rank sees (torch.distributed.FileStore), which outlives any of them: a
TCP store dies with the rank that serves it. RANK and WORLD_SIZE come from the launcher (a harness, or ``srun
--kill-on-bad-exit=0``); torchrun ends every rank when one dies, so one torchrun over the whole job takes the restart
path (hopwise.torch.Checkpoints) instead. Or one torchrun per replica (torchft's layout), each naming its place
(``replica=I, replicas=N``): torchrun restarts a replica that died, and the restarted one (TORCHELASTIC_RESTART_COUNT
above 0) joins the running job as a newcomer:

    torchrun --nproc-per-node 1 --max-restarts 100 train.py ...   # on each host; train.py builds
    ctx = hopwise.torch.ElasticContext("/shared/job.store", replica=I, replicas=N) The agreement is hopwise's (hopwise/training/elastic.h): each member's heartbeat
bumps a counter in the store; each survivor marks itself alive and waits until all have, or every one still missing
is lost (its counter stood still for HOPWISE_ELASTIC_SETTLE_S, 3 s; one that still beats is waited for up to the
timeout), and the first to finish writes the list all read; a rank that answers later is refused, naming the
generation. A newcomer takes a ticket in the store; at each boundary the members agree (the smallest count of
tickets any of them saw) on whom to let in, and rank 0 writes each newcomer's generation and the members.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist

from . import _C


TICKETS = "hopwise/elastic/torch/tickets"  # how many processes asked to join so far
# Most processes let in at one boundary: a ticket count past it is a damaged or hostile store, not newcomers.
MOST_NEWCOMERS = 1024


def _count(text, what):
    """A non-negative count read from the store, or a named error: anyone may have written the store's values."""
    if not (text.isascii() and text.isdigit()) or len(text) > 13:  # isdigit alone takes "²", which int() refuses
        raise RuntimeError(f"elastic: the store's {what} '{text[:200]}' is not a count from 0 to 10^13 (another "
                           "job's keys in the same store, or a damaged one? give each job its own store)")
    return int(text)


def _ticket_key(ticket):
    # "GENERATION ID ADMITTED NEXT_ID MEMBER,MEMBER,...": the newcomer's way in, and what the members know
    return f"hopwise/elastic/torch/ticket/{ticket}"


class ElasticContext:
    def __init__(self, store_path, timeout_s=None, join=None, replica=None, replicas=None):
        """Forms the default group (collective). join (default: HOPWISE_ELASTIC_JOIN=1, or a torchrun restart of a
        replica that names its place): this process was started later and waits (up to the timeout) until the
        members let it in; its place is then not read. replica, replicas: this process's place in the job as
        launched and the job's size (default: RANK and WORLD_SIZE), for a launcher that starts each replica on its
        own (one torchrun per replica)."""
        self.timeout_s = float(timeout_s or os.environ.get("HOPWISE_TIMEOUT_S", 300))
        self.store = dist.FileStore(str(store_path), -1)
        self.events = []  # one dict per membership change: generation, left, joined, members, stood_still_s
        if (replica is None) != (replicas is None) or replicas is not None and not 0 <= replica < replicas:
            raise ValueError(f"elastic: replica={replica}, replicas={replicas}: give both, 0 <= replica < replicas")
        restarted = replica is not None and int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) > 0
        if replica is not None:  # this replica's own restarts: the generations name the meetings, not its attempt
            os.environ.pop("TORCHELASTIC_RESTART_COUNT", None)
        self.joined_late = (os.environ.get("HOPWISE_ELASTIC_JOIN", "0") == "1" or restarted) if join is None else join
        self.admitted = 0  # tickets let in so far, alike on every member
        # A newcomer comes in at a boundary whose check the members made already: it skips its first one.
        self._checked_this_boundary = self.joined_late
        if self.joined_late:
            self._wait_to_be_let_in()
        else:
            self.id = int(os.environ["RANK"]) if replica is None else replica
            self.members = list(range(int(os.environ["WORLD_SIZE"]) if replicas is None else replicas))
            self.generation = 0
            self.next_id = len(self.members)  # a newcomer's id: ids are never reused, the lost ranks' included
        # This member's sign of life for the survivors' agreement: one that still beats is waited for.
        self._heartbeat = _C.ElasticHeartbeat(self.store, self.id, self._mode())
        self._form()

    @staticmethod
    def _mode():
        return os.environ.get("HOPWISE_ELASTIC", "shrink") or "shrink"

    def _wait_to_be_let_in(self):
        ticket = self.store.add(TICKETS, 1)
        try:
            self.store.wait([_ticket_key(ticket)], datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as e:
            raise RuntimeError(f"elastic: this process (ticket {ticket}) was not let in within {self.timeout_s:.0f} "
                               f"s: is the job running with HOPWISE_ELASTIC=shrink,grow and calling "
                               f"newcomers_waiting() at its step boundaries? ({e})") from None
        fields = self.store.get(_ticket_key(ticket)).decode(errors="replace").split()
        if len(fields) != 5:
            raise RuntimeError(f"elastic: ticket {ticket}'s answer '{' '.join(fields)[:200]}' is not one hopwise "
                               "writes (another job's keys in the same store?)")
        what = f"answer to ticket {ticket}"
        self.generation, self.id = _count(fields[0], what), _count(fields[1], what)
        self.admitted, self.next_id = _count(fields[2], what), _count(fields[3], what)
        self.members = [_count(m, what) for m in fields[4].split(",")[:1 << 16]]
        if self.members.count(self.id) != 1 or len(set(self.members)) != len(self.members):
            raise RuntimeError(f"elastic: ticket {ticket}'s answer lets this process in as member {self.id}, but its "
                               "member list lacks that id or names a rank twice (a damaged store?)")

    def _form(self):
        prefix = dist.PrefixStore(f"hopwise/elastic/{self.generation}/group", self.store)
        dist.init_process_group("hopwise", store=prefix, rank=self.members.index(self.id),
                                world_size=len(self.members))

    @property
    def rank(self):
        return self.members.index(self.id)

    def newcomers_waiting(self, step=None):
        """At a step boundary, on every member (collective): whether processes started later wait to be let in, as
        all members agree (the smallest count of tickets any member saw). A newcomer's first call is answered
        without asking (the members asked at that boundary before letting it in). Given the step (alike on every
        member), it asks only every HOPWISE_ELASTIC_GROW_EVERY (10) steps: asking costs a store read and an
        allreduce."""
        if self._checked_this_boundary:
            self._checked_this_boundary = False
            return False
        every = int(os.environ.get("HOPWISE_ELASTIC_GROW_EVERY", "10"))
        if every < 1:
            raise ValueError(f"HOPWISE_ELASTIC_GROW_EVERY={every}: give a step count of 1 or more")
        if step is not None and step % every != 0:
            return False
        try:
            count = self.store.add(TICKETS, 0)
        except RuntimeError as e:  # a damaged count lets nobody in; the minimum says so to every member
            if not getattr(self, "_unreadable", False):
                self._unreadable = True
                print(f"hopwise WARN: elastic: the store's ticket count cannot be read; nobody is let in: {e}",
                      flush=True)
            count = self.admitted
        seen = torch.tensor([count], dtype=torch.int64)
        dist.all_reduce(seen, op=dist.ReduceOp.MIN)
        self._waiting = int(seen.item())
        if self._waiting - self.admitted > MOST_NEWCOMERS:
            if self.rank == 0 and self._waiting != getattr(self, "_refused", None):  # once per count, not per boundary
                self._refused = self._waiting
                print(f"hopwise WARN: elastic: the store's ticket count says {self._waiting - self.admitted} "
                      f"processes wait to join, more than {MOST_NEWCOMERS} at once: a damaged or hostile store, not "
                      "newcomers; none is let in", flush=True)
            return False
        return self._waiting > self.admitted

    def admit(self):
        """Then, on every member: the newcomers get ids no rank had before; rank 0 writes each its
        way in; all form the default group again, the newcomers with them. Returns the event. Call share_state()
        next (the newcomers call it too) and re-wrap DDP."""
        t0 = time.perf_counter()
        joined = list(range(self.next_id, self.next_id + self._waiting - self.admitted))
        members = self.members + joined
        self.next_id += len(joined)
        if self.rank == 0:
            for ticket, new_id in zip(range(self.admitted + 1, self._waiting + 1), joined):
                self.store.set(_ticket_key(ticket), f"{self.generation + 1} {new_id} {self._waiting} {self.next_id} "
                                                    f"{','.join(map(str, members))}")
        dist.destroy_process_group()
        self.generation += 1
        self.members = members
        self.admitted = self._waiting
        try:
            self._form()
        except RuntimeError as e:
            # A newcomer that took its ticket and died (or never came) leaves the group unformed on every member:
            # they agree on who is here, as after a lost rank, and form it again without the missing.
            if dist.is_initialized():
                dist.destroy_process_group()
            before = members[:len(members) - len(joined)]
            here = _C.elastic_agree(self.store, self.generation, self.id, self.members, self._mode(), self.timeout_s,
                                    f"generation {self.generation} (letting in {len(joined)} newcomer(s)) did not "
                                    f"form: {e}")
            self.generation += 1
            self.members = list(here)
            self._form()
            return self._note({"generation": self.generation, "left": [m for m in before if m not in here],
                               "joined": [m for m in joined if m in here],
                               "not_arrived": [m for m in joined if m not in here], "members": self.members,
                               "stood_still_s": time.perf_counter() - t0})
        return self._note({"generation": self.generation, "left": [], "joined": joined, "members": self.members,
                           "stood_still_s": time.perf_counter() - t0})

    def share_state(self, model, optimizer=None, step=0, src=0):
        """Rank `src`'s step, parameters (the model's state_dict) and optimizer state to every rank (collective);
        returns the step. After admit() on every member, and first thing on a newcomer."""
        me = dist.get_rank()
        obj = [{"step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict() if optimizer is not None else None} if me == src else None]
        dist.broadcast_object_list(obj, src=src)
        if me != src:
            model.load_state_dict(obj[0]["model"])
            if optimizer is not None:
                optimizer.load_state_dict(obj[0]["optimizer"])
        return obj[0]["step"]

    def catch_up(self, model, optimizer=None, step=0):
        """After shrink(), on every survivor: a collective can complete on some ranks and fail on others, which then
        went on a step. Where the survivors stand apart, the furthest one's step, parameters and optimizer state go
        to all (share_state()); returns the step to go on from (one all_gather where all stand together)."""
        steps = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
        dist.all_gather(steps, torch.tensor([step], dtype=torch.int64))
        steps = [int(t.item()) for t in steps]
        if min(steps) == max(steps):
            return step
        return self.share_state(model, optimizer, step, src=steps.index(max(steps)))

    def _note(self, event):
        self.events.append(event)
        if self.rank == 0:
            what = ([f"rank(s) {', '.join(map(str, event['left']))} left"] if event["left"] else []) + (
                [f"rank(s) {', '.join(map(str, event['joined']))} joined"] if event["joined"] else []) + (
                [f"newcomer(s) {', '.join(map(str, event['not_arrived']))} let in but never arrived (timed out)"]
                if event.get("not_arrived") else [])
            print(f"elastic: generation {self.generation}: {'; '.join(what)}; {len(self.members)} rank(s) go on "
                  f"({', '.join(map(str, self.members))}) after {event['stood_still_s']:.1f} s", flush=True)
        return event

    def shrink(self, why=""):
        """After a collective failed on this rank: agree with the survivors and form the default group over them
        (the old one is destroyed). Returns the event; raises RuntimeError on a rank left out."""
        t0 = time.perf_counter()
        survivors = _C.elastic_agree(self.store, self.generation, self.id, self.members, self._mode(),
                                     self.timeout_s, why)
        left = [m for m in self.members if m not in survivors]
        dist.destroy_process_group()
        self.generation += 1
        self.members = list(survivors)
        self._form()
        return self._note({"generation": self.generation, "left": left, "joined": [], "members": self.members,
                           "stood_still_s": time.perf_counter() - t0})
