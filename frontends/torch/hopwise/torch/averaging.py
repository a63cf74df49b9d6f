"""Fewer synchronization points for torch trainers: hopwise's averaging methods (the C++ ModelAverager, one
implementation for C++ and Python) on a hopwise process group, any group (the world or a ``new_group``), for a model
on the CPU or a GPU, in float32, bfloat16 or float16.

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

The parameters are moved into one flat buffer of their device and dtype (each ``p.data`` becomes a view of it).
Without DDP, call ``avg.average_gradients(model)`` after backward instead of the hook.

Placement (``placement=``): a float32 CPU model is averaged in place. Any other (a GPU, bfloat16, float16) is
*host-staged*: the averager works on a float32 copy in host memory (pinned for a GPU), with its state beside it (the
synced model, outer momentum, codec residuals, all float32: a bf16 model's outer state stays exact); at a sync only
the fragment due is copied out, on a side CUDA stream after the trainer's queued steps (events, no device-wide
synchronize), and the result is copied back on that stream before the trainer's next kernels (the current stream
waits for it). The all-reduce itself runs behind compute as on the CPU (``delay``). Memory: 4 bytes a parameter of
host memory for the copy, plus the method's state (``stats()["state_bytes"]``), none on the device beyond a
fragment's float32 temporary where the model is not float32. ``placement="host"`` stages a float32 CPU model too
(the same code, for tests). State on the device with NCCL (``placement="device"``) is not built.
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


# What hopwise's host path averages and reduces in place; the other dtypes (and CUDA tensors) go through a float32
# host copy. compressed.py takes the same.
STAGED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLACEMENTS = ("auto", "host")


def in_place(t):
    """A float32 CPU tensor: the host path works on it where it is, with no copy."""
    return t.dtype == torch.float32 and t.device.type == "cpu"


def check_parameters(params, caller):
    """The parameters as a list, or ValueError naming `caller` and what is wrong: none, several devices or dtypes,
    a dtype the averager does not keep, a device other than the CPU or CUDA."""
    params = list(params)
    if not params:
        raise ValueError(f"hopwise: {caller} needs the model's parameters (none were given)")
    for i, p in enumerate(params):
        if p.dtype not in STAGED_DTYPES:
            raise ValueError(f"hopwise: {caller} averages float32, bfloat16 or float16 parameters; parameter {i} is "
                             f"{p.dtype}")
        if p.device.type not in ("cpu", "cuda"):
            raise ValueError(f"hopwise: {caller} averages parameters on the CPU or a CUDA device; parameter {i} is "
                             f"on {p.device}")
        if p.layout != torch.strided or p.is_sparse:
            raise ValueError(f"hopwise: {caller} averages dense parameters; parameter {i} is {p.layout}")
        if (p.device, p.dtype) != (params[0].device, params[0].dtype):
            raise ValueError(f"hopwise: {caller} averages parameters of one device and dtype; parameter 0 is "
                             f"{params[0].dtype} on {params[0].device}, parameter {i} {p.dtype} on {p.device} "
                             f"(move the model with .to() first)")
    return params


class _HostStaging:
    """The averager's float32 host copy of a model that lives elsewhere (comm::ParameterStaging): fetch(b, e) copies
    the model's range out before the averager reads it, publish(b, e) copies it back after the averager wrote it.
    On a GPU both copies run on a side stream ordered by events against the trainer's current stream; on the CPU
    they are plain copies (the same order, no streams)."""

    def __init__(self, model_flat):
        self.model = model_flat
        cuda = model_flat.device.type == "cuda"
        self.host = torch.empty(model_flat.numel(), dtype=torch.float32, pin_memory=cuda)
        self.stream = torch.cuda.Stream(device=model_flat.device) if cuda else None

    def fetch(self, b, e):
        with torch.no_grad():
            if self.stream is None:
                self.host[b:e].copy_(self.model[b:e])
                return
            queued = torch.cuda.current_stream(self.model.device).record_event()  # the trainer's steps so far
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(queued)
                part = self.model[b:e].float()  # converted on the device: the float32 bytes alone cross PCIe
                self.host[b:e].copy_(part, non_blocking=True)
                done = self.stream.record_event()
            done.synchronize()  # the averager reads the range as soon as this returns

    def publish(self, b, e):
        with torch.no_grad():
            if self.stream is None:
                self.model[b:e].copy_(self.host[b:e])
                return
            current = torch.cuda.current_stream(self.model.device)
            queued = current.record_event()  # the trainer's last use of the old values
            with torch.cuda.stream(self.stream):
                self.stream.wait_event(queued)
                if self.model.dtype == torch.float32:
                    self.model[b:e].copy_(self.host[b:e], non_blocking=True)
                else:  # narrowed on the device: the float32 bytes cross PCIe, then one kernel
                    self.model[b:e].copy_(self.host[b:e].to(self.model.device, non_blocking=True))
                done = self.stream.record_event()
            current.wait_event(done)  # the trainer's next kernels see the averaged range


class ModelAverager:
    def __init__(self, spec, params, process_group=None, optimizer=None, placement="auto", _caller="ModelAverager",
                 join=False):
        """optimizer: the trainer's optimizer, for a diloco spec without inner=: the outer step where the spec names
        none follows its family (hopwise.torch.DiLoCo passes its own). placement: "auto" (in place for a float32
        CPU model, host-staged otherwise) or "host" (host-staged always); see the module's note. join: this process
        joins a running job (an elastic newcomer, after ElasticContext let it in): no broadcast of rank 0's model;
        the members' state comes at the regroup() they call with it (fixed diloco specs only: ``regroups``)."""
        if optimizer is not None:
            from .diloco import _with_inner
            spec = _with_inner(spec, optimizer)
        if isinstance(params, torch.nn.Module):
            params = params.parameters()
        if placement not in _PLACEMENTS:
            raise ValueError(f"hopwise: {_caller}'s placement is 'auto' or 'host', not {placement!r} (state on the "
                             f"device with NCCL, 'device', is not built)")
        self.params = check_parameters(params, _caller)
        self.process_group = process_group
        with torch.no_grad():
            flat = torch._utils._flatten_dense_tensors([p.detach() for p in self.params]).contiguous()
            for p, view in zip(self.params, torch._utils._unflatten_dense_tensors(flat, self.params)):
                p.data = view
        self.flat = flat
        direct = placement == "auto" and in_place(flat)
        self.placement = "direct" if direct else "host"
        self._staging = None if direct else _HostStaging(flat)
        if direct:  # broadcasts rank 0's model, unless joining
            self._impl = _C.ModelAverager(_group(process_group), spec, flat, joining=join)
        else:
            self._impl = _C.ModelAverager(_group(process_group), spec, self._staging.host, self._staging.fetch,
                                          self._staging.publish, joining=join)
        if join:
            self.regroup(process_group)

    @property
    def regroups(self):
        """Whether the method carries its state across a change of members (a fixed diloco spec: the synced model,
        outer momentum, residuals), so that detach() and regroup() keep it; else build a new averager."""
        return self._impl.regroups

    def detach(self):
        """After a collective of the method failed (a replica lost or stopped), before ElasticContext.shrink(): the
        sync in flight is kept where it completed here, else marked to be redone over the survivors."""
        self._impl.detach()

    def regroup(self, process_group=None):
        """Over the group formed again (ElasticContext.shrink() or admit(); default: the new default group),
        on every member and any newcomer (collective): the members behind the furthest one take its shared state,
        the sync the loss broke is redone over those here, a newcomer takes the synced model, the outer momentum and
        the step count. Returns what happened, one line."""
        self.process_group = process_group
        return self._impl.regroup(_group(process_group))

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
        """(state, hook) for ``ddp.register_comm_hook``: each bucket averaged over the step's scope (a GPU or bf16
        bucket through a float32 host copy, on the hook's call)."""
        def hook(state, bucket):
            buf = bucket.buffer()
            if in_place(buf):
                return state._impl.average_bucket(buf).get_future().then(lambda f: f.value()[0])
            state._average_staged([buf])
            done = torch.futures.Future()
            done.set_result(buf)
            return done

        hook.__name__ = "hopwise_averaging_hook"
        return self, hook

    def average_gradients(self, params=None):
        """Without DDP: averages the gradients over the step's scope, in place (call after backward)."""
        if params is None:
            params = self.params
        elif isinstance(params, torch.nn.Module):
            params = params.parameters()
        grads = [p.grad for p in params if p.grad is not None]
        if all(in_place(g) and g.is_contiguous() for g in grads):
            self._impl.average_gradients(grads)
        else:
            self._average_staged(grads)

    def _average_staged(self, tensors):
        """Gradients on a GPU or in bf16/fp16 averaged over the step's scope through one float32 host copy."""
        if self._impl.gradient_scope() == "none" or not tensors:
            return
        with torch.no_grad():
            host = torch.cat([t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors])
            self._impl.average_gradients([host])
            at = 0
            for t in tensors:
                t.copy_(host[at:at + t.numel()].view_as(t))
                at += t.numel()

    def state_dict(self):
        """The method's state for a checkpoint: the spec, the step count and the method's own state, as bytes
        (diloco: the synced model, outer momentum, residuals). gossip needs ``full_average()`` first; the outer path
        (local, hier, async, diloco) saves mid-period."""
        return {"spec": self.spec, "state": self._impl.save()}

    def load_state_dict(self, saved):
        self._impl.load(saved["state"])
