"""hopwise.torch.ModelAverager on every method, each rank checked against a serial simulation of all ranks in
plain torch (no distributed): a linear model, each rank its own deterministic data, SGD with momentum, DDP with the
averager's comm hook (or a plain model with average_gradients). Prints "rank R: N methods match" on success."""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import hopwise.torch

IN, OUT, STEPS, EVAL, LR, MOMENTUM = 13, 5, 14, 6, 0.05, 0.9


def data(r, t):
    g = torch.Generator().manual_seed(1000 * r + t)
    return torch.randn(8, IN, generator=g), torch.randn(8, OUT, generator=g)


def initial():
    torch.manual_seed(7)
    return torch.nn.Linear(IN, OUT)


def grads_of(model, r, t):
    model.zero_grad()
    x, y = data(r, t)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def set_flat(model, v):
    with torch.no_grad():
        torch.nn.utils.vector_to_parameters(v, model.parameters())


def simulate(spec, n, ring):
    """The method's definition over n ranks, one thread, plain torch."""
    s = hopwise.torch.parse_averaging(spec)
    method, period, warmup, peers = s["method"], s["period"], s["warmup"], s["peers"]
    models = [initial() for _ in range(n)]
    vel = [[torch.zeros_like(p) for p in m.parameters()] for m in models]
    snap, pending, sent = None, False, None
    k = min(peers, max(1, n - 1))

    def mean_all():
        m = sum(flat(x) for x in models) / n
        for x in models:
            set_flat(x, m.clone())

    def full_average():
        nonlocal pending, sent
        if method != "sync":
            pending, sent = False, None
            mean_all()

    for t in range(1, STEPS + 1):
        gs = [grads_of(models[r], r, t) for r in range(n)]
        if method == "sync" or t <= warmup or method == "hier":  # one host: hier's host is the world
            gs = [[sum(g[i] for g in gs) / n for i in range(len(gs[0]))] for _ in range(n)]
        if method == "gossip" and sent is not None:
            mixed = []
            for pos in range(n):
                r = ring[pos]
                partners = [ring[q] for j in range(k) if (q := hopwise.torch._C.gossip_partner(pos, n, (t - 2) * k + j)) >= 0]
                if k == 1 and len(partners) == 1:
                    mixed.append((r, 0.5 * (sent[r] + sent[partners[0]])))
                else:
                    acc = (k + 1 - len(partners)) * sent[r] + sum(sent[q] for q in partners)
                    mixed.append((r, acc / (k + 1)))
            for r, v in mixed:
                set_flat(models[r], v)
            sent = None
        for r in range(n):
            with torch.no_grad():
                for p, v, g in zip(models[r].parameters(), vel[r], gs[r]):
                    v.mul_(MOMENTUM).add_(g)
                    p.sub_(LR * v)
        after = t > warmup and (t - warmup) % period == 0
        if method in ("local", "hier") and after:
            mean_all()
        elif method == "gossip" and n > 1:
            sent = [flat(m) for m in models]
        elif method == "async" and after:
            if pending:
                avg = sum(snap) / n
                for r in range(n):
                    set_flat(models[r], flat(models[r]) + avg - snap[r])
            snap, pending = [flat(m) for m in models], True
        if t % EVAL == 0:
            full_average()
    full_average()
    return flat(models[0])  # every rank holds it after the final full average


def train(spec, rank, n, ddp):
    model = initial()
    if rank != 0:  # the averager broadcasts rank 0's model
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    avg = hopwise.torch.ModelAverager(spec, model)
    net = model
    if ddp:
        net = DDP(model)
        net.register_comm_hook(*avg.comm_hook())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for t in range(1, STEPS + 1):
        opt.zero_grad()
        x, y = data(rank, t)
        torch.nn.functional.mse_loss(net(x), y).backward()
        if not ddp:
            avg.average_gradients(model)
        avg.before_step()
        opt.step()
        avg.after_step()
        if t % EVAL == 0:
            avg.full_average()
    avg.full_average()
    return avg, model


def main():
    if "OMPI_COMM_WORLD_RANK" in os.environ:  # mpirun: torch's env:// needs these too
        os.environ.setdefault("RANK", os.environ["OMPI_COMM_WORLD_RANK"])
        os.environ.setdefault("WORLD_SIZE", os.environ["OMPI_COMM_WORLD_SIZE"])
    dist.init_process_group("hopwise")
    rank, n = dist.get_rank(), dist.get_world_size()
    ring = hopwise.torch.plan()["ring"]
    specs = ["sync", "local:period=3,warmup=2", "local:period=1", "hier:period=2", "gossip", "gossip:peers=2",
             "async:period=2", "async:period=3,warmup=4"]
    ok = 0
    for spec in specs:
        for ddp in (True, False):
            avg, model = train(spec, rank, n, ddp)
            got, want = flat(model), simulate(spec, n, ring)
            every = [torch.zeros_like(got) for _ in range(n)]
            dist.all_gather(every, got)
            same = all(torch.equal(e, every[0]) for e in every)
            err = (got - want).abs().max().item()
            if err > 1e-5 or not same:
                print(f"rank {rank}: {spec} (ddp={ddp}) differs: max error {err:.3g}, ranks equal {same}", flush=True)
                sys.exit(1)
            ok += 1
    # The mean model for evaluation, the ranks' own untouched; the state round trip; a bad spec named.
    model = torch.nn.Linear(IN, OUT)
    avg = hopwise.torch.ModelAverager("local:period=4", model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(float(rank))
    own = flat(model).clone()
    with avg.mean_model():
        mean = flat(model).clone()
    assert torch.equal(flat(model), own), "mean_model() left the rank's own model changed"
    assert torch.allclose(mean, own - rank + (n - 1) / 2, atol=1e-6), "mean_model() is not the mean"
    for _ in range(5):
        avg.after_step()
    avg.full_average()
    saved = avg.state_dict()
    other = hopwise.torch.ModelAverager("local:period=4,warmup=0", torch.nn.Linear(IN, OUT))
    other.load_state_dict(saved)
    assert other.steps == 5, other.steps
    try:
        hopwise.torch.ModelAverager("local:period=0", torch.nn.Linear(IN, OUT))
        raise AssertionError("period=0 was accepted")
    except ValueError as e:
        assert "period=0 must be a whole number >= 1" in str(e), str(e)
    try:
        hopwise.torch.ModelAverager("async:period=2", other.params).load_state_dict(saved)
        raise AssertionError("another method's state was loaded")
    except ValueError as e:
        assert "saved by 'local:period=4,warmup=0'" in str(e), str(e)
    print(f"rank {rank}: {ok} methods match the serial simulation over {hopwise.torch.plan()['transport']}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
