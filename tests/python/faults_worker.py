"""One rank of the backend's failure and API checks (tests/python/test_torch_backend.py runs it).

  stopped   rank 1 stops itself (SIGSTOP) before an all_reduce: the others fail within HOPWISE_TIMEOUT_S naming it
  mismatch  rank 0 all-reduces 10 elements, the others 12: checked by default (and by HOPWISE_DEBUG=CHECK), every rank says so
  bad       unsupported dtypes, ops and arguments: a ValueError naming what was wrong, and the group still works
  api       plan() and stats() of a hopwise group; plan() of a gloo group is refused by name
  barrier   ranks 2 and 3 of 4 never come: barrier(timeout=) and monitored_barrier (first missing rank, and with
            wait_all_ranks every one) fail within the timeout, naming them; rank 0's monitored_barrier(timeout=0)
            fails at once; then the group is destroyed
"""
from datetime import timedelta
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import hopwise.torch


def env_rank_and_size():
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])


def say(text):
    sys.stdout.write(f"rank {dist.get_rank()}: {text}\n")  # one write: the ranks share the pipe
    sys.stdout.flush()


def expect_error(kind, pattern, fn):
    try:
        fn()
    except kind as e:
        text = str(e).split("\n")[0]
        assert pattern in text, f"the error says {text!r}, not {pattern!r}"
        say(f"{kind.__name__}: {text}")
        return
    raise AssertionError(f"no {kind.__name__} ({pattern!r})")


def all_reduce_that_fails(t):
    """The call every surviving rank must see fail: says how long it took and why, then exits 1."""
    start = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        say(f"FAILED after {time.monotonic() - start:.1f} s: {str(e).splitlines()[0]}")
        sys.exit(1)
    say("ok (no failure?)")


def stopped():
    t = torch.ones(1000)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    all_reduce_that_fails(t)


def mismatch():
    all_reduce_that_fails(torch.ones(10 if dist.get_rank() == 0 else 12))


def bad():
    expect_error(ValueError, "dtype UInt16 is not supported", lambda: dist.all_reduce(torch.ones(3, dtype=torch.uint16)))
    expect_error(ValueError, "AVG of Int would truncate", lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG))
    expect_error(ValueError, "BXOR needs an integer or bool tensor",
                 lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR))
    expect_error(ValueError, "tag 9000 is out of range", lambda: dist.send(torch.ones(1), (dist.get_rank() + 1) % dist.get_world_size(), tag=9000))
    expect_error(ValueError, "needs one list of", lambda: dist.all_gather([torch.ones(1)], torch.ones(1)) if dist.get_world_size() > 1 else dist.all_gather([], torch.ones(1)))
    expect_error(ValueError, "unknown codec 'gzip'", lambda: hopwise.torch.compression_hook("gzip"))
    t = torch.full((4,), 1.0)
    dist.all_reduce(t)  # the group still works after refused calls
    assert t.tolist() == [float(dist.get_world_size())] * 4, t
    say("bad input refused, group still works")


def api():
    p = hopwise.torch.plan()
    size = dist.get_world_size()
    assert sorted(p["ring"]) == list(range(size)), p["ring"]
    assert p["transport"] in ("ucx", "mpi"), p["transport"]
    assert p["size"] == size and p["rank"] == dist.get_rank()
    assert set(p["allreduce_algorithm"]) == {4096 * 4 ** i for i in range(8)}, p["allreduce_algorithm"]
    if size > 1 and "ring_edges" in p:
        assert len(p["ring_edges"]) == size and p["bottleneck_gbps"] > 0, p
    before = hopwise.torch.stats()["calls"]
    dist.all_reduce(torch.ones(100))
    assert hopwise.torch.stats()["calls"] == before + 1, hopwise.torch.stats()
    gloo = dist.new_group(backend="gloo")
    expect_error(ValueError, "is 'gloo', not hopwise", lambda: hopwise.torch.plan(gloo))
    say(f"api ok: ring {p['ring']}, transport {p['transport']}, bottleneck {p.get('bottleneck_gbps')} GB/s")


def barrier():
    done = os.environ["BARRIER_DONE"]  # a file the test's scratch directory holds
    if dist.get_rank() >= 2:
        # Alive, just not at the barrier, until the others are done (or 60 s).
        deadline = time.monotonic() + 60
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.2)
        say("stayed away")
        os._exit(0)

    def failing(what, fn):
        start = time.monotonic()
        try:
            fn()
        except RuntimeError as e:
            say(f"{what} FAILED after {time.monotonic() - start:.1f} s: {str(e).splitlines()[0]}")
            return
        raise AssertionError(f"{what} passed without ranks 2 and 3")

    two = timedelta(seconds=2)
    failing("barrier", lambda: dist.barrier(timeout=two))
    failing("monitored_barrier", lambda: dist.monitored_barrier(timeout=two))
    failing("monitored_barrier(wait_all_ranks)", lambda: dist.monitored_barrier(timeout=two, wait_all_ranks=True))
    if dist.get_rank() == 0:  # the last barrier: rank 0 alone, its count of barriers now ahead of rank 1's
        failing("monitored_barrier(timeout=0)", lambda: dist.monitored_barrier(timeout=timedelta(0)))
    start, rank = time.monotonic(), dist.get_rank()
    dist.destroy_process_group()
    sys.stdout.write(f"rank {rank}: destroyed the group in {time.monotonic() - start:.1f} s\n")
    sys.stdout.flush()
    if rank == 1:  # the last to report (rank 0 answers first): the absent ranks may go
        open(done, "w").close()
    os._exit(0)


def main():
    env_rank_and_size()
    dist.init_process_group("hopwise")
    {"stopped": stopped, "mismatch": mismatch, "bad": bad, "api": api, "barrier": barrier}[sys.argv[1]]()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
