"""Compression for FSDP2 (``fully_shard``): the gradients' reduce-scatter and the parameters' all-gather through
hopwise codecs, with error feedback on the gradients.

    dist.init_process_group("hopwise")                   # FSDP2 shards over a hopwise group
    for block in model.blocks: fully_shard(block)
    fully_shard(model)
    comp = hopwise.torch.fsdp.compress(model, grads="int8:ef=1", params="int8")
    ...                                                  # train as before
    ckpt["hopwise_fsdp"] = comp.state_dict()             # this rank's residuals, saved beside its shards

The reduce-scatter: each rank encodes the block bound for each rank once, with its own scales, the payloads go
straight to their owners, and each owner decodes every payload in float32 and adds them, so the codec's error is not
compounded hop by hop. With ``ef=1`` each rank keeps a residual for every block it sends (one float32 copy of the
module's unsharded gradients a rank). The all-gather: each rank encodes its shard once and every rank decodes every
shard, its own too, so all ranks compute with the same parameters; parameters take codecs that keep every element at
a bounded error (int8, int4, fp8, fp16, bf16) and no error feedback. float32 and bfloat16 buffers are compressed
(bfloat16 through float32); any other dtype, or a module whose parameters mix dtypes, goes through the plain
collective.

On a GPU the buffers are *host-staged*: each collective copies its input to the host in its dtype (bfloat16 stays
bfloat16 on PCIe), runs the codecs there (the residuals live in host memory) and copies the result back on the
caller's stream before it returns. Encoding on the device, so that only the compressed bytes cross PCIe, is not built
yet. ``compress()`` refuses a module on any other device when it is called, naming the module.
"""
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

from . import _C

DEFAULT_SEED = 0x686F7077697365  # "hopwise": every rank seeds a module's states alike
_COMPRESSED = (torch.float32, torch.bfloat16)
_DEVICES = ("cpu", "cuda", "meta")  # meta: sharded before its parameters are materialized
_STAGE_ALWAYS = False  # tests: CPU buffers through the host-staged path too


def _canonical(spec, what):
    if spec is None or (isinstance(spec, str) and spec.strip().lower() == "none"):
        return None
    if not isinstance(spec, str):
        raise ValueError(f"hopwise.torch.fsdp.compress: {what} takes a codec spec such as 'int8', not "
                         f"{type(spec).__name__}")
    try:
        return _C.TensorCodecState.canonical(spec)
    except ValueError as e:
        raise ValueError(f"hopwise.torch.fsdp.compress: {what}='{spec}': {e}") from None


def _check_params_codec(spec):
    name = spec.split(":", 1)[0]
    if name not in _C.codecs_for_models():
        raise ValueError(f"hopwise.torch.fsdp.compress: params='{spec}': parameters need a codec that keeps every "
                         f"element at a bounded error; take one of {', '.join(_C.codecs_for_models())} (gradients "
                         f"take any codec)")
    if "ef=1" in spec.split(":", 1)[-1].split(","):
        raise ValueError(f"hopwise.torch.fsdp.compress: params='{spec}': error feedback carries what a codec left "
                         f"out into the next call, which suits gradients that add up, not parameters sent whole "
                         f"each time; drop ef=1")


class _Comm:
    def __init__(self, state, name):
        self.state = state
        self.name = name

    def allocate(self, size, *, dtype, device):
        return torch.empty(size, dtype=dtype, device=device)

    def _compressible(self, output, input):
        return input.dtype in _COMPRESSED and output.dtype == input.dtype

    def _run(self, output, input, call, async_op):
        """call(output, input) starts the codecs' collective on CPU buffers; a GPU's buffers go through host copies,
        done by the time this returns (the copy back runs on the caller's current stream)."""
        if not (_STAGE_ALWAYS or input.device.type != "cpu" or output.device.type != "cpu"):
            return _finish(call(output, input), async_op)
        with torch.no_grad():
            host_in = input.detach().to("cpu", copy=True)
            host_out = torch.empty(output.shape, dtype=output.dtype)
            work = call(host_out, host_in)
            work.wait()
            output.copy_(host_out)
        return work if async_op else None


def _finish(work, async_op):
    if async_op:
        return work
    work.wait()
    return None


