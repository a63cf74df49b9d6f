"""One rank of the hopwise.torch.DiLoCo check, a small MLP, each rank its own deterministic data, no DDP:

- diloco with outer_lr 1, momentum 0, no codec, one fragment gives the parameters ModelAverager("local:period=H")
  gives, bit for bit;
- diloco with outer_lr 0.7 and Nesterov momentum 0.9 agrees to 1e-6 with a serial simulation of every rank in plain
  torch, the outer step torch.optim.SGD(nesterov=True) on the pseudo-gradient;
- a run saved mid-period (state_dict through torch.save/torch.load), rebuilt from fresh objects and resumed ends
  with the parameters of the uninterrupted run, bit for bit (blocking, and streamed with a delay and a codec);
- stats, diloco:auto's inner optimizer, the refusals.

Prints "rank R: diloco ok: N checks" on success."""
import io
import sys

import torch
import torch.distributed as dist

import hopwise.torch
from checks import Checks
from hopwise.torch.diloco import _with_inner

IN, HIDDEN, OUT, LR, H = 13, 16, 5, 0.05, 4



def data(r, t):
    g = torch.Generator().manual_seed(1000 * r + t)
    return torch.randn(8, IN, generator=g), torch.randn(8, OUT, generator=g)


def make_model(seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))


def make_inner(model, kind):
    if kind == "adam":
        return torch.optim.Adam(model.parameters(), lr=0.01)
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def inner_step(model, opt, r, t):
    opt.zero_grad()
    x, y = data(r, t)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()


def run_diloco(spec, steps, rank, inner="sgd", start=0, model=None, opt=None, diloco=None):
    if model is None:
        model = make_model()
        opt = make_inner(model, inner)
        diloco = hopwise.torch.DiLoCo(model, opt, spec)
    for t in range(start, steps):
        inner_step(model, opt, rank, t)
        diloco.step()
    return model, opt, diloco


def local_parity(rank, c, steps=14):
    a, _, d = run_diloco(f"diloco:period={H},outer_lr=1,momentum=0,codec=none,fragments=1", steps, rank)
    model = make_model()
    opt = make_inner(model, "sgd")
    avg = hopwise.torch.ModelAverager(f"local:period={H}", model)
    for t in range(steps):
        opt.zero_grad()
        x, y = data(rank, t)
        torch.nn.functional.mse_loss(model(x), y).backward()
        avg.average_gradients()
        avg.before_step()
        opt.step()
        avg.after_step()
    c.true(torch.equal(flat(a), flat(model)), f"diloco (lr 1, no momentum) vs local: max difference "
                                              f"{float((flat(a) - flat(model)).abs().max())}")
    c.true(isinstance(avg.state_dict()["state"], bytes), "ModelAverager.state_dict()'s state is bytes")
    c.true(d.stats()["syncs"] == steps // H, f"syncs {d.stats()}")


def outer_reference(rank, p, c, steps=14, outer_lr=0.7, momentum=0.9):
    spec = f"diloco:period={H},outer_lr={outer_lr},momentum={momentum},nesterov=1,codec=none,fragments=1"
    got, _, _ = run_diloco(spec, steps, rank)
    # Every rank simulated here: its own replica and inner optimizer; every H steps the pseudo-gradient (synced
    # minus the ranks' mean) stepped by torch's Nesterov SGD on the synced model, which every rank then takes.
    models = [make_model() for _ in range(p)]
    opts = [make_inner(m, "sgd") for m in models]
    synced = torch.nn.Parameter(flat(models[0]).clone())
    outer = torch.optim.SGD([synced], lr=outer_lr, momentum=momentum, nesterov=True)
    for t in range(steps):
        for r in range(p):
            inner_step(models[r], opts[r], r, t)
        if (t + 1) % H == 0:
            mean = sum(flat(m) for m in models) / p
            outer.zero_grad()
            synced.grad = synced.detach() - mean
            outer.step()
            for m in models:
                with torch.no_grad():
                    torch.nn.utils.vector_to_parameters(synced.detach().clone(), m.parameters())
    want = flat(models[rank])
    off = float((flat(got) - want).abs().max())
    c.true(off <= 1e-6, f"diloco vs the plain-torch outer Nesterov step: off by {off}")
    return off


def resume(spec, inner, save_at, rank, c, steps=14):
    straight, _, _ = run_diloco(spec, steps, rank, inner)
    model, opt, diloco = run_diloco(spec, save_at, rank, inner)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "diloco": diloco.state_dict()}, buf)
    del model, opt, diloco
    buf.seek(0)
    saved = torch.load(buf)  # weights_only, torch's default
    c.true(isinstance(saved["diloco"]["averager"]["state"], bytes), "the averager's state is bytes")
    model = make_model(seed=99)  # fresh objects; the parameters come from the checkpoint
    opt = make_inner(model, inner)
    diloco = hopwise.torch.DiLoCo(model, opt, spec)
    model.load_state_dict(saved["model"])
    diloco.load_state_dict(saved["diloco"])
    c.true(diloco.steps == save_at, f"steps after load: {diloco.steps}")
    resumed, _, diloco = run_diloco(spec, steps, rank, inner, start=save_at, model=model, opt=opt, diloco=diloco)
    off = float((flat(resumed) - flat(straight)).abs().max())
    c.true(torch.equal(flat(resumed), flat(straight)), f"{spec} ({inner}), saved at step {save_at}: the resumed "
                                                       f"run ends off the uninterrupted one by {off}")
    return diloco


