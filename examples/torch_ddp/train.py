#!/usr/bin/env python3
"""DDP on Fashion-MNIST with the backend and comm hook of your choice: hopwise beside gloo, same model and data.

    PYTHONPATH=build/python scripts/venv.sh torchrun --standalone --nproc_per_node 2 examples/torch_ddp/train.py \\
        --backend hopwise --hook powersgd:rank=4 --epochs 1 --json out.json
    mpirun -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 -x PYTHONPATH=build/python \\
        "$(scripts/venv.sh --path)/bin/python" examples/torch_ddp/train.py ...

Models: mlp (784-1024-1024-10, the C++ train_mnist's) and cnn (two conv layers). Hooks: none (DDP's own
allreduce), any hopwise codec spec (fp16, bf16, int8:ef=1, qsgd, terngrad, sign, topk:ratio=0.01, randomk,
powersgd:rank=4, ...; backend hopwise only), or torch's own: torch-fp16, torch-powersgd:rank=4.
--diloco SPEC (e.g. diloco:period=8,codec=int8, or diloco:auto) trains without DDP:
each rank its replica with the inner optimizer (SGD, momentum 0.9), hopwise.torch.DiLoCo syncing every H steps.
Prints the plan, a progress bar, then one line per epoch; --json FILE writes step_ms, compute_ms (a step with
DDP's communication off, no_sync, its optimizer step included), utilization (compute / step), test_accuracy,
images_per_s, bytes_per_step (and under --diloco its stats: syncs, bytes_per_sync, comm_ms, hidden_ms, ...).
Denormal floats are flushed to zero (torch.set_flush_denormal; --keep-denormals leaves them).
Needs PYTHONPATH=build/python for hopwise (scripts/setup.sh and scripts/build.sh make it)."""
import argparse
import contextlib
import copy
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def load_images(path):
    with gzip.open(path) as f:
        data = f.read()
    n = int.from_bytes(data[4:8], "big")
    return torch.from_numpy(np.frombuffer(data, np.uint8, offset=16).reshape(n, 1, 28, 28).astype(np.float32) / 255)


def load_labels(path):
    with gzip.open(path) as f:
        return torch.from_numpy(np.frombuffer(f.read(), np.uint8, offset=8).astype(np.int64))


def make_model(name, hidden):
    torch.manual_seed(1)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(16, 32, 5, padding=2),
                         nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                         nn.Linear(128, 10))


def register_hook(ddp, spec, backend):
    if spec == "none":
        return
    if spec == "torch-fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    if spec.startswith("torch-powersgd"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        rank = int(spec.split("rank=")[1]) if "rank=" in spec else 4
        ddp.register_comm_hook(ps.PowerSGDState(None, matrix_approximation_rank=rank, start_powerSGD_iter=2),
                               ps.powerSGD_hook)
        return
    if backend != "hopwise":
        sys.exit(f"train.py: hook '{spec}' is a hopwise codec; it needs --backend hopwise")
    import hopwise.torch
    state, hook = hopwise.torch.compression_hook(spec)
    ddp.register_comm_hook(state, hook)
    return state


def progress(done, total, text):
    width = 30
    filled = int(width * done / max(1, total))
    sys.stdout.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text}")
    sys.stdout.flush()
    console_line_open(True)


def console_line_open(is_open):
    """Tells hopwise (when loaded) whether the bar's line is open: its warnings and monitor lines end it first."""
    if "hopwise.torch" in sys.modules:
        sys.modules["hopwise.torch"].set_console_line_open(is_open)