class CompressedReduceScatter(_Comm, ReduceScatter):
    """FSDP2's reduce-scatter of one module's gradients through a hopwise codec (``set_custom_reduce_scatter``)."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if not self._compressible(output_tensor, input_tensor):
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group, async_op=async_op)
        return self._run(output_tensor, input_tensor, lambda o, i: self.state.reduce_scatter(group, o, i, op), async_op)


class CompressedAllGather(_Comm, AllGather):
    """FSDP2's all-gather of one module's parameters through a hopwise codec (``set_custom_all_gather``)."""

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        if not self._compressible(output_tensor, input_tensor):
            return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group, async_op=async_op)
        return self._run(output_tensor, input_tensor, lambda o, i: self.state.all_gather(group, o, i), async_op)


class FsdpCompression:
    """What ``compress`` installed: the codecs, the modules, and each module's codec states.

    ``state_dict()``/``load_state_dict()`` carry this rank's states (error-feedback residuals, steps) in a
    checkpoint; like FSDP2's sharded optimizer state, they belong to this rank: load them on the same rank of a job
    of the same size.
    """

    def __init__(self, grads, params):
        self.grads = grads
        self.params = params
        self._grad_states = {}  # module name -> ShardedCodecState
        self._param_states = {}

    @property
    def modules(self):
        return sorted(set(self._grad_states) | set(self._param_states))

    def state_dict(self):
        def one(s):
            return {"step": s.step, "numel": None if s.numel < 0 else s.numel, "residuals": s.residuals()}
        return {"grads": self.grads, "params": self.params,
                "grad_states": {k: one(s) for k, s in self._grad_states.items()},
                "param_states": {k: one(s) for k, s in self._param_states.items()}}

    def load_state_dict(self, saved):
        for key in ("grads", "params"):
            if saved.get(key) != getattr(self, key):
                raise ValueError(f"hopwise.torch.fsdp: the saved state compresses {key} with '{saved.get(key)}', "
                                 f"this one with '{getattr(self, key)}'")
        for key, states in (("grad_states", self._grad_states), ("param_states", self._param_states)):
            if set(saved[key]) != set(states):
                raise ValueError(f"hopwise.torch.fsdp: the saved state is of modules {sorted(saved[key])}, this "
                                 f"model's are {sorted(states)}")
            for name, s in states.items():
                one = saved[key][name]
                numel = -1 if one["numel"] is None else int(one["numel"])
                s.set(int(one["step"]), numel, list(one["residuals"]))

    def __repr__(self):
        return f"FsdpCompression(grads={self.grads!r}, params={self.params!r}, modules={len(self.modules)})"


def _backend_name(group):
    try:
        return dist.get_backend(group)
    except Exception:  # a group this process is not part of, or a torch without the name
        return "unknown"


def compress(module, grads="int8:ef=1", params="int8", seed=DEFAULT_SEED):
    """Installs the compressed reduce-scatter (``grads``) and all-gather (``params``) on every FSDP2 module in
    ``module`` (``fully_shard`` first). None or "none" leaves that direction to FSDP2's own collective. Returns the
    ``FsdpCompression`` whose ``state_dict()`` the checkpoint keeps. Every rank calls it alike.
    """
    grads = _canonical(grads, "grads")
    params = _canonical(params, "params")
    if params is not None:
        _check_params_codec(params)
    found = [(name or "<root>", m) for name, m in module.named_modules() if isinstance(m, FSDPModule)]
    if not found:
        raise ValueError("hopwise.torch.fsdp.compress: the module holds no FSDP2 module; call "
                         "torch.distributed.fsdp.fully_shard on it (and its blocks) first")
    out = FsdpCompression(grads, params)
    for name, m in found:
        groups = m._get_fsdp_state()._fsdp_param_groups
        if len(groups) > 1:
            raise ValueError(f"hopwise.torch.fsdp.compress: module '{name}' holds {len(groups)} parameter groups "
                             f"(a per-parameter mesh from shard_placement_fn); FSDP2 takes one custom collective per "
                             f"module, so shard it with one mesh")
        if not groups:
            continue  # no parameters of its own: nothing to gather or scatter
        for fp in getattr(groups[0], "fsdp_params", []):
            where, fqn = fp.sharded_param.device, getattr(fp, "_param_fqn", "?")
            if where.type not in _DEVICES:
                raise ValueError(f"hopwise.torch.fsdp.compress: module '{name}' holds parameter '{fqn}' "
                                 f"on {where}; compressed collectives run on CPU and CUDA buffers (move the model "
                                 f"or leave this module uncompressed)")
        group = groups[0].mesh_info.shard_process_group
        backend = _backend_name(group)
        if backend != "hopwise":
            raise ValueError(f"hopwise.torch.fsdp.compress: module '{name}' is sharded over a '{backend}' process "
                             f"group; compression runs on hopwise's: dist.init_process_group('hopwise') (or a "
                             f"DeviceMesh over a hopwise group) before fully_shard")
        rank, size = group.rank(), group.size()
        if grads is not None:
            out._grad_states[name] = _C.ShardedCodecState(grads, rank, size, int(seed))
            m.set_custom_reduce_scatter(CompressedReduceScatter(out._grad_states[name], name))
        if params is not None:
            out._param_states[name] = _C.ShardedCodecState(params, rank, size, int(seed))
            m.set_custom_all_gather(CompressedAllGather(out._param_states[name], name))
    return out
