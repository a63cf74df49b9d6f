"""One rank of the DDP checks on the hopwise backend (run under torchrun, mpirun or tests/spawn_ranks.sh).

  parity      DDP on hopwise and DDP on gloo, same model, data and buckets: the same averaged gradients each of
              20 steps; with 2 ranks the same parameters after 20 steps
  hooks       every hopwise codec hook and torch's builtin hooks over several buckets: ranks stay identical,
              the loss falls; "none" equals plain DDP
  checkpoint  a hook's state saved after 3 steps and restored into a new DDP: steps 4-6 as if never stopped
  monitor     hopwise.torch.Monitor names a rank slowed on purpose, with its lag, and alerts
"""
import io
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

import hopwise.torch

BUCKET_MB = 0.25


def env_rank_and_size():
    if "OMPI_COMM_WORLD_RANK" in os.environ:
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])


def model():
    torch.manual_seed(0)
    # 2.2 MB of parameters: past DDP's 1 MiB first bucket, so that its later buckets are several
    return nn.Sequential(nn.Linear(32, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512),
                         nn.ReLU(), nn.Linear(512, 10))


def batch(rank, step):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(64, 32, generator=g)
    return x, (x[:, :10] * 3).argmax(1)


def train(ddp, steps, start=0, optimizer=None):
    opt = optimizer or torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(start, start + steps):
        x, y = batch(dist.get_rank(), step)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, opt