def link_sent():
    """What this host's network links have sent (the emulated host's veth: what crossed its slow link), per rank of
    the host, or None in a job on one host (loopback only, and the machine's other interfaces carry others' bytes).
    Read from /proc/self/net/dev, which is this process's network namespace's."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if local >= dist.get_world_size():
        return None
    sent = 0
    with open("/proc/self/net/dev") as fh:
        for line in fh.readlines()[2:]:
            name, _, counters = line.partition(":")
            if name.strip() != "lo":
                sent += int(counters.split()[8])
    return sent / local


def link_bytes_per_step(before, during_eval, steps):
    """What the ranks' links sent per step per rank since `before` (a link_sent() reading), what `during_eval`
    evaluations sent left out: the same count for every row of a benchmark. None in a job on one host. Collective."""
    if before is None:
        return None
    sent = torch.tensor([(link_sent() - before - during_eval) / max(1, steps)], dtype=torch.float64)
    dist.all_reduce(sent)
    return sent.item() / dist.get_world_size()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="hopwise", choices=["hopwise", "gloo"])
    ap.add_argument("--hook", default="none")
    ap.add_argument("--averaging", default="sync",
                    help="hopwise.torch.ModelAverager spec: sync, local:period=H[,warmup=W], hier:period=H, gossip, "
                         "async:period=H[,codec=int8] (backend hopwise, hook none)")
    ap.add_argument("--diloco", default="",
                    help="a diloco spec: no DDP, each rank trains its replica and hopwise.torch.DiLoCo syncs them")
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--epochs", type=float, default=1, help="may be fractional")
    ap.add_argument("--batch", type=int, default=128, help="global batch, split across ranks")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--target-accuracy", type=float, default=0,
                    help="stop once the test accuracy reaches this (checked every --eval-every steps, off the clock)")
    ap.add_argument("--eval-every", type=int, default=20)
    ap.add_argument("--trace-accuracy", action="store_true",
                    help="check the test accuracy every --eval-every steps (off the clock) and record it")
    ap.add_argument("--json", default="")
    ap.add_argument("--monitor", default="",
                    help="hopwise.torch.Monitor: a line per interval on rank 0, e.g. interval=10s (HOPWISE_MONITOR, "
                         "HOPWISE_UTIL_ALERT, HOPWISE_METRICS_FILE, HOPWISE_METRICS_JSON apply)")
    ap.add_argument("--data", default=os.environ.get("HOPWISE_MNIST_DIR", "/usr/share/datasets/fashion-mnist"))
    ap.add_argument("--checkpoint", default="",
                    help="PATH: every --checkpoint-every steps each rank writes PATH.step<S>.rank<R> (model, optimizer, "
                         "hook and averager state; torn by no kill) and keeps its two newest (backend hopwise)")
    ap.add_argument("--checkpoint-every", type=int, default=0)
    ap.add_argument("--resume", default="", choices=["", "auto"],
                    help="auto: start from the newest step every rank holds of --checkpoint's files, if any (for "
                         "torchrun --max-restarts)")
    ap.add_argument("--keep-denormals", action="store_true",
                    help="leave denormal floats on (by default they are flushed to zero)")
    args = ap.parse_args()
    # A run slowed 2x after ~900 steps, as values decayed into denormals, until they were flushed to zero. Set on
    # this thread before any other starts (the backend's progress thread, torch's pools), which inherit it.
    if not args.keep_denormals:
        torch.set_flush_denormal(True)
    if (args.checkpoint_every or args.resume) and not args.checkpoint:
        sys.exit("train.py: --checkpoint-every and --resume auto need --checkpoint PATH")
    if args.checkpoint and args.backend != "hopwise":
        sys.exit("train.py: --checkpoint uses hopwise.torch.Checkpoints: --backend hopwise")

    if "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun: env:// reads RANK and WORLD_SIZE
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if args.backend == "hopwise":
        import hopwise.torch  # noqa: F401  (registers the backend)
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.batch % world:
        sys.exit(f"train.py: --batch {args.batch} does not split across {world} ranks")
    lead = rank == 0

    x, y = load_images(f"{args.data}/train-images-idx3-ubyte.gz"), load_labels(f"{args.data}/train-labels-idx1-ubyte.gz")
    tx, ty = load_images(f"{args.data}/t10k-images-idx3-ubyte.gz"), load_labels(f"{args.data}/t10k-labels-idx1-ubyte.gz")
    model = make_model(args.model, args.hidden)
    avg = diloco = None
    if args.diloco and (args.backend != "hopwise" or args.hook != "none" or args.averaging != "sync"):
        sys.exit("train.py: --diloco needs --backend hopwise, --hook none and --averaging sync (DiLoCo is the method)")
    if args.averaging != "sync":
        if args.backend != "hopwise" or args.hook != "none":
            sys.exit("train.py: --averaging needs --backend hopwise and --hook none (the averager brings its own hook)")
        avg = hopwise.torch.ModelAverager(args.averaging, model)  # before DDP: the parameters move to one buffer
    hook_state = None
    if args.diloco:  # no DDP: the plain model, its inner optimizer, DiLoCo around them
        ddp = model
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
        diloco = hopwise.torch.DiLoCo(model, opt, args.diloco)  # broadcasts rank 0's model
    else:
        ddp = DDP(model, bucket_cap_mb=args.bucket_mb)
        if avg:
            ddp.register_comm_hook(*avg.comm_hook())
        else:
            hook_state = register_hook(ddp, args.hook, args.backend)
        opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    ckpt = hopwise.torch.Checkpoints(args.checkpoint) if args.checkpoint else None
    start = 0
    found = ckpt.load_newest() if ckpt and args.resume == "auto" else None
    if found:
        start, state = found
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        if hook_state is not None:
            hook_state.load_state_dict(state["hook"])
        if avg:
            avg.load_state_dict(state["averager"])
        if diloco:
            diloco.load_state_dict(state["diloco"])  # after the model's own parameters

    def save_checkpoint(step):
        """Under an averaging method a full average first (as an uninterrupted run with these flags does too)."""
        if avg:
            avg.full_average()
        ckpt.save(step, {"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "hook": hook_state.state_dict() if hook_state is not None else None,
                         "averager": avg.state_dict() if avg else None,
                         "diloco": diloco.state_dict() if diloco else None})  # mid-period: each rank its own
    monitor = None
    if args.backend == "hopwise" and (args.monitor or os.environ.get("HOPWISE_MONITOR")
                                      or os.environ.get("HOPWISE_METRICS_FILE") or os.environ.get("HOPWISE_METRICS_JSON")):
        if args.monitor:
            os.environ["HOPWISE_MONITOR"] = args.monitor
        monitor = hopwise.torch.Monitor(job="torch_ddp")
    loss_fn = nn.CrossEntropyLoss()
    local = args.batch // world
    steps = int(args.epochs * (x.shape[0] // args.batch))
    params = sum(p.numel() for p in model.parameters())
    if lead:
        print(f"train.py: {world} ranks, backend {args.backend}, hook {args.hook}, "
              f"{'diloco ' + diloco.spec + ', ' if diloco else ''}model {args.model} "
              f"({params} parameters, {params * 4 / 2**20:.1f} MiB of gradients per step), global batch {args.batch}, "
              f"{steps} steps")
        if args.backend == "hopwise":
            print(hopwise.torch.plan()["description"].rstrip())
        if found:
            print(f"train.py: resumed at step {start} from {args.checkpoint}")

    def batch(i):
        lo = (i * args.batch + rank * local) % (x.shape[0] - local)
        return x[lo:lo + local], y[lo:lo + local]

    def compute_only(n):
        """Forward, backward and the optimizer step without DDP's communication: the compute a step cannot do
        without (as train_mnist counts it). The model and optimizer are put back as they were afterwards."""
        kept = copy.deepcopy((model.state_dict(), opt.state_dict()))
        t0 = time.perf_counter()
        for i in range(n):
            xb, yb = batch(i)
            opt.zero_grad()
            with ddp.no_sync() if not diloco else contextlib.nullcontext():
                loss_fn(ddp(xb), yb).backward()
            opt.step()
        took = (time.perf_counter() - t0) / n * 1e3
        with torch.no_grad():
            model.load_state_dict(kept[0])
        opt.load_state_dict(kept[1])
        return took

    def stats():
        return hopwise.torch.stats() if args.backend == "hopwise" else {"bytes": 0, "wire_bytes": 0}

    def accuracy():
        """Every rank scores a slice of the test set; the counts are summed. Under an averaging method, of the
        ranks' mean model (their own left as they are)."""
        if avg or diloco:
            with (avg or diloco).mean_model():
                return plain_accuracy()
        return plain_accuracy()

    def plain_accuracy():
        model.eval()
        with torch.no_grad():
            mine = slice(rank * len(tx) // world, (rank + 1) * len(tx) // world)
            right = torch.tensor([(model(tx[mine]).argmax(1) == ty[mine]).sum().item(), len(ty[mine])])
        model.train()
        dist.all_reduce(right)
        return right[0].item() / right[1].item()

    compute_ms = compute_only(10)  # the first also warms up
    compute_ms = compute_only(20)
    opt.zero_grad()
    dist.barrier()
    before, link_before, eval_link = stats(), link_sent(), 0.0
    t0 = time.perf_counter()
    loss_sum, losses = 0.0, 0
    paused = 0.0  # seconds spent on evaluation, taken off the training time
    reached = None  # (steps, training seconds) when the target accuracy was first reached
    trace = []  # (steps, training seconds, test accuracy) with --trace-accuracy
    for i in range(start, steps):
        xb, yb = batch(i)
        opt.zero_grad()
        loss = loss_fn(ddp(xb), yb)
        loss.backward()
        if avg:
            avg.before_step()
        opt.step()
        if avg:
            avg.after_step()
        if diloco:
            diloco.step()  # counts the step; an outer sync every H / F steps
        if monitor:
            monitor.step()
        loss_sum, losses = loss_sum + loss.item(), losses + 1
        if ckpt and args.checkpoint_every and (i + 1) % args.checkpoint_every == 0:
            save_checkpoint(i + 1)
        if lead and (i % 20 == 0 or i == steps - 1):
            progress(i + 1, steps, f"loss {loss_sum / losses:.3f} "
                     f"{(time.perf_counter() - t0 - paused) / (i + 1 - start) * 1e3:.1f} ms/step")
        if (args.target_accuracy or args.trace_accuracy) and ((i + 1) % args.eval_every == 0 or i == steps - 1):
            if avg or diloco:
                (avg or diloco).settle()  # what is in flight is waited for on the clock, as in training
            e0, l0 = time.perf_counter(), link_sent()
            acc = accuracy()
            eval_link += link_sent() - l0 if l0 is not None else 0
            trace.append((i + 1, e0 - t0 - paused, acc))
            if args.target_accuracy and acc >= args.target_accuracy:
                reached = (i + 1, e0 - t0 - paused)
            paused += time.perf_counter() - e0
            if reached:
                steps = i + 1
                break
    if avg or diloco:
        (avg or diloco).full_average()  # every rank the same model, as the final evaluation scores it
    if monitor:
        monitor.finish()
    dist.barrier()
    train_s = time.perf_counter() - t0 - paused
    after = stats()
    link = link_bytes_per_step(link_before, eval_link, steps - start)
    if lead:
        print()
        console_line_open(False)

    test_accuracy = accuracy()
    ran = steps - start  # this process's steps
    step_ms = train_s / max(1, ran) * 1e3
    result = {
        "backend": args.backend, "hook": args.hook, "averaging": args.averaging, "diloco": args.diloco or None,
        "model": args.model, "ranks": world, "steps": steps,
        "step_ms": step_ms, "compute_ms": compute_ms, "utilization": min(1.0, compute_ms / step_ms),
        "test_accuracy": test_accuracy, "target_accuracy": args.target_accuracy,
        "steps_to_target": reached[0] if reached else None, "time_to_target_s": reached[1] if reached else None,
        "accuracy_trace": trace, "images_per_s": ran * args.batch / train_s, "resumed_at": start,
        "train_s": train_s, "gradient_bytes_per_step": params * 4,
        "bytes_per_step": (after["bytes"] - before["bytes"]) / max(1, ran) if args.backend == "hopwise" else params * 4,
        "wire_bytes_per_step": (after["wire_bytes"] - before["wire_bytes"]) / max(1, ran),
        "link_bytes_per_step": link,
        "diloco_stats": diloco.stats() if diloco else None,
    }
    if lead:
        print(f"train.py: {steps} steps in {train_s:.1f} s: step {step_ms:.1f} ms, compute {compute_ms:.1f} ms "
              f"(utilization {result['utilization']:.0%}), {result['images_per_s']:.0f} images/s, test accuracy "
              f"{result['test_accuracy']:.4f}")
        if args.target_accuracy:
            print(f"train.py: target accuracy {args.target_accuracy:.4f} " +
                  (f"reached after {reached[0]} steps, {reached[1]:.1f} s of training" if reached else "not reached"))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
