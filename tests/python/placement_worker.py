"""One rank of the placement check: hopwise.torch's averagers on models that are not float32 CPU tensors, through
the host-staged path (a float32 host copy the averager fetches from and publishes to, range by range):

- placement="host" on a float32 CPU model (the staged code with CPU copies) ends with the direct path's parameters,
  bit for bit, for every periodic method, codec, fragment and delay setting, mean_model() included, and a run saved
  mid-period and resumed on the staged path ends where the straight one does;
- bfloat16 and float16 models under DiLoCo track a float32 run from the same start (the outer state is float32:
  the difference is the model's own rounding), the replicas end equal after full_average(), and the warm-up's
  gradient averaging works on them;
- the refusals name the class the user called and what is wrong.

Prints "rank R: placement ok: N checks" on success."""
import io
import sys

import torch
import torch.distributed as dist

import hopwise.torch
from checks import Checks

IN, HIDDEN, OUT, LR = 11, 17, 3, 0.05
SPECS = ["local:period=3", "local:period=2,warmup=2", "hier:period=2", "async:period=3,delay=1,codec=int8",
         "gossip:peers=1", "gossip:peers=1,codec=int8", "diloco:period=4,fragments=4,delay=1,codec=int4,inner=adam",
         "diloco:period=4,outer_lr=0.7,momentum=0.9", "diloco:period=6,fragments=3,delay=2,alpha=0.5,codec=int8",
         "diloco:period=4,fragments=2,codec=topk,inner=sgd"]



def data(r, t):
    g = torch.Generator().manual_seed(100 * r + t)
    return torch.randn(8, IN, generator=g), torch.randn(8, OUT, generator=g)


def make_model(dtype=torch.float32):
    torch.manual_seed(5)
    m = torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, OUT))
    return m.to(dtype)


def flat(model):
    return torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])


def train(spec, rank, placement, steps=13, dtype=torch.float32, save_at=None):
    """Trains `steps` steps (SGD, the warm-up's gradients averaged), evaluating the mean model at step 7; returns the
    final parameters and the mean model seen. save_at: the run is saved there and resumed from fresh objects."""
    model = make_model(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    avg = hopwise.torch.ModelAverager(spec, model, placement=placement)
    mean = None
    for t in range(steps):
        if save_at is not None and t == save_at:
            buf = io.BytesIO()
            torch.save({"model": [p.detach().clone() for p in model.parameters()], "avg": avg.state_dict(),
                        "opt": opt.state_dict()}, buf)
            buf.seek(0)
            saved = torch.load(buf, weights_only=False)
            model = make_model(dtype)
            opt = torch.optim.SGD(model.parameters(), lr=LR)
            avg = hopwise.torch.ModelAverager(spec, model, placement=placement)
            with torch.no_grad():
                for p, q in zip(model.parameters(), saved["model"]):
                    p.copy_(q)
            opt.load_state_dict(saved["opt"])
            avg.load_state_dict(saved["avg"])
        opt.zero_grad()
        x, y = data(rank, t)
        torch.nn.functional.mse_loss(model(x.to(dtype)).float(), y).backward()
        avg.average_gradients(model)
        avg.before_step()
        opt.step()
        avg.after_step()
        if t == 7:
            with avg.mean_model():
                mean = flat(model)
    avg.full_average()
    return flat(model), mean, avg


def staged_equals_direct(rank, c):
    for spec in SPECS:
        direct, mean_d, _ = train(spec, rank, "auto")
        staged, mean_s, avg = train(spec, rank, "host")
        c.true(avg.placement == "host", f"{spec}: placement='host' ran {avg.placement}")
        c.true(torch.equal(direct, staged), f"{spec}: the staged path ended off the direct one by "
                                            f"{(direct - staged).abs().max().item():.3g}")
        c.true(torch.equal(mean_d, mean_s), f"{spec}: the staged mean model differs from the direct one")
    for spec, at in [("diloco:period=4,fragments=2,delay=1,codec=int8,inner=adam", 6), ("async:period=3", 4)]:
        straight, _, _ = train(spec, rank, "host")
        resumed, _, _ = train(spec, rank, "host", save_at=at)
        c.true(torch.equal(straight, resumed), f"{spec}: staged, saved at step {at} and resumed, ended elsewhere")


def low_precision(rank, c):
    spec = "diloco:period=4,fragments=2,delay=1,codec=int8,inner=sgd,warmup=2"
    reference, _, _ = train(spec, rank, "auto", steps=21)
    for dtype, bound in [(torch.bfloat16, 0.08), (torch.float16, 0.01)]:
        got, _, avg = train(spec, rank, "auto", steps=21, dtype=dtype)
        c.true(avg.placement == "host", f"a {dtype} model ran {avg.placement}, not host-staged")
        off = (got - reference).abs().max().item()
        c.true(off < bound, f"{dtype}: DiLoCo ended {off:.3g} off the float32 run (bound {bound})")
        everyone = [torch.empty_like(got) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, got)
        c.true(all(torch.equal(e, got) for e in everyone), f"{dtype}: the replicas differ after full_average()")
        c.true(avg.stats()["state_bytes"] > 0, f"{dtype}: no outer state kept")


def refusals(c):
    def refused(make, words):
        try:
            make()
        except ValueError as e:
            c.true(all(w in str(e) for w in words), f"the refusal '{e}' does not name {words}")
            return
        raise AssertionError(f"accepted, where a refusal naming {words} was due")

    m = make_model()
    opt = torch.optim.SGD(m.parameters(), lr=LR)
    m64 = make_model(torch.float64)
    refused(lambda: hopwise.torch.DiLoCo(m64, torch.optim.SGD(m64.parameters(), lr=LR), "diloco:period=4"),
            ["DiLoCo", "float64"])
    refused(lambda: hopwise.torch.ModelAverager("local:period=2", make_model(torch.float64)),
            ["ModelAverager", "float64"])
    mixed = make_model()
    mixed[2].to(torch.bfloat16)
    refused(lambda: hopwise.torch.ModelAverager("local:period=2", mixed), ["ModelAverager", "one device and dtype"])
    refused(lambda: hopwise.torch.ModelAverager("local:period=2", make_model().to("meta")), ["ModelAverager", "meta"])
    refused(lambda: hopwise.torch.DiLoCo(m, opt, "diloco:period=4", placement="device"), ["DiLoCo", "placement"])


def main():
    dist.init_process_group("hopwise")
    rank = dist.get_rank()
    c = Checks()
    staged_equals_direct(rank, c)
    low_precision(rank, c)
    refusals(c)
    dist.barrier()
    print(f"rank {rank}: placement ok: {c.count} checks", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
