"""A compressed allreduce of one plain tensor, outside DDP: a DiLoCo pseudo-gradient, an outer step's delta, any
buffer of the trainer's own loop, through any hopwise codec.

    state = hopwise.torch.CodecState("int8:ef=1")       # one per tensor, kept between calls
    for outer_step in range(steps):
        delta = ...                                       # float32 (or bf16, fp16), CPU or CUDA
        hopwise.torch.allreduce(delta, state=state)       # averaged over the group in place
    ckpt["delta_state"] = state.state_dict()             # the residual travels with the checkpoint

Codecs: what ``compression_hook`` takes but PowerSGD (fp16, bf16, int8, qsgd, terngrad, sign, topk, randomk, none,
each with its parameters, e.g. "topk:ratio=0.01,ef=1", and "network:CODEC" to compress only between hosts).
The call is ordered with the group's other collectives (it starts through the backend's own sequencer).

A float32 CPU tensor is reduced in place. A CUDA tensor, or a bfloat16 or float16 one, is *host-staged*: converted
to float32 on its device, copied to the host, reduced there through the codec (the state's residual is float32 on
the host), and copied back into the tensor, in its dtype, on the caller's current stream when the call completes
(``wait()``; an ``async_op`` future copies back from its callback).
"""
import torch
import torch.distributed as dist

from . import _C
from .averaging import STAGED_DTYPES, in_place

# Every rank seeds a tensor's state alike unless told otherwise (randomk's indices, stochastic rounding's streams).
DEFAULT_SEED = 0x686F7077697365  # "hopwise"

_OPS = {"sum": "sum", "avg": "avg", "mean": "avg"}
_STAGE_ALWAYS = False  # tests: float32 CPU tensors through the host-staged path too


class _StagedWork(dist.Work):
    """The Work of a host-staged call: its result is copied into the caller's tensor once, when it is waited for
    (or from the future's callback)."""

    def __init__(self, work, tensor, host):
        super().__init__()
        self._work, self._tensor, self._host, self._copied = work, tensor, host, False

    def _copy_back(self):
        if not self._copied:
            with torch.no_grad():
                self._tensor.copy_(self._host.view_as(self._tensor))
            self._copied = True

    def wait(self, timeout=None):
        self._work.wait() if timeout is None else self._work.wait(timeout)
        self._copy_back()
        return True

    def is_completed(self):
        return self._work.is_completed() and self._copied

    def get_future(self):
        def done(f):
            f.value()  # raises the call's error
            self._copy_back()
            return [self._tensor]
        return self._work.get_future().then(done)


def _group(group):
    return dist.distributed_c10d._get_default_group() if group is None else group


def _op_name(op):
    if isinstance(op, str):
        return op.lower()
    if op == dist.ReduceOp.SUM:
        return "sum"
    if op == dist.ReduceOp.AVG:
        return "avg"
    return str(op).split(".")[-1].lower()


def _canonical(codec):
    if not isinstance(codec, str):
        raise ValueError(f"hopwise.torch: a codec spec is a string such as 'int8:ef=1', not {type(codec).__name__}")
    try:
        return _C.TensorCodecState.canonical(codec)
    except ValueError as e:
        raise ValueError(f"hopwise.torch: codec '{codec}': {e}") from None


class CodecState:
    """A codec's state for one tensor, kept by the caller between ``allreduce`` calls: the error-feedback residual
    (with ``ef=1``: what the codec's rounding or sparsification left out, sent with the next call), the step (the
    codec's calls so far) and the seed (the same on every rank).

    One state serves one tensor: it is bound to the first tensor's element count and refuses another count or
    another codec. ``state_dict()``/``load_state_dict()`` carry it in a checkpoint (plain tensors and numbers), and
    so does pickling (``torch.save``; a restored state takes the default group). ``reset()`` forgets the residual,
    the step and the tensor's size.
    """

    def __init__(self, codec="int8", group=None, seed=DEFAULT_SEED):
        self.codec = _canonical(codec)
        self.process_group = group
        g = _group(group)
        self._impl = _C.TensorCodecState(self.codec, g.rank(), g.size(), int(seed))

    @property
    def step(self):
        return self._impl.step

    @property
    def seed(self):
        return self._impl.seed

    @property
    def numel(self):
        """The element count of the tensor this state belongs to; None before its first call."""
        n = self._impl.numel
        return None if n < 0 else n

    @property
    def residual(self):
        """A copy of the error-feedback residual (float32, the tensor's element count), or None: a codec without
        ef=1, or none of its calls yet."""
        return self._impl.residual()

    def reset(self):
        """Forgets the residual, the step and the tensor's size; the codec and seed stay."""
        self._impl.reset()

    def state_dict(self):
        return {"codec": self.codec, "step": self.step, "seed": self.seed, "numel": self.numel,
                "residual": self.residual}

    def load_state_dict(self, saved):
        codec = saved.get("codec")
        if codec != self.codec:
            raise ValueError(f"hopwise: the saved CodecState is of codec '{codec}', this one's is '{self.codec}'")
        numel = saved.get("numel")
        self._impl.set(int(saved["step"]), int(saved["seed"]), -1 if numel is None else int(numel),
                       saved.get("residual"))

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, saved):
        self.__init__(saved["codec"])
        self.load_state_dict(saved)

    def __repr__(self):
        return f"CodecState('{self.codec}', step={self.step}, numel={self.numel})"


