"""DiLoCo around a trainer's own loop, without DDP: each rank trains its replica with its own (inner) optimizer, and
every H steps the ranks' pseudo-gradients are averaged over the hopwise group and applied by an outer SGD with
Nesterov momentum (the C++ averager's "diloco" method: streaming fragments, a delay behind compute, any codec).

    model = Net()                                            # a plain model: no DDP
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    diloco = hopwise.torch.DiLoCo(model, opt, "diloco:period=4,fragments=4,delay=1,codec=int4")
    for x, y in data:                                        # this rank's own shard
        opt.zero_grad(); loss_fn(model(x), y).backward()
        opt.step()
        diloco.step()                                        # counts the step; syncs every H steps
    with diloco.mean_model():                                # evaluate the ranks' mean model
        evaluate(model)

Construction broadcasts rank 0's parameters (every rank starts from the same model) and moves them into one flat
buffer (each ``p.data`` becomes a view of it; the optimizer keeps working on the same parameters). With ``warmup=W``
the first W steps are synchronous: call ``diloco.average_gradients()`` after backward (it does nothing on local
steps), or use ``diloco.optimizer_step()``, which does that, the inner step and ``step()`` in one call.

Checkpoints: ``state_dict()`` holds the averager's state (binary: the synced model, the outer momentum, the codec's
residuals, the step count) and the inner optimizer's; the model's parameters are the caller's to save. Resume in
this order: build the model, the optimizer and the DiLoCo (which broadcasts rank 0's model), then load the model's
own parameters (each rank its own: mid-period they differ), then ``diloco.load_state_dict(...)``; the run then ends
where the uninterrupted one would, bit for bit.

That spec streams a quarter of the model every step as int4 with error feedback, one step behind compute, and
averages plainly every 4 steps: on the byte-level GPT after AdamW it reached DDP's loss 11x sooner at 100 Mbit/s
(docs/results/lm.md). ``diloco:auto`` measures the step and the link in the first steps and picks the period,
fragments, delay and codec, then checks its choice on the steps that follow.

A lost, stopped or new replica (under hopwise.torch.ElasticContext, no restart): ``detach()`` after the failed
``step()``, ``ctx.shrink()``, then ``regroup()``: the survivors keep the synced model and outer momentum and redo the
broken sync over themselves; a newcomer builds its DiLoCo with ``join=True`` and takes that state (docs/diloco.md,
"When a replica is lost, stopped or comes back").

The outer step: where the spec names none (no ``outer_lr``, ``momentum`` or ``nesterov``), the one measured for the
inner optimizer's family, told to the averager as ``inner=``: ``adam`` for Adam, AdamW, NAdam, RAdam, Adamax and
Adagrad, ``sgd`` for SGD, ``muon`` for Muon (plain averaging after all of them, but the papers' Nesterov step after
SGD from period 128 on). Another optimizer gets plain averaging, the conservative rule, and one line saying so. The
papers' ``outer_lr=0.7,momentum=0.9`` stalled this GPT after AdamW at period 32 and 64; name it only where it was
measured to win.
"""
import contextlib

import torch

from .averaging import ModelAverager, parse_averaging


def _families():
    """torch's optimizer classes by the family the outer rule knows (Muon where this torch has it)."""
    o = torch.optim
    families = [("adam", (o.Adam, o.AdamW, o.NAdam, o.RAdam, o.Adamax, o.Adagrad)), ("sgd", (o.SGD,))]
    if hasattr(o, "Muon"):
        families.append(("muon", (o.Muon,)))
    return families


def inner_family(inner_optimizer):
    """The family of the outer rule for this optimizer: 'adam', 'sgd', 'muon', or None for one it does not know."""
    for family, classes in _families():
        if isinstance(inner_optimizer, classes):
            return family
    return None


def _with_inner(spec, inner_optimizer):
    """A diloco spec without inner=: the inner optimizer's family added (nothing for one the rule does not know: the
    averager then says it takes the conservative rule)."""
    parsed = parse_averaging(spec)
    if parsed["method"] != "diloco" or parsed["inner"]:
        return spec
    family = inner_family(inner_optimizer)
    if family is None:
        return spec
    return spec + ("," if ":" in spec else ":") + f"inner={family}"


