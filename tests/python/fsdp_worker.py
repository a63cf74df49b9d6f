"""One rank of the hopwise.torch.fsdp check: FSDP2's reduce-scatter and all-gather through hopwise codecs.

- The collectives alone (the objects compress() installs), float32 and bfloat16, blocks of 1, 7 (prime), 1000 and
  100003 elements: against the exact reduce-scatter and all-gather (torch's, over the same group), within the codec's
  own bound; the all-gather alike on every rank; error feedback's identity over several calls (the outputs plus the
  ranks' mean residual add up to the exact means); SUM, AVG and PREMUL_SUM; a state restored from state_dict()
  continues exactly as the one it was saved from.
- FSDP2 training of a small transformer block stack with AdamW (layer sizes that no rank count divides, so shards are
  padded), float32 and bfloat16 mixed precision: compressed (grads int8:ef=1 or int4:ef=1, params int8) against
  uncompressed, the losses within a few percent after the same batches, the payloads on the wire.
- Refusals by name: no FSDP2 module, a parameters codec that drops elements or carries error feedback, network:,
  a bad spec, a module sharded over gloo.

Run under torchrun or mpirun; prints "rank R: fsdp ok: N checks" or raises naming the case."""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import hopwise.torch
from checks import Checks
from hopwise.torch import fsdp

BLOCKS = [1, 7, 1000, 100003]



def data(rank, n, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + n)
    return torch.randn(n, generator=g).to(dtype)


def everyone(t):
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return out


def codec_step(spec):
    """One rank's largest error per unit of its block's largest |x|: what one encode may lose."""
    name = spec.split(":")[0]
    return {"int8": 1 / 254, "int4": 1 / 14, "fp16": 2.0 ** -11, "bf16": 2.0 ** -8, "none": 0.0}[name]


def check_reduce_scatter(c, rank, p, spec, dtype):
    group = dist.group.WORLD
    for n in BLOCKS:
        state = hopwise.torch._C.ShardedCodecState(spec, rank, p, fsdp.DEFAULT_SEED)  # one state per buffer
        comm = fsdp.CompressedReduceScatter(state, "check")
        x = data(rank, n * p, 1, dtype)
        out = comm.allocate((n,), dtype=dtype, device=torch.device("cpu"))
        comm(out, x, group, dist.ReduceOp.AVG)
        exact = torch.empty(n, dtype=torch.float32)
        dist.reduce_scatter_tensor(exact, x.float(), op=dist.ReduceOp.SUM)
        exact /= p
        scale = max(float(y.float().abs().max()) for y in everyone(x))
        tol = scale * codec_step(spec) * 1.001 + 1e-6 * scale * p  # + the float sums' order
        if dtype == torch.bfloat16:
            tol += exact.abs() * 2.0 ** -8 + scale * 2.0 ** -8
        c.true(bool(((out.float() - exact).abs() <= tol).all()), f"reduce_scatter {spec} {dtype} block {n}: "
               f"error {float((out.float() - exact).abs().max())} past the codec's bound")
    # SUM and PREMUL_SUM (FSDP2's divide factor) agree with AVG scaled.
    n = 13
    x = data(rank, n * p, 2)
    outs = {}
    for name, op in (("avg", dist.ReduceOp.AVG), ("sum", dist.ReduceOp.SUM),
                     ("premul", dist._make_nccl_premul_sum(0.25))):
        s = hopwise.torch._C.ShardedCodecState("fp16", rank, p, 5)
        outs[name] = torch.empty(n)
        fsdp.CompressedReduceScatter(s, "op")(outs[name], x, group, op)
    c.true(torch.allclose(outs["sum"] / p, outs["avg"], atol=1e-6), "reduce_scatter: SUM / p != AVG")
    c.true(torch.allclose(outs["sum"] * 0.25, outs["premul"], atol=1e-6), "reduce_scatter: PREMUL_SUM(0.25)")