def stats_and_auto(rank, c):
    spec = f"diloco:period={H},fragments=2,delay=1,codec=int8"
    model, _, d = run_diloco(spec, 12, rank)
    s = d.stats()
    n = flat(model).numel()
    for key in ("syncs", "bytes", "bytes_per_sync", "comm_ms", "hidden_ms", "hidden_fraction", "state_bytes",
                "wait_ms", "choice", "pick"):
        c.true(key in s, f"stats lacks {key}: {s}")
    c.true(s["pick"] == "" and s["choice"] == "", f"a fixed spec picks nothing: {s}")
    c.true(s["syncs"] >= 4 and 0 < s["bytes_per_sync"] < n * 4 / 2 * 0.5, f"int8 fragments' bytes per sync: {s}")
    c.true(0 <= s["hidden_ms"] <= s["comm_ms"] + 1e-9 and s["state_bytes"] > 0, f"stats {s}")
    with d.mean_model():
        mean = flat(model).clone()
    everyone = [torch.empty_like(mean) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mean)
    c.true(all(torch.equal(e, mean) for e in everyone), "mean_model is the same on every rank")
    m = make_model()
    c.true(_with_inner("diloco:auto", torch.optim.AdamW(m.parameters())).endswith("inner=adam"), "auto + AdamW")
    c.true(_with_inner("diloco:auto,target=0.9", torch.optim.Adam(m.parameters())).endswith(",inner=adam"), "Adam")
    c.true(_with_inner("diloco:auto", torch.optim.SGD(m.parameters(), lr=0.1)).endswith("inner=sgd"), "auto + SGD")
    c.true(_with_inner("diloco:auto,inner=sgd", torch.optim.Adam(m.parameters())) == "diloco:auto,inner=sgd",
           "inner= given stays")
    c.true(_with_inner("diloco:period=8", torch.optim.Adam(m.parameters())) == "diloco:period=8,inner=adam",
           "a fixed period takes the family too (its outer step where none is named)")
    for cls in (torch.optim.NAdam, torch.optim.RAdam, torch.optim.Adamax, torch.optim.Adagrad):
        c.true(_with_inner("diloco:auto", cls(m.parameters())).endswith("inner=adam"), f"{cls.__name__}: adam")
    if hasattr(torch.optim, "Muon"):
        w = [p for p in m.parameters() if p.dim() == 2]
        c.true(_with_inner("diloco:auto", torch.optim.Muon(w)).endswith("inner=muon"), "Muon: muon")
    c.true(_with_inner("diloco:auto", torch.optim.RMSprop(m.parameters())) == "diloco:auto",
           "an optimizer the rule does not know: not named (the averager says it takes the conservative rule)")
    c.true(_with_inner("local:period=8", torch.optim.Adam(m.parameters())) == "local:period=8", "not diloco")
    d = hopwise.torch.DiLoCo(m, torch.optim.AdamW(m.parameters()), "diloco:auto")
    c.true(hopwise.torch.parse_averaging(d.spec)["inner"] == "adam", f"diloco:auto's spec: {d.spec}")
    a = hopwise.torch.ModelAverager("diloco:period=8", make_model(), optimizer=torch.optim.NAdam(m.parameters()))
    parsed = hopwise.torch.parse_averaging(a.spec)
    c.true(parsed["inner"] == "adam" and parsed["outer_lr"] == 1 and parsed["momentum"] == 0,
           f"ModelAverager(optimizer=NAdam): the adam rule, plain averaging: {parsed}")
    for call, words in [(lambda: hopwise.torch.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=1), "local:period=4"),
                         "not method 'local'"),
                        (lambda: hopwise.torch.DiLoCo(m, "sgd", "diloco:period=4"), "torch.optim.Optimizer"),
                        (lambda: hopwise.torch.DiLoCo(m, torch.optim.SGD(m.parameters(), lr=1), "diloco:period=0"),
                         "period")]:
        try:
            call()
        except ValueError as e:
            c.true(words in str(e), f"refusal says: {e}")
        else:
            raise AssertionError(f"not refused: {words}")


def main():
    dist.init_process_group("hopwise")
    rank, p = dist.get_rank(), dist.get_world_size()
    c = Checks()
    local_parity(rank, c)
    off = outer_reference(rank, p, c)
    for spec, inner, save_at in [(f"diloco:period={H},outer_lr=0.7,momentum=0.9", "sgd", 6),
                                 (f"diloco:period={H},outer_lr=0.7,momentum=0.9", "adam", 5),
                                 (f"diloco:period={H},outer_lr=0.7,momentum=0.9,fragments=2,delay=1,codec=int8",
                                  "adam", 6)]:
        resume(spec, inner, save_at, rank, c)
    stats_and_auto(rank, c)
    dist.barrier()
    print(f"rank {rank}: diloco ok: {c.count} checks (outer step off the reference by {off:.2g})", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