torch.serialization.add_safe_globals([CodecState])


def allreduce(tensor, codec=None, group=None, op="avg", state=None, async_op=False):
    """Sums or averages ``tensor`` over the hopwise ``group`` (default: the world) in place through ``codec``.

    tensor: float32, bfloat16 or float16, on the CPU or a CUDA device (host-staged unless float32 on the CPU),
    contiguous. group: None is the state's group (the world for a state made without
    one). codec: a spec ("int8", "int8:ef=1", "topk:ratio=0.1,ef=1", "fp16",
    "none", "network:int8", ...); None: the state's codec, else "int8". op: "avg" (default) or "sum" (or
    ``dist.ReduceOp.AVG``/``SUM``): codecs add payloads, so no other op. state: this tensor's ``CodecState``, kept
    between calls; None makes a fresh one for this call alone, so error feedback (ef=1) carries nothing to the next
    call: keep a state for that. async_op: return the torch Work (``wait()``, ``get_future()``), as
    ``dist.all_reduce`` does; the state is busy until it completes. Otherwise returns None once done.
    Every rank calls it, with the same codec and element count, in the same order as the group's other collectives.
    """
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"hopwise.torch.allreduce: expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in STAGED_DTYPES:
        raise ValueError(f"hopwise.torch.allreduce: the tensor's dtype is {tensor.dtype}; codecs compress "
                         f"float32, bfloat16 and float16 (convert it, or use dist.all_reduce)")
    if tensor.device.type not in ("cpu", "cuda"):
        raise ValueError(f"hopwise.torch.allreduce: the tensor is on {tensor.device}; compressed allreduce takes CPU "
                         f"and CUDA tensors")
    if tensor.layout != torch.strided:
        raise ValueError(f"hopwise.torch.allreduce: the tensor's layout is {tensor.layout}; pass a dense tensor")
    if not tensor.is_contiguous():
        raise ValueError("hopwise.torch.allreduce: the tensor is not contiguous; it is reduced in place, so pass a "
                         "contiguous one (x.contiguous() is a copy, which then holds the result)")
    if state is not None and not isinstance(state, CodecState):
        raise ValueError(f"hopwise.torch.allreduce: state must be a hopwise.torch.CodecState, not "
                         f"{type(state).__name__}")
    if codec is None:
        codec = state.codec if state is not None else "int8"
    spec = _canonical(codec)
    name = _op_name(op)
    if name not in _OPS:
        raise ValueError(f"hopwise.torch.allreduce: codec '{spec}' sums or averages payloads: op must be 'avg' or "
                         f"'sum', not '{name}' (use dist.all_reduce for it)")
    if group is None and state is not None:
        group = state.process_group
    if state is None:
        state = CodecState(spec, group)
    elif state.codec != spec:
        raise ValueError(f"hopwise.torch.allreduce: this CodecState is for codec '{state.codec}', the call asks for "
                         f"'{spec}'; keep one state per tensor and codec (or make a new one)")
    if state.numel is not None and state.numel != tensor.numel():
        raise ValueError(f"hopwise.torch.allreduce: this CodecState belongs to a tensor of {state.numel} elements; "
                         f"this one has {tensor.numel()} (keep one state per tensor, or reset() it)")
    staged = _STAGE_ALWAYS or not in_place(tensor)
    if staged:  # float32 on its device first: the wider copy crosses to the host once
        host = tensor.detach().reshape(-1).to(torch.float32).to("cpu", copy=True)
        work = _StagedWork(state._impl.allreduce(_group(group), host, _OPS[name]), tensor, host)
    else:
        work = state._impl.allreduce(_group(group), tensor, _OPS[name])
    if async_op:
        return work
    work.wait()
    return None