def check_error_feedback(c, rank, p, spec):
    """sum over calls of the outputs + mean over ranks of the residuals of this block = sum of the exact means."""
    n, calls = 1031, 6
    state = hopwise.torch._C.ShardedCodecState(spec, rank, p, fsdp.DEFAULT_SEED)
    comm = fsdp.CompressedReduceScatter(state, "ef")
    total, exact_total = torch.zeros(n), torch.zeros(n)
    saved = None
    for k in range(calls):
        x = data(rank, n * p, 10 + k)
        out = torch.empty(n)
        if k == calls - 1:  # the last call twice: straight, and from a state restored from the saved one
            saved = {"step": state.step, "numel": state.numel, "residuals": state.residuals()}
        comm(out, x, dist.group.WORLD, dist.ReduceOp.AVG)
        last = out.clone()
        total += out
        exact = torch.empty(n)
        dist.reduce_scatter_tensor(exact, x, op=dist.ReduceOp.SUM)
        exact_total += exact / p
    residual = state.residuals()[rank]
    mine = [r if r is not None else torch.zeros(n) for r in state.residuals()]
    # Every rank's residual for this rank's block, summed over ranks: reduce-scatter the residuals exactly.
    res = torch.empty(n)
    dist.reduce_scatter_tensor(res, torch.cat(mine), op=dist.ReduceOp.SUM)
    c.true(residual is not None, f"{spec}: no residual kept")
    gap = (total + res / p - exact_total).abs().max()
    c.true(float(gap) < 1e-4, f"{spec}: error feedback identity off by {float(gap)}")
    again = hopwise.torch._C.ShardedCodecState(spec, rank, p, fsdp.DEFAULT_SEED)
    again.set(saved["step"], saved["numel"], saved["residuals"])
    a = torch.empty(n)
    fsdp.CompressedReduceScatter(again, "ef")(a, data(rank, n * p, 10 + calls - 1), dist.group.WORLD,
                                              dist.ReduceOp.AVG)
    c.true(torch.equal(a, last), f"{spec}: a restored state does not continue as the saved one did")


def check_all_gather(c, rank, p, spec, dtype):
    for n in BLOCKS:
        state = hopwise.torch._C.ShardedCodecState(spec, rank, p, fsdp.DEFAULT_SEED)
        comm = fsdp.CompressedAllGather(state, "check")
        out = comm.allocate((n * p,), dtype=dtype, device=torch.device("cpu"))
        mine = out.narrow(0, n * rank, n)  # FSDP2 gathers from its own block of the output
        mine.copy_(data(rank, n, 3, dtype))
        exact = torch.empty(n * p, dtype=dtype)
        dist.all_gather_into_tensor(exact, mine.clone())
        work = comm(out, mine, dist.group.WORLD, async_op=True)
        work.wait()
        tol = exact.float().abs().max() * codec_step(spec) * 1.001 + 1e-6
        if dtype == torch.bfloat16:
            tol = tol + exact.float().abs().max() * 2.0 ** -8
        err = float((out.float() - exact.float()).abs().max())
        c.true(err <= float(tol), f"all_gather {spec} {dtype} n={n}: error {err} past the codec's bound")
        c.true(all(torch.equal(o, out) for o in everyone(out)), f"all_gather {spec} n={n}: ranks differ")