class DiLoCo:
    def __init__(self, model, inner_optimizer, spec, group=None, placement="auto", join=False):
        """placement: "auto" (a float32 CPU model in place; a GPU or bf16/fp16 model host-staged: the synced copy,
        outer momentum and residuals in float32 host memory, fragments copied on a side stream) or "host"; see
        hopwise.torch.averaging. join: this process joins the running job (``ElasticContext.joined_late``): it takes
        the members' synced model, outer momentum and step count (they call ``regroup()`` after ``admit()``)."""
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"hopwise: DiLoCo takes the model (a torch.nn.Module), not {type(model).__name__}")
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            raise ValueError("hopwise: DiLoCo runs without DDP: pass the plain model (each rank trains its replica)")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise ValueError(f"hopwise: DiLoCo's inner_optimizer must be a torch.optim.Optimizer, not "
                             f"{type(inner_optimizer).__name__}")
        spec = _with_inner(spec, inner_optimizer)
        method = parse_averaging(spec)["method"]
        if method != "diloco":
            raise ValueError(f"hopwise: DiLoCo takes a diloco spec (e.g. 'diloco:period=32'), not method '{method}'; "
                             f"hopwise.torch.ModelAverager runs the others")
        params = {id(p) for p in model.parameters()}
        for g in inner_optimizer.param_groups:
            for p in g["params"]:
                if id(p) not in params:
                    raise ValueError("hopwise: DiLoCo's inner optimizer holds a tensor that is not one of the model's "
                                     "parameters")
        self.model = model
        self.inner_optimizer = inner_optimizer
        self.process_group = group
        if join and parse_averaging(spec)["auto"]:
            raise ValueError("hopwise: a newcomer joins a fixed diloco spec; diloco:auto's probe starts over on a change "
                             "of members (build the DiLoCo anew on every member)")
        self.averager = ModelAverager(spec, model, group, placement=placement, _caller="DiLoCo", join=join)
        self._spec = self.averager.spec  # canonical, as constructed (diloco:auto's pick is the averager's state)

    @property
    def spec(self):
        return self._spec

    @property
    def steps(self):
        return self.averager.steps

    def average_gradients(self):
        """After backward, before the inner step: the gradients averaged over the world on warmup steps; nothing on
        local ones (every step after the warmup)."""
        self.averager.average_gradients(self.model)

    def step(self):
        """After ``inner_optimizer.step()``: counts the step and runs the method's outer sync when it is due (every
        H / F steps a fragment; blocking, or started behind compute with ``delay``)."""
        self.averager.before_step()
        self.averager.after_step()

    def optimizer_step(self):
        """``average_gradients()``, ``inner_optimizer.step()`` and ``step()`` in one call, after backward."""
        self.average_gradients()
        self.inner_optimizer.step()
        self.step()

    def detach(self):
        """After ``step()`` (or another collective call) raised because a replica was lost or stopped, before
        ``ElasticContext.shrink()``: the sync in flight is kept where it completed here, else redone at regroup()."""
        self.averager.detach()

    def regroup(self, group=None):
        """After ``ElasticContext.shrink()`` or ``admit()``, on every member (and the newcomers' constructors):
        DiLoCo goes on over the replicas here from the outer state they share; the sync the loss broke is redone over
        them, each survivor's pseudo-gradient weighted equally (the lost replica's progress since the last sync goes
        with it). Returns what happened, one line."""
        self.process_group = group
        return self.averager.regroup(group)

    def full_average(self):
        """Every rank's parameters replaced by the world's mean (what is in flight awaited first). Collective."""
        self.averager.full_average()

    def settle(self):
        """Waits for the fragment in flight, keeping it (applied at its step as ever): before an evaluation that is
        off the clock, so that the evaluation does not wait on the link for the trainer."""
        self.averager.settle()

    @contextlib.contextmanager
    def mean_model(self):
        """Within the block the parameters hold the world's mean model; after it, each rank's own again."""
        with self.averager.mean_model():
            yield

    def stats(self):
        """The averager's counts (syncs, bytes, wait_ms, comm_ms, hidden_ms: the all-reduce time compute ran beside,
        state_bytes) with bytes_per_sync, hidden_fraction and, for diloco:auto once measured, its pick (what it chose
        and why) and choice (its last decision: the pick, then what its check decided)."""
        s = dict(self.averager.stats())
        s["bytes_per_sync"] = s["bytes"] / s["syncs"] if s["syncs"] else 0.0
        s["hidden_fraction"] = s["hidden_ms"] / s["comm_ms"] if s["comm_ms"] > 0 else 0.0
        s["choice"] = self.averager._impl.choice()
        s["pick"] = self.averager._impl.pick()
        return s

    def state_dict(self):
        """The averager's state (bytes) and the inner optimizer's; the model's parameters are the caller's."""
        return {"spec": self.spec, "averager": self.averager.state_dict(),
                "inner_optimizer": self.inner_optimizer.state_dict()}

    def load_state_dict(self, saved):
        """After the model's own parameters are loaded (see the module's note on the order)."""
        if saved.get("spec") != self.spec:
            raise ValueError(f"hopwise: the saved DiLoCo state is for '{saved.get('spec')}', this one runs "
                             f"'{self.spec}'")
        self.inner_optimizer.load_state_dict(saved["inner_optimizer"])
        self.averager.load_state_dict(saved["averager"])
