"""hopwise.torch's averagers, compressed all-reduce and FSDP2 collectives on CUDA tensors, host-staged: 2 ranks on one
GPU over the host transport (run by gpu-check.sh as ctest torch_cuda_placement), each against the same call on CPU
tensors:

- DiLoCo and the other periodic methods on a float32 CUDA model end within 1e-3 of the CPU run (the GPU's kernels
  round otherwise; the averaging itself is the CPU's code), a bfloat16 CUDA model within 0.08 of float32, replicas
  equal after full_average();
- hopwise.torch.allreduce and the FSDP2 reduce-scatter and all-gather of CUDA buffers give the CPU call's bits
  (only copies differ), bf16 kept.

Exits 77 (skipped) without a CUDA device. HOPWISE_PLACEMENT_DEVICE=cpu runs the same script on CPU tensors with
placement="host" (the staged code without streams), to try it where there is no GPU.
Prints "rank R: CUDA placement ok: N checks"."""
import os
import sys

import torch
import torch.distributed as dist

DEVICE = os.environ.get("HOPWISE_PLACEMENT_DEVICE", "cuda")
if DEVICE == "cuda" and not torch.cuda.is_available():
    print("torch_cuda_placement: no CUDA device here: skipped")
    sys.exit(77)

import hopwise.torch  # noqa: E402
from checks import Checks  # noqa: E402
from hopwise.torch import fsdp  # noqa: E402

IN, HIDDEN, OUT, LR = 11, 17, 3, 0.01
SPECS = ["diloco:period=4,fragments=4,delay=1,codec=int4,inner=adam", "diloco:period=4,outer_lr=0.7,momentum=0.9",
         "local:period=3", "async:period=3,delay=1,codec=int8", "gossip:peers=1"]



def data(r, t):
    g = torch.Generator().manual_seed(100 * r + t)
    return torch.randn(8, IN, generator=g), torch.randn(8, OUT, generator=g)


def train(spec, rank, device, dtype=torch.float32, steps=17):
    torch.manual_seed(5)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    placement = "host" if device.type == "cpu" and DEVICE == "cpu" else "auto"
    avg = hopwise.torch.ModelAverager(spec, model, placement=placement)
    for t in range(steps):
        opt.zero_grad()
        x, y = data(rank, t)
        out = model(x.to(device=device, dtype=dtype)).float()
        torch.nn.functional.mse_loss(out, y.to(device)).backward()
        avg.before_step()
        opt.step()
        avg.after_step()
        if t == 9:
            with avg.mean_model():
                pass
    avg.full_average()
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in model.parameters()]), avg


def same_everywhere(t):
    everyone = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, t)
    return all(torch.equal(e, t) for e in everyone)


def methods(rank, dev, c):
    cpu = torch.device("cpu")
    for spec in SPECS:
        want, _ = train(spec, rank, cpu)
        got, avg = train(spec, rank, dev)
        c.true(avg.placement == "host", f"{spec}: a {dev} model ran {avg.placement}")
        off = (got - want).abs().max().item()
        c.true(off < 1e-3, f"{spec}: the {dev} run ended {off:.3g} off the CPU run")
        c.true(same_everywhere(got), f"{spec}: the replicas differ after full_average()")
    want, _ = train(SPECS[0], rank, cpu)
    got, _ = train(SPECS[0], rank, dev, torch.bfloat16)
    off = (got - want).abs().max().item()
    c.true(off < 0.08, f"bf16 on {dev}: {off:.3g} off the float32 CPU run")


def allreduce(rank, dev, c):
    for spec in ("int8:ef=1", "int4:ef=1"):
        on_cpu, on_dev = hopwise.torch.CodecState(spec), hopwise.torch.CodecState(spec)
        for call in range(3):
            g = torch.Generator().manual_seed(7 * rank + call)
            x = torch.randn(100003, generator=g)
            a, b = x.clone(), x.to(dev)
            hopwise.torch.allreduce(a, state=on_cpu)
            if call == 2:  # async: copied back at wait()
                hopwise.torch.allreduce(b, state=on_dev, async_op=True).wait()
            else:
                hopwise.torch.allreduce(b, state=on_dev)
            c.true(b.device == dev and torch.equal(a, b.cpu()), f"allreduce {spec} call {call} on {dev}: other bits")
    x = torch.randn(4099, generator=torch.Generator().manual_seed(rank)).to(dev, torch.bfloat16)
    ref = x.float().cpu()
    hopwise.torch.allreduce(x, "int8")
    hopwise.torch.allreduce(ref, "int8")
    c.true(x.dtype == torch.bfloat16 and (x.float().cpu() - ref).abs().max().item() < 0.05,
           f"bf16 allreduce on {dev}: off the float32 call")


def fsdp_collectives(rank, p, dev, c):
    n = 1009
    for dtype in (torch.float32, torch.bfloat16):
        outs = []
        for where in (torch.device("cpu"), dev):
            rs = fsdp.CompressedReduceScatter(hopwise.torch._C.ShardedCodecState("int8:ef=1", rank, p, 1), "c")
            ag = fsdp.CompressedAllGather(hopwise.torch._C.ShardedCodecState("int8", rank, p, 1), "c")
            x = torch.randn(n * p, generator=torch.Generator().manual_seed(rank)).to(where, dtype)
            out = torch.empty(n, device=where, dtype=dtype)
            rs(out, x, dist.group.WORLD, dist.ReduceOp.AVG)
            full = torch.empty(n * p, device=where, dtype=dtype)
            ag(full, out, dist.group.WORLD)
            outs.append(full.cpu())
        c.true(torch.equal(outs[0], outs[1]), f"FSDP2 reduce-scatter and all-gather {dtype} on {dev}: other bits")


def main():
    dev = torch.device("cuda", 0) if DEVICE == "cuda" else torch.device("cpu")  # two ranks share one GPU
    if DEVICE == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("hopwise")
    rank, p = dist.get_rank(), dist.get_world_size()
    c = Checks(rank)
    methods(rank, dev, c)
    allreduce(rank, dev, c)
    fsdp_collectives(rank, p, dev, c)
    dist.barrier()
    print(f"rank {rank}: CUDA placement ok: {c.count} checks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