def flat(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def same_on_every_rank(v, what):
    lo, hi = v.clone(), v.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    spread = (hi - lo).abs().max().item()
    assert spread <= 1e-6 * max(1.0, v.abs().max().item()), f"{what}: ranks differ by {spread}"


def parity():
    """Each step, DDP on hopwise all-reduces the gradients DDP on gloo gets, from the same parameters.

    Both sides start from gloo's parameters every step, so what is compared is one step's averaged gradients, not
    a trajectory: with 3 or more ranks the two backends add in different orders, and 20 steps of SGD amplify those
    last bits into visible differences. With 2 ranks a + b is b + a, so the 20-step trajectories match too."""
    gloo = dist.new_group(backend="gloo")
    ours = dist.new_group(backend="hopwise")
    a = DDP(model(), process_group=gloo, bucket_cap_mb=BUCKET_MB)
    b = DDP(model(), process_group=ours, bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9)
    worst = 0.0
    for step in range(20):
        with torch.no_grad():
            for pa, pb in zip(a.parameters(), b.parameters()):
                pb.copy_(pa)
        x, y = batch(dist.get_rank(), step)
        for ddp in (a, b):
            ddp.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
        for i, (pa, pb) in enumerate(zip(a.parameters(), b.parameters())):
            scale = max(pa.grad.abs().max().item(), 1e-30)
            rel = (pa.grad - pb.grad).abs().max().item() / scale
            # a 3-term sum reordered moves the result by a few units in the last place of the terms
            assert rel <= 1e-6, f"step {step}, tensor {i}: averaged gradients differ by {rel:.3g} of their largest"
            worst = max(worst, rel)
        opt.step()
    if dist.get_world_size() == 2:
        c = DDP(model(), process_group=ours, bucket_cap_mb=BUCKET_MB)
        d = DDP(model(), process_group=gloo, bucket_cap_mb=BUCKET_MB)
        train(c, 20)
        train(d, 20)
        pc, pd = flat(c.module), flat(d.module)
        assert torch.equal(pc, pd), f"2 ranks: 20 steps on hopwise and on gloo differ by {(pc - pd).abs().max()}"
    print(f"rank {dist.get_rank()}: parity ok: 20 steps, {len(list(a.module.parameters()))} tensors, "
          f"max relative difference {worst:.2g}", flush=True)


def hooks():
    plain = DDP(model(), bucket_cap_mb=BUCKET_MB)
    plain_losses, _ = train(plain, 8)
    reference = flat(plain.module)
    specs = ["none", "fp16", "bf16", "int8", "int8:ef=1", "qsgd", "terngrad", "sign", "topk:ratio=0.3",
             "randomk:ratio=0.5", "powersgd:rank=2", "powersgd:rank=1,ef=1", "network:int8", "network:powersgd:rank=2"]
    builtin = {
        "torch fp16_compress_hook": (None, default_hooks.fp16_compress_hook),
        "torch powerSGD_hook": (lambda: powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=2,
                                                                    start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook),
        "torch batched_powerSGD_hook": (lambda: powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1,
                                                                            start_powerSGD_iter=2),
                                        powerSGD_hook.batched_powerSGD_hook),
    }
    try:  # torch's batched hook hands _orthogonalize one matrix where it asserts a batch (1.13.1, 2.15.0)
        powerSGD_hook._orthogonalize(torch.zeros(4, 2))
    except AssertionError:
        del builtin["torch batched_powerSGD_hook"]
        if dist.get_rank() == 0:
            print("hook torch batched_powerSGD_hook: not run: this torch's own _orthogonalize rejects what the hook "
                  "passes it (on any backend)", flush=True)
    cases = [(s, lambda s=s: hopwise.torch.compression_hook(s)) for s in specs]
    sent = {}
    cases += [(name, lambda st=st, h=h: (st() if st else None, h)) for name, (st, h) in builtin.items()]
    for name, make in cases:
        ddp = DDP(model(), bucket_cap_mb=BUCKET_MB)
        state, inner = make()
        seen = set()

        def hook(state, bucket, inner=inner, seen=seen):
            seen.add(bucket.index())
            return inner(state, bucket)

        ddp.register_comm_hook(state, hook)
        before = hopwise.torch.stats()["bytes"]
        losses, _ = train(ddp, 8)
        sent[name] = hopwise.torch.stats()["bytes"] - before  # on the wire: compressed payloads where compressed
        p = flat(ddp.module)
        same_on_every_rank(p, name)
        assert losses[-1] < losses[0], f"{name}: the loss did not fall ({losses[0]:.3f} -> {losses[-1]:.3f})"
        if name == "none" or name.startswith("network:"):  # one host: network: compresses nothing
            rel = ((p - reference).abs().max() / reference.abs().max()).item()
            assert rel <= 1e-6, f"hook {name} differs from plain DDP by {rel:.3g}"
        assert len(seen) > 2, f"{name}: the hook saw {len(seen)} bucket(s); the check needs several"
        buckets = len(seen)
        if dist.get_rank() == 0:
            print(f"hook {name}: ok, loss {losses[0]:.3f} -> {losses[-1]:.3f} (plain DDP {plain_losses[-1]:.3f}), "
                  f"buckets {buckets}, {sent[name]} bytes", flush=True)
    # hopwise.torch.stats()'s bytes count what the compressed hooks put on the wire, not the gradients' size.
    for name in ("int8", "powersgd:rank=2"):
        assert 0 < sent[name] < sent["none"], f"hook {name} sent {sent[name]} bytes, plain {sent['none']}: {sent}"
    assert sent["int8"] < sent["none"] / 2, sent  # one byte a float and a scale a chunk, against four bytes


def resumed(spec, saved_hook_state):
    """Steps 4-6 from the checkpoint taken after step 3, with the hook state restored (or a fresh one)."""
    first = DDP(model(), bucket_cap_mb=BUCKET_MB)
    state, hook = hopwise.torch.compression_hook(spec)
    first.register_comm_hook(state, hook)
    _, opt = train(first, 3)
    saved = io.BytesIO()
    torch.save({"model": first.module.state_dict(), "opt": opt.state_dict(), "hook": state}, saved)
    saved.seek(0)
    loaded = torch.load(saved)
    second = DDP(model(), bucket_cap_mb=BUCKET_MB)
    second.module.load_state_dict(loaded["model"])
    opt2 = torch.optim.SGD(second.parameters(), lr=0.1, momentum=0.9)
    opt2.load_state_dict(loaded["opt"])
    second.register_comm_hook(*hopwise.torch.compression_hook(spec, state=loaded["hook"] if saved_hook_state else None))
    train(second, 3, start=3, optimizer=opt2)
    return flat(second.module)


