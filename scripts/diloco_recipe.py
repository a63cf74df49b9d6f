#!/usr/bin/env python3
"""DiLoCo (Douillard et al., arXiv 2311.08105) as a user writes it in plain PyTorch over gloo, no hopwise: the peer
that hopwise's diloco averaging is compared with. The model, data, batch split, learning rate, evaluation and
--json keys are examples/torch_ddp/train.py's (its functions imported).

    scripts/venv.sh torchrun --standalone --nproc_per_node 2 scripts/diloco_recipe.py --period 8 --json out.json
    scripts/local-cluster.sh torchrun --nnodes 2 "$(scripts/venv.sh --path)/bin/python" scripts/diloco_recipe.py ...
    scripts/venv.sh torchrun --standalone --nproc_per_node 2 scripts/diloco_recipe.py --check

(--check: the outer step against a hand computation, exact and int8, on however many ranks; tests/python runs it.)

Each rank trains its own copy with the inner optimizer (--inner sgd: train.py's SGD, lr 0.05, momentum 0.9; or
adamw) on its slice of the global batch, no communication. Every --period H steps: the pseudo-gradient (the synced
copy minus the current parameters) goes into one flat buffer, is averaged with dist.all_reduce (or, --quantize
int8, absmax-quantized per row of --quant-row values and all-gathered as int8 with the float scales, no error
feedback), and the outer optimizer, torch.optim.SGD(lr --outer-lr, momentum --outer-momentum, nesterov=True),
steps the synced copy with it as .grad; the parameters become the synced copy. The inner optimizer keeps its state.

Timing: every step is timed on rank 0, and so is its compute (forward, backward, inner step) within it; a step
that synchronizes includes the synchronization. step_ms = training time / steps, compute_ms = compute / steps,
utilization = compute / training time. Evaluation (--eval-every with --target-accuracy or --trace-accuracy) is off
the clock and scores the synced model (the outer parameters every rank holds alike); the last step also
synchronizes the steps since the last synchronization (unless the target stopped the run first: then the final
model is the synced one that reached it). bytes_per_step is what a rank
hands to the collective per synchronization, spread over the period; wire_bytes_per_step is 0 as in train.py
on gloo (gloo keeps no count). As train.py --diloco, "diloco" is the spec (hopwise's form) and "diloco_stats" has
syncs, bytes, bytes_per_sync, comm_ms (the syncs' time on rank 0; hidden_ms 0: every sync blocks)."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "torch_ddp"))
import train as ddp_example  # noqa: E402  (examples/torch_ddp/train.py: data, model, progress bar)


def quantize_int8(v, row):
    """Absmax int8 per row of `row` values (0: the whole buffer as one row): (int8 values, float32 scales)."""
    n = v.numel()
    row = row or n
    rows = -(-n // row)
    padded = torch.zeros(rows * row, dtype=v.dtype)
    padded[:n] = v
    padded = padded.view(rows, row)
    scale = padded.abs().amax(1) / 127
    scale[scale == 0] = 1
    q = torch.round(padded / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def dequantize_int8(q, scale, n):
    return (q.float() * scale[:, None]).reshape(-1)[:n]


class DiLoCo:
    """The outer loop around a model and its inner optimizer: sync() every `period` inner steps."""

    def __init__(self, model, period, outer_lr=0.7, outer_momentum=0.9, quantize="none", quant_row=1024):
        self.params = [p for p in model.parameters()]
        self.synced = [nn.Parameter(p.detach().clone()) for p in self.params]  # the global copy, alike everywhere
        # torch refuses Nesterov without momentum (outer lr 1, momentum 0: plain averaging)
        self.outer = torch.optim.SGD(self.synced, lr=outer_lr, momentum=outer_momentum, nesterov=outer_momentum > 0)
        self.period, self.quantize, self.quant_row = period, quantize, quant_row
        self.numel = sum(p.numel() for p in self.params)
        self.flat = torch.empty(self.numel)
        off = 0
        for s in self.synced:
            s.grad = self.flat[off:off + s.numel()].view_as(s)
            off += s.numel()
        self.world = dist.get_world_size()
        self.since = 0  # inner steps since the last sync
        self.syncs, self.sync_s = 0, 0.0  # syncs so far, and their time on this rank

    def payload_bytes(self):
        """What a rank hands to the collective at one sync."""
        if self.quantize == "int8":
            row = self.quant_row or self.numel
            return self.numel + -(-self.numel // row) * 4
        return self.numel * 4

    def after_inner_step(self):
        self.since += 1
        if self.since == self.period:
            self.sync()
            return True
        return False

    def average(self, v):
        """`v` becomes the mean over ranks of `v` (the int8 route: of the ranks' dequantized `v`)."""
        if self.quantize == "int8":
            q, scale = quantize_int8(v, self.quant_row)
            qs = [torch.empty_like(q) for _ in range(self.world)]
            ss = [torch.empty_like(scale) for _ in range(self.world)]
            dist.all_gather(qs, q)
            dist.all_gather(ss, scale)
            v.zero_()
            for qr, sr in zip(qs, ss):
                v += dequantize_int8(qr, sr, v.numel())
            return v.div_(self.world)
        dist.all_reduce(v)
        return v.div_(self.world)

    @torch.no_grad()
    def sync(self):
        t0 = time.perf_counter()
        off = 0
        for s, p in zip(self.synced, self.params):  # pseudo-gradient: synced copy - current parameters
            n = p.numel()
            torch.sub(s.reshape(-1), p.reshape(-1), out=self.flat[off:off + n])
            off += n
        self.average(self.flat)  # the synced copy's .grad are views of it
        self.outer.step()
        for s, p in zip(self.synced, self.params):
            p.copy_(s)
        self.since = 0
        self.syncs += 1
        self.sync_s += time.perf_counter() - t0

    def state(self):
        """The outer parameters (what evaluation scores)."""
        return self.synced


def check(args):
    """The outer step against a hand computation: 2+ ranks, a small linear model, 3 outer rounds (so the Nesterov
    momentum shows), exact and int8. Every rank gathers every rank's parameters before each sync and computes
    the expected result itself, in float64, without torch.optim."""
    rank, world = dist.get_rank(), dist.get_world_size()
    worst = 0.0
    for quantize, tol in (("none", 1e-5), ("int8", 1e-5)):
        torch.manual_seed(3)
        model = nn.Linear(7, 3)
        inner = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        lr, mu, period = 0.7, 0.9, 3
        d = DiLoCo(model, period, lr, mu, quantize, quant_row=5)
        theta = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
        buf = None
        g = torch.Generator().manual_seed(100 + rank)
        for t in range(3 * period):
            x, y = torch.randn(16, 7, generator=g), torch.randn(16, 3, generator=g)
            inner.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            inner.step()
            if d.since + 1 == period:  # this step syncs: first the hand computation's inputs
                mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
                every = [torch.empty_like(mine) for _ in range(world)]
                dist.all_gather(every, mine)
                deltas = [theta - e.double() for e in every]
                if quantize == "int8":  # each rank's pseudo-gradient as the others receive it, quantized from the
                    # float32 difference the ranks compute (a rounding step apart from the float64 one at most)
                    outer_now = torch.cat([s.detach().reshape(-1) for s in d.synced])
                    deltas = [dequantize_int8(*quantize_int8(outer_now - e, 5), e.numel()).double() for e in every]
                delta = sum(deltas) / world
                buf = delta.clone() if buf is None else mu * buf + delta
                theta = theta - lr * (delta + mu * buf)
            synced = d.after_inner_step()
            if synced:
                got = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).double()
                err = (got - theta).abs().max().item()
                worst = max(worst, err)
                if err > tol:
                    sys.exit(f"diloco check: rank {rank}, {quantize}, step {t + 1}: off the hand computation by {err}")
                every = [torch.empty_like(got) for _ in range(world)]
                dist.all_gather(every, got)
                if any(not torch.equal(e, got) for e in every):
                    sys.exit(f"diloco check: rank {rank}, {quantize}, step {t + 1}: ranks differ after the sync")
    print(f"rank {rank}: diloco check ok, {world} ranks, 3 outer steps exact and int8, max error {worst:.2e}",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--period", type=int, default=8, help="H: inner steps between synchronizations")
    ap.add_argument("--inner", default="sgd", choices=["sgd", "adamw"])
    ap.add_argument("--lr", type=float, default=None, help="inner learning rate (sgd: 0.05 as train.py; adamw: 1e-3)")
    ap.add_argument("--outer-lr", type=float, default=0.7)
    ap.add_argument("--outer-momentum", type=float, default=0.9)
    ap.add_argument("--quantize", default="none", choices=["none", "int8"])
    ap.add_argument("--quant-row", type=int, default=1024, help="values per int8 scale (0: one for the whole buffer)")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--epochs", type=float, default=1, help="may be fractional")
    ap.add_argument("--batch", type=int, default=128, help="global batch, split across ranks")
    ap.add_argument("--target-accuracy", type=float, default=0,
                    help="stop once the test accuracy reaches this (checked every --eval-every steps, off the clock)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--trace-accuracy", action="store_true",
                    help="check the test accuracy every --eval-every steps (off the clock) and record it")
    ap.add_argument("--json", default="")
    ap.add_argument("--data", default=os.environ.get("HOPWISE_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--keep-denormals", action="store_true",
                    help="leave denormal floats on (by default flushed to zero, as train.py does)")
    ap.add_argument("--check", action="store_true", help="check the outer step against a hand computation, then exit")
    args = ap.parse_args()
    if args.period < 1:
        sys.exit("diloco_recipe.py: --period must be at least 1")

    if "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun: env:// reads RANK and WORLD_SIZE
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if not args.keep_denormals:  # as train.py (a run slowed 2x once values decayed into denormals)
        torch.set_flush_denormal(True)
    dist.init_process_group("gloo")
    if args.check:
        check(args)
        dist.barrier()
        dist.destroy_process_group()
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"diloco_recipe.py: --batch {args.batch} does not split across {world} ranks")
    lead = rank == 0

    x = ddp_example.load_images(f"{args.data}/train-images-idx3-ubyte.gz")
    y = ddp_example.load_labels(f"{args.data}/train-labels-idx1-ubyte.gz")
    tx = ddp_example.load_images(f"{args.data}/t10k-images-idx3-ubyte.gz")
    ty = ddp_example.load_labels(f"{args.data}/t10k-labels-idx1-ubyte.gz")
    model = ddp_example.make_model(args.model, args.hidden)
    with torch.no_grad():  # every rank starts from rank 0's parameters, as DDP would make it
        for p in model.parameters():
            dist.broadcast(p, 0)
    lr = args.lr if args.lr is not None else (0.05 if args.inner == "sgd" else 1e-3)
    if args.inner == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
    diloco = DiLoCo(model, args.period, args.outer_lr, args.outer_momentum, args.quantize, args.quant_row)
    loss_fn = nn.CrossEntropyLoss()
    local = args.batch // world
    steps = int(args.epochs * (x.shape[0] // args.batch))
    params = diloco.numel
    spec = (f"diloco:period={args.period},outer_lr={args.outer_lr},momentum={args.outer_momentum}"
            + (f",codec=int8,row={args.quant_row}" if args.quantize == "int8" else "")
            + (",inner=adamw" if args.inner == "adamw" else ""))  # hopwise's spec form, as train.py --diloco
    if lead:
        print(f"diloco_recipe.py: {world} ranks, gloo, {spec}, model {args.model} ({params} parameters, "
              f"{diloco.payload_bytes() / 2**20:.1f} MiB per sync), global batch {args.batch}, inner lr {lr}, "
              f"{steps} steps")

    def batch(i):
        lo = (i * args.batch + rank * local) % (x.shape[0] - local)
        return x[lo:lo + local], y[lo:lo + local]

    def accuracy():
        """The ranks' mean model (as hopwise's rows are scored), every rank a slice of the test set, the counts
        summed."""
        saved = [p.detach().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                dist.all_reduce(p.data)
                p.data /= world
        model.eval()
        with torch.no_grad():
            mine = slice(rank * len(tx) // world, (rank + 1) * len(tx) // world)
            right = torch.tensor([(model(tx[mine]).argmax(1) == ty[mine]).sum().item(), len(ty[mine])])
            for p, s in zip(model.parameters(), saved):
                p.copy_(s)
        model.train()
        dist.all_reduce(right)
        return right[0].item() / right[1].item()

    # warm-up, off the clock and leaving the parameters alone: forward and backward, and one collective of the
    # sync's size (gloo's connections and buffers)
    for i in range(10):
        xb, yb = batch(i)
        loss_fn(model(xb), yb).backward()
    opt.zero_grad(set_to_none=True)
    warm = torch.zeros(diloco.numel)
    if args.quantize == "int8":
        diloco.average(warm)
    else:
        dist.all_reduce(warm)
    dist.barrier()
    diloco.syncs, diloco.sync_s = 0, 0.0
    link_before, eval_link = ddp_example.link_sent(), 0.0
    t0 = time.perf_counter()
    compute_s, loss_sum, losses, syncs = 0.0, 0.0, 0, 0
    paused = 0.0  # seconds spent on evaluation, taken off the training time
    reached = None  # (steps, training seconds) when the target accuracy was first reached
    trace = []  # (steps, training seconds, test accuracy)
    for i in range(steps):
        c0 = time.perf_counter()
        xb, yb = batch(i)
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        loss_sum, losses = loss_sum + loss.item(), losses + 1
        compute_s += time.perf_counter() - c0
        syncs += diloco.after_inner_step()  # the step that syncs carries the sync
        if i == steps - 1 and diloco.since:  # the last step also syncs the steps since the last sync
            diloco.sync()
            syncs += 1
        if lead and (i % 20 == 0 or i == steps - 1):
            ddp_example.progress(i + 1, steps, f"loss {loss_sum / losses:.3f} "
                                 f"{(time.perf_counter() - t0 - paused) / (i + 1) * 1e3:.1f} ms/step")
        if (args.target_accuracy or args.trace_accuracy) and ((i + 1) % args.eval_every == 0 or i == steps - 1):
            e0, l0 = time.perf_counter(), ddp_example.link_sent()
            acc = accuracy()
            eval_link += ddp_example.link_sent() - l0 if l0 is not None else 0
            trace.append((i + 1, e0 - t0 - paused, acc))
            if args.target_accuracy and acc >= args.target_accuracy:
                reached = (i + 1, e0 - t0 - paused)
            paused += time.perf_counter() - e0
            if reached:
                steps = i + 1
                break
    dist.barrier()
    train_s = time.perf_counter() - t0 - paused
    link = ddp_example.link_bytes_per_step(link_before, eval_link, steps)  # train.py's count
    if lead:
        print()
    test_accuracy = accuracy()
    step_ms = train_s / max(1, steps) * 1e3
    compute_ms = compute_s / max(1, steps) * 1e3
    result = {
        "backend": "gloo", "hook": "none", "averaging": "diloco-recipe", "diloco": spec, "period": args.period,
        "inner": args.inner, "inner_lr": lr, "outer_lr": args.outer_lr, "outer_momentum": args.outer_momentum,
        "quantize": args.quantize, "quant_row": args.quant_row if args.quantize == "int8" else None,
        "model": args.model, "ranks": world, "steps": steps, "syncs": syncs,
        "step_ms": step_ms, "compute_ms": compute_ms, "utilization": min(1.0, compute_s / train_s),
        "test_accuracy": test_accuracy, "target_accuracy": args.target_accuracy,
        "steps_to_target": reached[0] if reached else None, "time_to_target_s": reached[1] if reached else None,
        "accuracy_trace": trace, "images_per_s": steps * args.batch / train_s, "resumed_at": 0,
        "train_s": train_s, "gradient_bytes_per_step": params * 4,
        "bytes_per_step": diloco.payload_bytes() * syncs / max(1, steps), "wire_bytes_per_step": 0,
        "link_bytes_per_step": link,
        "diloco_stats": {"syncs": syncs, "bytes": diloco.payload_bytes() * syncs, "bytes_per_sync":
                         diloco.payload_bytes(), "comm_ms": diloco.sync_s * 1e3, "sync_ms": diloco.sync_s * 1e3 /
                         max(1, syncs), "hidden_ms": 0.0, "hidden_fraction": 0.0},  # blocking: nothing hidden
    }
    if lead:
        print(f"diloco_recipe.py: {steps} steps, {syncs} syncs ({diloco.sync_s * 1e3 / max(1, syncs):.1f} ms each) in "
              f"{train_s:.1f} s: step {step_ms:.1f} ms, compute "
              f"{compute_ms:.1f} ms (utilization {result['utilization']:.0%}), {result['images_per_s']:.0f} images/s, "
              f"test accuracy {test_accuracy:.4f}")
        if args.target_accuracy:
            print(f"diloco_recipe.py: target accuracy {args.target_accuracy:.4f} " +
                  (f"reached after {reached[0]} steps, {reached[1]:.1f} s of training" if reached else "not reached"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()  # no rank tears gloo down while another still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
