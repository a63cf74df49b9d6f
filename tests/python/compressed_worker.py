"""One rank of the hopwise.torch.allreduce check: a compressed allreduce of plain tensors, every codec family on
awkward sizes, against a reference computed here from every rank's (reproducible) input: the exact mean for the
lossless codecs, each lossy codec's documented bound, the error-feedback identity over 20 calls (what the outputs
add up to plus the ranks' mean residual is what the true means add up to), the CodecState's checkpoint, reset and
refusals, async calls ordered with plain ones, and the bad arguments refused by name.

Run under torchrun or mpirun; prints "rank R: compressed allreduce ok: N checks" or raises naming the case."""
import io
import math
import sys

import torch
import torch.distributed as dist

import hopwise.torch
from checks import Checks

SIZES = [0, 1, 7, 1000, 1000003]
CODECS = ["none", "network:int8", "fp16", "bf16", "int8", "int8:ef=1", "topk:ratio=0.1,ef=0", "topk:ratio=0.1,ef=1"]
CALLS = 20



def data(rank, n, seed):
    g = torch.Generator().manual_seed(seed * 7919 + rank * 104729 + n)
    return torch.randn(n, generator=g)


def same_on_every_rank(t, what, c):
    """Every rank holds the same result, bit for bit (the payloads decode alike everywhere)."""
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    c.true(all(torch.equal(e, t) for e in everyone), f"{what}: the ranks' results differ")


