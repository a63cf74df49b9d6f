"""One rank of the collectives check: every collective of the hopwise backend, every dtype it claims and every
reduce op, on awkward sizes, against a reference computed here from every rank's (reproducible) input.

Run under torchrun, mpirun or tests/spawn_ranks.sh; prints "rank R: N checks ok" or raises naming the case."""
import math
import os
import sys
import warnings

import torch
import torch.distributed as dist

import hopwise.torch  # noqa: F401  (registers "hopwise")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool]
SIZES = [0, 1, 3, 7, 1000, 65537]
OPS = {"SUM": dist.ReduceOp.SUM, "PRODUCT": dist.ReduceOp.PRODUCT, "MIN": dist.ReduceOp.MIN,
       "MAX": dist.ReduceOp.MAX, "AVG": dist.ReduceOp.AVG, "BAND": dist.ReduceOp.BAND, "BOR": dist.ReduceOp.BOR,
       "BXOR": dist.ReduceOp.BXOR}


def data(rank, n, dtype, seed):
    """Rank `rank`'s input: small values, so that products and sums stay exact in every dtype."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        return (torch.randint(-3, 4, (n,), generator=g).to(torch.float64) / 2).to(dtype)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


def reference(inputs, op, dtype):
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        if op in ("SUM", "MAX", "BOR"):
            return stack.any(0)
        if op in ("PRODUCT", "MIN", "BAND"):
            return stack.all(0)
        return (stack.to(torch.int64).sum(0) % 2).bool()
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([t.to(wide) for t in inputs])
    if op == "SUM":
        out = stack.sum(0)
    elif op == "PRODUCT":
        out = stack.prod(0)
    elif op == "MIN":
        out = stack.min(0).values if stack.numel() else stack.sum(0)
    elif op == "MAX":
        out = stack.max(0).values if stack.numel() else stack.sum(0)
    elif op == "AVG":
        out = stack.mean(0)
    else:
        out = inputs[0].clone()
        for t in inputs[1:]:
            out = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[op](out, t)
        return out
    return out.to(dtype)  # integers wrap as they would in the narrow type


def valid(op, dtype):
    if op in ("BAND", "BOR", "BXOR"):
        return not dtype.is_floating_point
    if op == "AVG":
        return dtype.is_floating_point
    return True


def close(a, b, dtype):
    if a.shape != b.shape:
        return False
    if dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-2, atol=1e-2)
    if dtype.is_floating_point:
        return torch.allclose(a.to(torch.float64), b.to(torch.float64), rtol=1e-6, atol=1e-6)
    return torch.equal(a, b)


class Checker:
    def __init__(self, rank, size):
        self.rank, self.size, self.count, self.seed = rank, size, 0, 0

    def inputs(self, n, dtype):
        self.seed += 1
        return [data(r, n, dtype, self.seed) for r in range(self.size)]

    def expect(self, got, want, dtype, what):
        self.count += 1
        if os.environ.get("HOPWISE_TEST_VERBOSE"):
            print(f"rank {self.rank}: {what} {dtype}", flush=True)
        if not close(got, want, dtype):
            raise AssertionError(f"rank {self.rank}: {what} (dtype {dtype}): got {got.flatten()[:8].tolist()}, "
                                 f"want {want.flatten()[:8].tolist()}")


def coalesced_and_sparse(c, rank, size):
    """What torch 2.x hands a backend in one call: coalesced gathers and reduce-scatters (FSDP, _coalescing_manager),
    batch_isend_irecv (a coalescing group of point-to-point calls), and sparse COO tensors (embedding gradients)."""
    shapes = [(3,), (0,), (2, 5), (17,)]
    dtypes = [torch.float32, torch.int64, torch.bfloat16, torch.bool]
    mine = [data(rank, math.prod(s), dt, 40 + i).view(s) for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    every = [[data(r, math.prod(s), dt, 40 + i).view(s) for r in range(size)] for i, (s, dt) in enumerate(zip(shapes, dtypes))]
    # torch's layout: output_tensor_lists[r][i] receives rank r's input i (one list per rank, as torch's own
    # test_all_gather_coalesced_* build them); mixed shapes, empty tensors among them, complex too.
    for dt in dtypes + [torch.complex64]:
        ins = [data(rank, math.prod(s), dt, 50 + i).view(s) for i, s in enumerate(shapes)]
        outs = [[torch.full(s, -1).to(dt) for s in shapes] for _ in range(size)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # all_gather_coalesced is deprecated in torch, yet still torch's API
            dist.all_gather_coalesced(outs, ins)
        for i, s in enumerate(shapes):
            for r in range(size):
                c.expect(outs[r][i], data(r, math.prod(s), dt, 50 + i).view(s), dt, f"all_gather_coalesced {i} from {r}")
    outs = [[-torch.ones(2, 2), -torch.ones(0), -torch.ones(3, 3)] for _ in range(size)]  # torch's with_empty
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist.all_gather_coalesced(outs, [rank * torch.ones(2, 2), torch.ones(0), (rank + 1) * torch.ones(3, 3)])
    for r in range(size):
        for got, want in zip(outs[r], [r * torch.ones(2, 2), torch.ones(0), (r + 1) * torch.ones(3, 3)]):
            c.expect(got, want, torch.float32, f"all_gather_coalesced with empty tensors from {r}")
    # The coalescing manager's fast paths: one backend call for all the tensors inside.
    flats = [torch.empty(size * t.numel(), dtype=t.dtype) for t in mine]
    with dist._coalescing_manager(async_ops=True) as cm:
        for f, t in zip(flats, mine):
            dist.all_gather_into_tensor(f, t.reshape(-1))
    cm.wait()
    for i, dt in enumerate(dtypes):
        c.expect(flats[i], torch.cat([e.reshape(-1) for e in every[i]]), dt, f"all_gather_into_tensor coalesced {i}")
    lengths = [5, 0, 1, 33]
    for name, op in (("SUM", dist.ReduceOp.SUM), ("MAX", dist.ReduceOp.MAX), ("AVG", dist.ReduceOp.AVG)):
        full = [[data(r, n * size, torch.float64, 60 + n) for n in lengths] for r in range(size)]
        got = [torch.empty(n, dtype=torch.float64) for n in lengths]
        with dist._coalescing_manager(async_ops=True) as cm:
            for g, f in zip(got, full[rank]):
                dist.reduce_scatter_tensor(g, f.clone(), op=op)
        cm.wait()
        for i, n in enumerate(lengths):
            want = reference([full[r][i][rank * n:(rank + 1) * n] for r in range(size)], name, torch.float64)
            c.expect(got[i], want, torch.float64, f"reduce_scatter_tensor coalesced {name} {i}")
        ts = [full[rank][i].clone() for i in range(len(lengths))]
        with dist._coalescing_manager(async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, op=op)
        cm.wait()
        for i in range(len(lengths)):
            c.expect(ts[i], reference([full[r][i] for r in range(size)], name, torch.float64), torch.float64,
                     f"all_reduce coalesced {name} {i}")
    if size > 1:
        nxt, prv = (rank + 1) % size, (rank - 1) % size
        got = [torch.empty(7), torch.empty(0, dtype=torch.int32)]
        ops = [dist.P2POp(dist.isend, data(rank, 7, torch.float32, 80), nxt),
               dist.P2POp(dist.irecv, got[0], prv),
               dist.P2POp(dist.isend, data(rank, 0, torch.int32, 81), nxt),
               dist.P2POp(dist.irecv, got[1], prv)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        c.expect(got[0], data(prv, 7, torch.float32, 80), torch.float32, "batch_isend_irecv")
    # Complex: sums and averages as pairs of reals, contiguous or strided.
    for dtype, op, name in ((torch.complex64, dist.ReduceOp.SUM, "SUM"), (torch.complex128, dist.ReduceOp.AVG, "AVG")):
        parts = [torch.complex(data(r, 13, torch.float64, 70), data(r, 13, torch.float64, 71)).to(dtype) for r in range(size)]
        want = torch.stack(parts).sum(0) / (size if name == "AVG" else 1)
        t = parts[rank].clone()
        dist.all_reduce(t, op=op)
        c.expect(torch.view_as_real(t), torch.view_as_real(want), torch.float64, f"all_reduce {name} {dtype}")
        big = torch.zeros(26, dtype=dtype)
        big[::2] = parts[rank]
        view = big[::2]
        dist.all_reduce(view, op=op)
        c.expect(torch.view_as_real(big[::2]), torch.view_as_real(want), torch.float64, f"all_reduce {name} {dtype} strided")
    # Sparse: each rank's own entries (some shared with others, some not, none at all on rank 1), 2-d values.
    for name, op, dtype in (("SUM", dist.ReduceOp.SUM, torch.float32), ("AVG", dist.ReduceOp.AVG, torch.float64),
                            ("SUM", dist.ReduceOp.SUM, torch.int64)):
        def sparse(r):
            g = torch.Generator().manual_seed(900 + r)
            nnz = 0 if r == 1 else 3 + r
            idx = torch.randint(0, 10, (1, nnz), generator=g)
            val = torch.randint(-3, 4, (nnz, 4), generator=g).to(dtype)
            return torch.sparse_coo_tensor(idx, val, (10, 4), check_invariants=True)
        t = sparse(rank)
        dist.all_reduce(t, op=op)
        dense = [sparse(r).to_dense() for r in range(size)]
        want = reference(dense, name, dtype)
        assert t.is_sparse, f"rank {rank}: sparse all_reduce returned a {t.layout} tensor"
        c.expect(t.to_dense(), want, dtype, f"sparse all_reduce {name} {dtype}")


def main():
    # Under mpirun nothing is exported for torch: importing hopwise.torch finds the rank and world size, and without
    # MASTER_ADDR/MASTER_PORT the store is met over MPI (test_collectives' "mpirun-bare").
    if len(sys.argv) > 2 and sys.argv[1] == "explicit":  # init_process_group's arguments over a half-set environment
        dist.init_process_group("hopwise", rank=int(sys.argv[2]), world_size=int(sys.argv[3]))
    else:
        dist.init_process_group("hopwise")
    rank, size = dist.get_rank(), dist.get_world_size()
    c = Checker(rank, size)
    for dtype in DTYPES:
        for n in SIZES:
            for name, op in OPS.items():
                if not valid(name, dtype) or (name == "PRODUCT" and n > 1000):
                    continue
                ins = c.inputs(n, dtype)
                want = reference(ins, name, dtype)
                t = ins[rank].clone()
                dist.all_reduce(t, op=op)
                c.expect(t, want, dtype, f"all_reduce {name} n={n}")
                # Non-contiguous: every other element of a tensor twice as long.
                if n and n <= 1000:
                    big = torch.zeros(2 * n, dtype=dtype)
                    big[::2] = ins[rank]
                    view = big[::2]
                    dist.all_reduce(view, op=op)
                    c.expect(big[::2], want, dtype, f"all_reduce {name} n={n} strided")
                    c.expect(big[1::2], torch.zeros(n, dtype=dtype), dtype, f"all_reduce {name} strided, untouched")
                for root in sorted({0, size - 1}):
                    t = ins[rank].clone()
                    dist.reduce(t, root, op=op)
                    c.expect(t, want if rank == root else ins[rank], dtype, f"reduce {name} root={root} n={n}")
                if name in ("SUM", "MAX", "BXOR") and n % 1 == 0:
                    full = [torch.cat([data(r, n, dtype, c.seed * 7 + q) for q in range(size)]) for r in range(size)]
                    parts = [list(f.split(n)) if n else [f[:0] for _ in range(size)] for f in full]
                    mine = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter(mine, parts[rank], op=op)
                    c.expect(mine, reference([parts[r][rank] for r in range(size)], name, dtype), dtype,
                             f"reduce_scatter {name} n={n}")
                    out = torch.empty(n, dtype=dtype)
                    dist.reduce_scatter_tensor(out, full[rank].clone(), op=op)
                    c.expect(out, reference([parts[r][rank] for r in range(size)], name, dtype), dtype,
                             f"reduce_scatter_tensor {name} n={n}")
        for n in SIZES:
            ins = c.inputs(n, dtype)
            for root in sorted({0, size - 1}):
                t = ins[rank].clone()
                dist.broadcast(t, root)
                c.expect(t, ins[root], dtype, f"broadcast root={root} n={n}")
            outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
            dist.all_gather(outs, ins[rank])
            for r in range(size):
                c.expect(outs[r], ins[r], dtype, f"all_gather n={n} from {r}")
            flat = torch.empty(n * size, dtype=dtype)
            dist.all_gather_into_tensor(flat, ins[rank])
            c.expect(flat, torch.cat(ins), dtype, f"all_gather_into_tensor n={n}")
            root = size - 1
            gathered = [torch.empty(n, dtype=dtype) for _ in range(size)] if rank == root else None
            dist.gather(ins[rank], gathered, dst=root)
            if rank == root:
                for r in range(size):
                    c.expect(gathered[r], ins[r], dtype, f"gather n={n} from {r}")
            mine = torch.empty(n, dtype=dtype)
            dist.scatter(mine, [data(r, n, dtype, c.seed + 99) for r in range(size)] if rank == 0 else None, src=0)
            c.expect(mine, data(rank, n, dtype, c.seed + 99), dtype, f"scatter n={n}")
            # alltoall: rank r sends rank q the part of rank r's input meant for q, (r + q) % 3 rows long.
            rows = [(r_ + q) % 3 for r_ in range(size) for q in range(size)]
            def part(src, dst):
                return data(src * size + dst, rows[src * size + dst] * 2, dtype, c.seed).view(-1, 2)
            inp = torch.cat([part(rank, q) for q in range(size)])
            out = torch.empty(sum(rows[r_ * size + rank] for r_ in range(size)), 2, dtype=dtype)
            dist.all_to_all_single(out, inp, [rows[r_ * size + rank] for r_ in range(size)],
                                   [rows[rank * size + q] for q in range(size)])
            c.expect(out, torch.cat([part(r_, rank) for r_ in range(size)]), dtype, "all_to_all_single")
            outs = [torch.empty(n, dtype=dtype) for _ in range(size)]
            dist.all_to_all(outs, [data(rank * size + q, n, dtype, c.seed) for q in range(size)])
            for r in range(size):
                c.expect(outs[r], data(r * size + rank, n, dtype, c.seed), dtype, f"all_to_all n={n} from {r}")
            if size > 1:
                # A ring of send/recv, then any-source receives at rank 0.
                nxt, prv = (rank + 1) % size, (rank - 1) % size
                got = torch.empty(n, dtype=dtype)
                reqs = [dist.isend(ins[rank], nxt, tag=5), dist.irecv(got, prv, tag=5)]
                for w in reqs:
                    w.wait()
                c.expect(got, ins[prv], dtype, f"send/recv n={n}")
                if rank == 0:
                    seen = {}
                    for _ in range(size - 1):
                        t = torch.empty(n, dtype=dtype)
                        src = dist.recv(t, tag=7)
                        seen[src] = t
                    assert sorted(seen) == list(range(1, size)), f"recv from any source got ranks {sorted(seen)}"
                    for r, t in seen.items():
                        c.expect(t, ins[r], dtype, f"recv any source n={n} from {r}")
                else:
                    dist.send(ins[rank], 0, tag=7)
    # Coalesced, mixed shapes.
    ts = [data(rank, n, torch.float32, 5 + n) for n in (3, 0, 17)]
    wants = [reference([data(r, n, torch.float32, 5 + n) for r in range(size)], "SUM", torch.float32) for n in (3, 0, 17)]
    dist.all_reduce_coalesced(ts)
    for t, w in zip(ts, wants):
        c.expect(t, w, torch.float32, "all_reduce_coalesced")
    coalesced_and_sparse(c, rank, size)
    # Async: several in flight, waited on out of order; futures carry the result.
    works, tensors = [], []
    for i in range(6):
        t = torch.full((1000 + i,), float(rank + i))
        tensors.append(t)
        works.append(dist.all_reduce(t, async_op=True))
    fut = works[-1].get_future()
    for w in reversed(works):
        w.wait()
    c.expect(fut.value()[0], torch.full((1005,), float(sum(r + 5 for r in range(size)))), torch.float32, "future value")
    for i, t in enumerate(tensors):
        c.expect(t, torch.full((1000 + i,), float(sum(r + i for r in range(size)))), torch.float32, f"async {i}")
    # Subgroups: the even ranks, and every rank but 0 (a group rank 0 is not in).
    for members in ([r for r in range(size) if r % 2 == 0], list(range(1, size)) or [0]):
        g = dist.new_group(members, backend="hopwise")
        if rank in members:
            t = torch.full((5,), float(rank))
            dist.all_reduce(t, group=g)
            c.expect(t, torch.full((5,), float(sum(members))), torch.float32, f"all_reduce in group {members}")
            t = torch.full((3,), float(rank))
            dist.broadcast(t, members[-1], group=g)
            c.expect(t, torch.full((3,), float(members[-1])), torch.float32, f"broadcast in group {members}")
    dist.barrier()
    print(f"rank {rank}: {c.count} checks ok over {hopwise.torch.plan()['transport']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
