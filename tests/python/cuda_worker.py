"""CUDA tensors through the hopwise backend (the NCCL device communicator), one rank per GPU: each collective the
backend carries on CUDA against a reference computed on the CPU, then DDP on the GPU against plain training.
Exits 77 (ctest: skipped) where there is no CUDA device; run by ctest as torch_cuda (label cuda: gpu-check.sh)."""
import os
import sys

import torch
import torch.distributed as dist

if not torch.cuda.is_available():
    print("torch_cuda: no CUDA device here: skipped")
    sys.exit(77)

import hopwise.torch  # noqa: E402

if not hopwise.torch._C.HAS_CUDA:
    sys.exit("torch_cuda: this hopwise.torch was built without CUDA, yet a CUDA device is here")


def main():
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("hopwise")
    r, n = dist.get_rank(), dist.get_world_size()
    checks = 0

    def expect(got, want, what):
        nonlocal checks
        checks += 1
        got = got.cpu().to(torch.float64)
        want = want.cpu().to(torch.float64)
        if not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
            raise AssertionError(f"rank {r}: {what}: got {got.flatten()[:6].tolist()}, want {want.flatten()[:6].tolist()}")

    def data(rank, size, dtype, seed):
        g = torch.Generator().manual_seed(seed * 100 + rank)
        return torch.randint(-3, 4, (size,), generator=g).to(dtype)

    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int8):
        for size in (0, 1, 7, 65537, 1 << 22):
            ins = [data(q, size, dtype, size) for q in range(n)]
            t = ins[r].to(dev)
            dist.all_reduce(t)
            expect(t, torch.stack([i.to(torch.float64) for i in ins]).sum(0), f"all_reduce {dtype} n={size}")
            if dtype.is_floating_point:
                t = ins[r].to(dev)
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                expect(t, torch.stack([i.to(torch.float64) for i in ins]).mean(0), f"all_reduce AVG {dtype} n={size}")
            t = ins[r].to(dev)
            dist.broadcast(t, n - 1)
            expect(t, ins[n - 1], f"broadcast {dtype} n={size}")
            flat = torch.empty(n * size, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(flat, ins[r].to(dev))
            expect(flat, torch.cat(ins), f"all_gather_into_tensor {dtype} n={size}")
            outs = [torch.empty(size, dtype=dtype, device=dev) for _ in range(n)]
            dist.all_gather(outs, ins[r].to(dev))
            for q in range(n):
                expect(outs[q], ins[q], f"all_gather {dtype} n={size} from {q}")
            full = [data(q, n * size, dtype, size + 1) for q in range(n)]
            mine = torch.empty(size, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(mine, full[r].to(dev))
            want = torch.stack([f.to(torch.float64) for f in full]).sum(0)[r * size:(r + 1) * size]
            expect(mine, want, f"reduce_scatter_tensor {dtype} n={size}")
    # Async on the current stream: the result is there for the next kernel without a host wait.
    t = torch.full((1 << 20,), float(r + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    doubled = t * 2  # enqueued after the allreduce on the caller's stream
    work.wait()
    expect(doubled, torch.full((1 << 20,), float(n * (n + 1))), "stream order")
    expect(work.get_future().value()[0], torch.full((1 << 20,), float(n * (n + 1) / 2)), "future value")

    # DDP on the GPU against the same model trained without DDP on the mean gradient of every rank's batch.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    plain = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)).to(dev)
    plain.load_state_dict(model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt, opt_plain = torch.optim.SGD(ddp.parameters(), lr=0.1), torch.optim.SGD(plain.parameters(), lr=0.1)
    for step in range(5):
        g = torch.Generator().manual_seed(step)
        xs = [torch.randn(8, 32, generator=g) for _ in range(n)]
        ys = [torch.randint(0, 4, (8,), generator=g) for _ in range(n)]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xs[r].to(dev)), ys[r].to(dev)).backward()
        opt.step()
        opt_plain.zero_grad()
        loss = sum(torch.nn.functional.cross_entropy(plain(x.to(dev)), y.to(dev)) for x, y in zip(xs, ys)) / n
        loss.backward()
        opt_plain.step()
    for a, b in zip(model.parameters(), plain.parameters()):
        expect(a.detach(), b.detach(), "DDP on the GPU")
    print(f"rank {r}: {checks} CUDA checks ok on {torch.cuda.get_device_name(dev)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
