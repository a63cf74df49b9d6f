"""Fewer synchronization points for torch trainers: hopwise's averaging methods (the C++ ModelAverager, one
implementation for C++ and Python) on a hopwise process group, on CPU, any group (the world or a ``new_group``).

    import hopwise.torch
    dist.init_process_group("hopwise")
    avg = hopwise.torch.ModelAverager("local:period=8,warmup=100", model)  # before DDP
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(*avg.comm_hook())   # gradients averaged as the method says: world, host or not at all
    for x, y in data:
        loss_fn(ddp(x), y).backward()
        avg.before_step()
        opt.step()
        avg.after_step()
    with avg.mean_model():                     # evaluate the ranks' mean model; their own stay as they are
        evaluate(model)
    avg.full_average()                         # before a checkpoint or the end: every rank the same model

Methods: sync, local:period=H[,warmup=W] (post-local SGD), hier:period=H[,warmup=W] (gradients within each host
every step, parameters across hosts every H), gossip[:peers=K][,codec=fp16|bf16|int8] (shift-one pairs on the
planned ring, the exchange overlapping the next gradient), async:period=H[,warmup=W][,delay=D][,codec=...] (a
background average applied D steps later, H by default). Momentum stays local, as in torch's PostLocalSGDOptimizer.

The parameters are moved into one flat float32 buffer (each ``p.data`` becomes a view of it), which the averager
reads and writes in place. Without DDP, call ``avg.average_gradients(model)`` after backward instead of the hook.
"""
import contextlib

import torch
import torch.distributed as dist

from . import _C


def _group(group):
    return dist.distributed_c10d._get_default_group() if group is None else group


def parse_averaging(spec):
    """The spec as a dict (method, period, warmup, peers, codec, spec); ValueError naming the field."""
    return _C.parse_averaging(spec)


class ModelAverager:
    def __init__(self, spec, params, process_group=None, optimizer=None):
        """optimizer: the trainer's optimizer, for a diloco spec without inner=: the outer step where the spec names
        none follows its family (hopwise.torch.DiLoCo passes its own)."""
        if optimizer is not None:
            from .diloco import _with_inner
            spec = _with_inner(spec, optimizer)
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        self.params = [p for p in params]
        if not self.params:
            raise ValueError("hopwise: ModelAverager needs the model's parameters (none were given)")
        for i, p in enumerate(self.params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"hopwise: ModelAverager averages float32 CPU parameters; parameter {i} is "
                                 f"{p.dtype} on {p.device}")
        self.process_group = process_group
        with torch.no_grad():
            flat = torch._utils._flatten_dense_tensors([p.detach() for p in self.params]).contiguous()
            for p, view in zip(self.params, torch._utils._unflatten_dense_tensors(flat, self.params)):
                p.data = view
        self.flat = flat
        self._impl = _C.ModelAverager(_group(process_group), spec, flat)  # broadcasts rank 0's model

    @property
    def spec(self):
        return self._impl.spec

    @property
    def steps(self):
        return self._impl.steps

    def gradient_scope(self):
        """What the coming step's gradients are averaged over: 'world', 'host' or 'none'."""
        return self._impl.gradient_scope()

    def before_step(self):
        """After backward, before ``optimizer.step()`` (gossip mixes the partner's model in here)."""
        self._impl.before_step()

    def after_step(self):
        """After ``optimizer.step()``: the method's averaging of this step (blocking, or started in the background)."""
        self._impl.after_step()

    def full_average(self):
        """Every rank's parameters replaced by the world's mean (what is in flight is awaited first). Collective."""
        self._impl.full_average()

    def settle(self):
        """Waits for what is in flight, keeping it (applied at its step as ever): call it before an evaluation that
        is off the clock, so that the evaluation does not wait on the link for the trainer."""
        self._impl.settle()

    @contextlib.contextmanager
    def mean_model(self):
        """Within the block the parameters hold the world's mean model; after it, each rank's own again."""
        mean = self._impl.mean_model()
        own = self.flat.clone()
        with torch.no_grad():
            self.flat.copy_(mean)
        try:
            yield
        finally:
            with torch.no_grad():
                self.flat.copy_(own)

    def stats(self):
        """Averagings so far, the parameter bytes this rank sent or contributed (a codec's payloads where one is
        set), ms spent waiting on them; the outer path's syncs, comm_ms (its all-reduces' time on the progress
        thread), hidden_ms (the part compute ran beside) and state_bytes (what it keeps beside the model)."""
        return self._impl.stats()

    def comm_hook(self):
        """(state, hook) for ``ddp.register_comm_hook``: each bucket averaged over the step's scope."""
        def hook(state, bucket):
            return state._impl.average_bucket(bucket.buffer()).get_future().then(lambda f: f.value()[0])

        hook.__name__ = "hopwise_averaging_hook"
        return self, hook

    def average_gradients(self, params=None):
        """Without DDP: averages the gradients over the step's scope, in place (call after backward)."""
        if params is None:
            params = self.params
        elif isinstance(params, torch.nn.Module):
            params = params.parameters()
        grads = [p.grad for p in params if p.grad is not None]
        self._impl.average_gradients(grads)

    def state_dict(self):
        """The method's state for a checkpoint: the spec, the step count and the method's own state, as bytes
        (diloco: the synced model, outer momentum, residuals). gossip needs ``full_average()`` first; the outer path
        (local, hier, async, diloco) saves mid-period."""
        return {"spec": self.spec, "state": self._impl.save()}

    def load_state_dict(self, saved):
        self._impl.load(saved["state"])