def check_staged(c, rank, p):
    """The host-staged path a GPU's buffers take, run on CPU buffers: the same bits as the direct call, both
    directions, float32 and bfloat16, residuals carried over calls."""
    for spec, dtype in (("int8:ef=1", torch.float32), ("int4:ef=1", torch.bfloat16), ("fp16", torch.float32)):
        n = 1009
        states = [hopwise.torch._C.ShardedCodecState(spec, rank, p, fsdp.DEFAULT_SEED) for _ in range(2)]
        gathers = [hopwise.torch._C.ShardedCodecState("int8", rank, p, fsdp.DEFAULT_SEED) for _ in range(2)]
        for call in range(3):
            x = data(rank, n * p, 40 + call, dtype)
            outs, gathered = [], []
            for staged in (False, True):
                fsdp._STAGE_ALWAYS = staged
                try:
                    out = torch.empty(n, dtype=dtype)
                    fsdp.CompressedReduceScatter(states[staged], "staged")(out, x, dist.group.WORLD,
                                                                         dist.ReduceOp.AVG)
                    full = torch.empty(n * p, dtype=dtype)
                    work = fsdp.CompressedAllGather(gathers[staged], "staged")(full, out, dist.group.WORLD,
                                                                              async_op=True)
                    work.wait()
                finally:
                    fsdp._STAGE_ALWAYS = False
                outs.append(out)
                gathered.append(full)
            c.true(torch.equal(outs[0], outs[1]), f"staged reduce_scatter {spec} {dtype} call {call}: other bits")
            c.true(torch.equal(gathered[0], gathered[1]), f"staged all_gather {dtype} call {call}: other bits")


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, h)
        self.down = nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, vocab=37, d=29, h=61, depth=3):  # sizes no rank count divides: padded shards
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(depth))
        self.head = nn.Linear(d, vocab)

    def forward(self, t):
        x = self.emb(t)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def train(rank, p, grads, params, mp=None, steps=30, compress=True):
    torch.manual_seed(0)
    model = Net()
    policy = MixedPrecisionPolicy(param_dtype=mp, reduce_dtype=mp) if mp else MixedPrecisionPolicy()
    for b in model.blocks:
        fully_shard(b, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    comp = fsdp.compress(model, grads=grads, params=params) if compress else None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    before = hopwise.torch.stats()["wire_bytes"]
    for _ in range(steps):
        start = torch.randint(0, 37, (8, 1), generator=g)  # a sequence the model can learn: t' = 5t + 3 mod 37
        t = (start * torch.pow(5, torch.arange(16)) + 3 * (torch.pow(5, torch.arange(16)) - 1) // 4) % 37
        loss = nn.functional.cross_entropy(model(t[:, :-1]).reshape(-1, 37).float(), t[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(float(mean) / p)
    return losses, hopwise.torch.stats()["wire_bytes"] - before, comp


def check_training(c, rank, p):
    for mp in (None, torch.bfloat16):
        plain, plain_bytes, _ = train(rank, p, None, None, mp, compress=False)
        c.true(plain_bytes == 0, "uncompressed FSDP2 sent compressed payloads")
        for grads, params in (("int8:ef=1", "int8"), ("int4:ef=1", None), (None, "int8")):
            losses, wire, comp = train(rank, p, grads, params, mp)
            tail = sum(losses[-5:]) / 5
            ref = sum(plain[-5:]) / 5
            what = f"FSDP2 {grads}/{params} {mp or 'fp32'}"
            c.true(wire > 0, f"{what}: no compressed payload on the wire")
            c.true(losses[-1] < losses[0] * 0.9, f"{what}: did not learn ({losses[0]} -> {losses[-1]})")
            # Near convergence (a loss of 0.2 from 3.6) a relative gap says little: within 3% of the way down.
            c.true(abs(tail - ref) < 0.03 * plain[0], f"{what}: loss {tail} against uncompressed {ref}")
            sd = comp.state_dict()
            c.true(set(sd["grad_states"] or sd["param_states"]) == set(comp.modules) and len(comp.modules) == 4,
                   f"{what}: states of {comp.modules}")
            if grads:
                c.true(any(r is not None for s in sd["grad_states"].values() for r in s["residuals"]),
                       f"{what}: no residual in the state_dict")
            comp.load_state_dict(sd)
            if rank == 0:
                print(f"{what}: loss {tail:.4f}, uncompressed {ref:.4f}, {wire / 30 / 1e3:.1f} kB a step", flush=True)


def refused(c, what, fn, *needles):
    try:
        fn()
    except ValueError as e:
        c.true(all(s in str(e) for s in needles), f"{what}: the error does not name {needles}: {e}")
        return
    raise AssertionError(f"{what}: not refused")


def check_refusals(c, p):
    refused(c, "no FSDP2 module", lambda: fsdp.compress(nn.Linear(3, 3)), "fully_shard")
    m = Net()
    fully_shard(m)
    refused(c, "topk params", lambda: fsdp.compress(m, params="topk:ratio=0.1"), "params='topk", "int8")
    refused(c, "ef params", lambda: fsdp.compress(m, params="int8:ef=1"), "ef=1")
    refused(c, "network:", lambda: fsdp.compress(m, grads="network:int8"), "network")
    refused(c, "bad spec", lambda: fsdp.compress(m, grads="int9"), "grads='int9'")
    gloo = dist.new_group(backend="gloo")
    g = Net()
    fully_shard(g, mesh=DeviceMesh.from_group(gloo, "cpu"))
    refused(c, "gloo group", lambda: fsdp.compress(g), "'gloo'", "init_process_group('hopwise')")


def main():
    dist.init_process_group("hopwise")
    rank, p = dist.get_rank(), dist.get_world_size()
    init_device_mesh("cpu", (p,))
    c = Checks()
    for dtype in (torch.float32, torch.bfloat16):
        for spec in ("none", "fp16", "int8", "int4"):
            check_reduce_scatter(c, rank, p, spec, dtype)
            check_all_gather(c, rank, p, spec, dtype)
    for spec in ("int8:ef=1", "int4:ef=1", "topk:ratio=0.1,ef=1"):
        check_error_feedback(c, rank, p, spec)
    check_staged(c, rank, p)
    check_training(c, rank, p)
    check_refusals(c, p)
    print(f"rank {rank}: fsdp ok: {c.count} checks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