def bound(spec, inputs, p):
    """How far the average may be from the exact mean, elementwise (a tensor), for one call of `spec`."""
    scale = max((float(x.abs().max()) for x in inputs if x.numel()), default=0.0)
    if spec in ("none", "network:int8"):  # one host: the network stage compresses nothing
        return torch.full_like(inputs[0], 1e-6 * max(scale, 1.0))
    if spec == "fp16":  # each value rounded to half, the payloads summed in half
        return torch.full_like(inputs[0], p * 2.0 ** -10 * scale + 1e-7)
    if spec == "bf16":
        return torch.full_like(inputs[0], p * 2.0 ** -7 * scale + 1e-7)
    if spec.startswith("int8"):  # round=nearest: <= s / (2q) for the average, q = floor(127 / p), s the block max
        return torch.full_like(inputs[0], scale / (2 * (127 // p)) * 1.0001 + 1e-7)
    if spec.startswith("topk"):  # what the ranks left out: at most the mean of their magnitudes
        return sum(x.abs() for x in inputs) / p * 1.0001 + 1e-7
    raise ValueError(spec)


def one_call(spec, n, rank, p, c):
    inputs = [data(r, n, 1) for r in range(p)]
    mean = sum(inputs) / p if n else torch.zeros(0)
    t = inputs[rank].clone()
    state = hopwise.torch.CodecState(spec)
    hopwise.torch.allreduce(t, spec, state=state)
    what = f"{spec}, {n} elements"
    err = (t - mean).abs()
    c.true(bool((err <= bound(spec, inputs, p)).all()), f"{what}: off the mean by {float(err.max()) if n else 0}")
    if spec.startswith("topk") and n:
        kept = math.ceil(0.1 * n)
        c.true(int((t != 0).sum()) <= p * kept, f"{what}: {int((t != 0).sum())} nonzeros, more than {p} x {kept}")
    same_on_every_rank(t, what, c)
    c.true(state.step == (1 if n and spec != "network:int8" else state.step) and state.numel == n,
           f"{what}: step {state.step}, numel {state.numel}")
    ef = "ef=1" in state.codec  # canonical: topk, sign, randomk default to ef=1
    c.true((state.residual is not None) == (ef and n > 0), f"{what}: residual {state.residual}")
    if ef and n:
        c.true(state.residual.shape == (n,) and state.residual.dtype == torch.float32, f"{what}: residual's shape")


def error_feedback(spec, n, rank, p, c):
    """20 calls with one state: the outputs add up to the true means' sum, less the ranks' mean residual."""
    state = hopwise.torch.CodecState(spec)
    plain = hopwise.torch.CodecState(spec.replace("ef=1", "ef=0"))
    out_sum, plain_sum, true_sum = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64), 0
    largest = 0.0
    for call in range(CALLS):
        inputs = [data(r, n, 100 + call) for r in range(p)]
        largest = max(largest, max(float(x.abs().max()) for x in inputs))
        true_sum = true_sum + sum(x.double() for x in inputs) / p
        t = inputs[rank].clone()
        hopwise.torch.allreduce(t, state=state)
        out_sum += t.double()
        u = inputs[rank].clone()
        hopwise.torch.allreduce(u, state=plain)
        plain_sum += u.double()
    what = f"{spec}, {n} elements, {CALLS} calls"
    c.true(state.step == CALLS, f"{what}: step {state.step}")
    residual = state.residual.clone()
    dist.all_reduce(residual)  # the ranks' residuals, summed at full precision
    drift = (out_sum + residual.double() / p - true_sum).abs().max()
    c.true(float(drift) <= 1e-4 * max(largest, 1.0), f"{what}: outputs + mean residual miss the true sum by {drift}")
    if spec.startswith("int8"):
        # Within one call's error: the residual is what the last call's rounding left out.
        q = 127 // p
        off = float((out_sum - true_sum).abs().max())
        c.true(off <= largest / (2 * q) * 1.05 + 1e-5, f"{what}: the sum is off by {off}, more than one call's "
                                                       f"{largest / (2 * q)}")
        plain_off = float((plain_sum - true_sum).abs().max())
        if rank == 0 and n >= 1000:
            print(f"{what}: sum of outputs off the true sum by {off:.3g} with ef=1, {plain_off:.3g} without",
                  flush=True)


def state_checks(rank, p, c):
    spec = "int8:ef=1"
    a = hopwise.torch.CodecState(spec)
    x = data(rank, 1000, 5)
    hopwise.torch.allreduce(x.clone(), state=a)
    hopwise.torch.allreduce(x.clone(), state=a)
    saved = a.state_dict()
    c.true(saved["codec"] == hopwise.torch.CodecState(spec).codec and saved["step"] == 2 and saved["numel"] == 1000,
           f"state_dict {saved}")
    # Through a checkpoint file, as torch.load reads it by default (weights_only).
    buf = io.BytesIO()
    torch.save({"state": saved, "whole": a}, buf)
    buf.seek(0)
    loaded = torch.load(buf)
    b = hopwise.torch.CodecState(spec)
    b.load_state_dict(loaded["state"])
    whole = loaded["whole"]
    c.true(isinstance(whole, hopwise.torch.CodecState) and whole.step == 2, "a pickled CodecState")
    c.true(torch.equal(b.residual, a.residual) and torch.equal(whole.residual, a.residual), "the restored residual")
    y = data(rank, 1000, 6)
    ya, yb, yw = y.clone(), y.clone(), y.clone()
    hopwise.torch.allreduce(ya, state=a)
    hopwise.torch.allreduce(yb, state=b)
    hopwise.torch.allreduce(yw, state=whole)
    c.true(torch.equal(ya, yb) and torch.equal(ya, yw) and torch.equal(a.residual, b.residual),
           "a restored state goes on as the original")
    # .residual is a copy
    r = a.residual
    r.fill_(123.0)
    c.true(not torch.equal(a.residual, r), "residual is a copy")
    # Refusals: another codec, another size; a saved state of another codec.
    for call, words in [(lambda: hopwise.torch.allreduce(y.clone(), "int8", state=a), "codec 'int8"),
                        (lambda: hopwise.torch.allreduce(torch.zeros(999), state=a), "1000 elements"),
                        (lambda: hopwise.torch.CodecState("fp16").load_state_dict(saved), "of codec"),
                        (lambda: hopwise.torch.allreduce(y.clone(), state="int8"), "CodecState")]:
        try:
            call()
        except ValueError as e:
            c.true(words in str(e), f"refusal says {e}")
        else:
            raise AssertionError(f"not refused: {words}")
    # reset: the residual, step and size forgotten; the state then takes another size.
    a.reset()
    c.true(a.residual is None and a.step == 0 and a.numel is None, "reset")
    z = torch.ones(10) * (rank + 1)
    hopwise.torch.allreduce(z, state=a)
    c.true(a.numel == 10 and float((z - (p + 1) / 2).abs().max()) < 0.05, f"after reset: {z}")
    # No state: a fresh one per call (nothing carried); the codec defaults to int8.
    z = torch.full((5,), float(rank))
    hopwise.torch.allreduce(z)
    c.true(float((z - (p - 1) / 2).abs().max()) < 0.05, f"no state: {z}")


def op_and_async(rank, p, c):
    x = torch.full((7,), float(rank + 1))
    hopwise.torch.allreduce(x, "none", op="sum")
    c.true(torch.equal(x, torch.full((7,), float(p * (p + 1) // 2))), f"op sum: {x}")
    x = torch.full((7,), float(rank + 1))
    hopwise.torch.allreduce(x, "none", op=dist.ReduceOp.SUM)
    c.true(torch.equal(x, torch.full((7,), float(p * (p + 1) // 2))), f"ReduceOp.SUM: {x}")
    # Async, interleaved with plain collectives and waited on out of order: the same order on every rank.
    states = [hopwise.torch.CodecState("int8:ef=1") for _ in range(3)]
    tensors = [data(rank, 1000 + i, 9) for i in range(3)]
    expected = [sum(data(r, 1000 + i, 9) for r in range(p)) / p for i in range(3)]
    plain = torch.full((3,), float(rank))
    works = []
    for i in range(3):
        works.append(hopwise.torch.allreduce(tensors[i], state=states[i], async_op=True))
        if i == 1:
            works.append(dist.all_reduce(plain, async_op=True))
    c.true(all(isinstance(w, dist.Work) for w in works), f"async_op returns torch Works: {works}")
    fut = works[0].get_future()
    for w in reversed(works):
        w.wait()
    fut.wait()
    c.true(torch.equal(plain, torch.full((3,), float(sum(range(p))))), "plain call between compressed ones")
    for i in range(3):
        c.true(float((tensors[i] - expected[i]).abs().max()) < 0.1, f"async {i}")
        c.true(states[i].step == 1, f"async state {i}")


def staged(rank, p, c):
    """Host-staged calls: float32 through the staged code equals the direct call bit for bit (residuals carried over
    three calls, async too); bfloat16 and float16 tensors keep their dtype and land within the codec's bound plus
    their own rounding."""
    from hopwise.torch import compressed
    # codecs whose payloads add up exactly (integers): the tuner may time another algorithm for the second call, and
    # float sums (fp16, none) round by the order they are added in
    for spec in ["int8:ef=1", "int4:ef=1", "terngrad"]:
        direct_state, staged_state = hopwise.torch.CodecState(spec), hopwise.torch.CodecState(spec)
        for call in range(3):
            x = data(rank, 1009, 20 + call)
            a, b = x.clone(), x.clone()
            hopwise.torch.allreduce(a, state=direct_state)
            compressed._STAGE_ALWAYS = True
            try:
                w = hopwise.torch.allreduce(b, state=staged_state, async_op=call == 2)
                if call == 2:
                    c.true(isinstance(w, dist.Work), f"staged async_op returns a torch Work, not {type(w)}")
                    w.get_future().wait()
                    c.true(w.wait(), "staged wait()")
            finally:
                compressed._STAGE_ALWAYS = False
            c.true(torch.equal(a, b), f"{spec}, call {call}: staged off the direct call by {(a - b).abs().max()}")
        c.true(direct_state.step == staged_state.step, f"{spec}: steps {direct_state.step}, {staged_state.step}")
    for dtype, rounding in [(torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11)]:
        inputs = [data(r, 1000, 31) for r in range(p)]
        mean = sum(inputs) / p
        t = inputs[rank].to(dtype)
        hopwise.torch.allreduce(t, "int8:ef=1", state=hopwise.torch.CodecState("int8:ef=1"))
        c.true(t.dtype == dtype, f"{dtype}: the result came back as {t.dtype}")
        lowered = [x.to(dtype).float() for x in inputs]
        err = (t.float() - mean).abs()
        allowed = bound("int8", lowered, p) + (mean.abs() + 2 * rounding) * rounding * 2
        c.true(bool((err <= allowed).all()), f"{dtype}: off the mean by {float(err.max())}")
        same_on_every_rank(t.float(), f"{dtype} int8", c)


def bad_arguments(rank, c):
    refusals = [
        (lambda: hopwise.torch.allreduce(torch.zeros(4, dtype=torch.float64)), "dtype is torch.float64"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4, device="meta")), "is on meta"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4, 4).t()), "not contiguous"),
        (lambda: hopwise.torch.allreduce(torch.zeros(8)[::2]), "not contiguous"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4), "int9"), "unknown codec 'int9'; known codecs:"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4), "topk:ratio=2"), "ratio"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4), "powersgd:rank=2"), "powersgd"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4), "int8", op="max"), "not 'max'"),
        (lambda: hopwise.torch.allreduce(torch.zeros(4), "int8", op=dist.ReduceOp.PRODUCT), "not 'product'"),
        (lambda: hopwise.torch.allreduce([1.0, 2.0]), "torch.Tensor"),
        (lambda: hopwise.torch.CodecState(8), "a string"),
    ]
    for call, words in refusals:
        try:
            call()
        except ValueError as e:
            c.true(words in str(e), f"refusal of {words!r} says: {e}")
            if words.startswith("unknown codec"):
                c.true(all(name in str(e) for name in ("int8", "fp16", "topk", "none")), f"codecs listed: {e}")
        else:
            raise AssertionError(f"not refused: {words}")
    # The group still works after every refusal (none of them started a collective).
    t = torch.full((3,), 1.0)
    hopwise.torch.allreduce(t, "none")
    c.true(torch.equal(t, torch.ones(3)), "the group after the refusals")


def main():
    dist.init_process_group("hopwise")
    rank, p = dist.get_rank(), dist.get_world_size()
    c = Checks()
    for spec in CODECS:
        for n in SIZES:
            one_call(spec, n, rank, p, c)
    for spec in ["int8:ef=1", "topk:ratio=0.1,ef=1"]:
        for n in (7, 1000, 1000003):
            error_feedback(spec, n, rank, p, c)
    state_checks(rank, p, c)
    op_and_async(rank, p, c)
    staged(rank, p, c)
    bad_arguments(rank, c)
    dist.barrier()
    print(f"rank {rank}: compressed allreduce ok: {c.count} checks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