def checkpoint():
    """Per-parameter state (residuals, PowerSGD's Q) resumes exactly. Codecs that choose over a whole bucket
    (top-k's k, sign's and int8's scales) see DDP's first-step single bucket again after a restart, so their
    first resumed step may pick differently: for them the restored state must bring the run closer to the
    uninterrupted one than a fresh state does."""
    for spec in ["fp16:ef=1", "powersgd:rank=2,ef=1", "int8:ef=1", "topk:ratio=0.2"]:
        whole = DDP(model(), bucket_cap_mb=BUCKET_MB)
        whole.register_comm_hook(*hopwise.torch.compression_hook(spec))
        train(whole, 6)
        pw = flat(whole.module)
        with_state = (pw - resumed(spec, True)).abs().max().item()
        exact = spec.startswith(("fp16", "powersgd"))
        if exact:
            assert with_state <= 1e-6, f"{spec}: resumed from the checkpoint, the parameters differ by {with_state:.3g}"
            note = "equals the uninterrupted run"
        else:
            fresh = (pw - resumed(spec, False)).abs().max().item()
            assert with_state < fresh, (f"{spec}: resumed with the saved state the run is {with_state:.3g} from the "
                                        f"uninterrupted one, with a fresh state {fresh:.3g}: the state did not help")
            note = f"closer to the uninterrupted run than with a fresh state ({fresh:.2g})"
        if dist.get_rank() == 0:
            print(f"checkpoint {spec}: ok, max difference {with_state:.2g}: {note}", flush=True)


def monitor():
    """hopwise.torch.Monitor on DDP, rank 1 sleeping 40 ms before each forward: rank 0's report names rank 1 with
    its lag within 20%, and the alert (utilization below 90% for 1 interval) names it as the cause."""
    sleep_ms, steps = 40.0, 30
    ddp = DDP(model(), bucket_cap_mb=BUCKET_MB)
    mon = hopwise.torch.Monitor(interval="1000s", every=5, alert_after=1, util_alert=0.9,
                                metrics_file=os.environ["MONITOR_PROM"], metrics_json=os.environ["MONITOR_JSON"],
                                job="ddp_worker")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = batch(dist.get_rank(), step)
        if dist.get_rank() == 1:
            time.sleep(sleep_ms / 1e3)
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        mon.step()
    assert len(mon.last_sample()["bucket_ms"]) >= 2, f"DDP's buckets not seen: {mon.last_sample()}"
    mon.finish()
    if dist.get_rank() != 0:
        assert not mon.reports, "a rank other than 0 reported"
        return
    (r,) = mon.reports
    assert r["steps"] == steps and r["slowest_rank"] == 1, f"rank {r['slowest_rank']} named: {r['line']}"
    assert abs(r["slowest_lag_ms"] - sleep_ms) <= 0.2 * sleep_ms, f"lag {r['slowest_lag_ms']:.1f} ms: {r['line']}"
    assert mon.alerts and "straggler: rank 1" in mon.alerts[0], f"alerts: {mon.alerts}"
    print(f"monitor ok: rank 1 named, lag {r['slowest_lag_ms']:.1f} ms for a {sleep_ms:g} ms sleep; "
          f"{mon.alerts[0]}", flush=True)


def main():
    env_rank_and_size()
    mode = sys.argv[1]
    dist.init_process_group("gloo" if mode == "parity" else "hopwise")
    {"parity": parity, "hooks": hooks, "checkpoint": checkpoint, "monitor": monitor}[mode]()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
