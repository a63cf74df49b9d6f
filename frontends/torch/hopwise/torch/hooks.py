"""DDP comm hooks for every hopwise codec: one asynchronous call per bucket, the codec and error feedback in C++.

    state, hook = hopwise.torch.compression_hook("int8:ef=1")
    ddp.register_comm_hook(state, hook)

Specs: fp16, bf16, int8, qsgd, terngrad, sign, topk, randomk, none (each with its parameters, e.g.
"topk:ratio=0.01,ef=1"), and powersgd (e.g. "powersgd:rank=4,ef=1,warmup=10"), which views each gradient as a
matrix (its first dimension the rows) and sends all of a bucket's P factors in one allreduce, all Q in a second.
"network:SPEC" (e.g. "network:int8", "network:powersgd:rank=4") compresses only between hosts: each host sums its
ranks' gradients at full precision, and only the hosts' leaders send the codec's payloads to each other.
The hooks average (DDP does not divide gradients when a hook is registered).
"""
import torch
import torch.distributed as dist

from . import _C


def _group(group):
    return dist.distributed_c10d._get_default_group() if group is None else group


def _is_powersgd(spec):
    spec = spec.strip()
    if spec.lower().startswith("network:"):
        spec = spec[len("network:"):]
    return spec.split(":", 1)[0].strip().lower() == "powersgd"


class HookState:
    """What a hook keeps between steps, per bucket: error-feedback residuals, PowerSGD's warm-start Q.

    Saves with the trainer's checkpoint: ``state_dict()``/``load_state_dict()``, or pickling (``torch.save``), which
    leaves the process group out, as torch's PowerSGDState does; a restored state takes the default group.
    """

    def __init__(self, spec, process_group=None):
        self.spec = spec
        self.process_group = process_group
        self._make()

    def _keys(self, bucket):
        """A key per parameter, in the order this hook first saw them: DDP's first step holds every parameter in
        one bucket, in the same order in every run, so a restored state finds each parameter's own again."""
        keys = []
        for p in bucket.parameters():
            key = self._key_of.get(id(p))
            if key is None:
                key = self._key_of[id(p)] = len(self._key_of)
            keys.append(key)
        return keys

    def _make(self):
        self._key_of = {}
        group = _group(self.process_group)
        if _is_powersgd(self.spec):
            self._impl = _C.PowerSgdHookState(self.spec)
        else:
            self._impl = _C.CodecHookState(self.spec, group.rank(), group.size())

    def state_dict(self):
        return {"spec": self.spec, "state": self._impl.save()}

    def load_state_dict(self, saved):
        if saved.get("spec") != self.spec:
            raise ValueError(f"hopwise: the saved hook state is for '{saved.get('spec')}', this hook is '{self.spec}'")
        self._impl.load(saved["state"])

    def __getstate__(self):
        return self.state_dict()

    def __setstate__(self, saved):
        self.spec = saved["spec"]
        self.process_group = None
        self._make()
        self._impl.load(saved["state"])


# torch.load reads only allowed types by default since torch 2.6 (weights_only): a hook state is bytes and a spec
# string, nothing that runs code, so a checkpoint holding one loads as it did.
torch.serialization.add_safe_globals([HookState])


def _first(fut):
    return fut.value()[0]


def compression_hook(spec, process_group=None, state=None):
    """(state, hook) for ``ddp.register_comm_hook``; pass a restored ``state`` to resume from a checkpoint."""
    if state is None:
        state = HookState(spec, process_group)
    elif state.spec != spec:
        raise ValueError(f"hopwise: the state given is for '{state.spec}', the hook asked for '{spec}'")

    if _is_powersgd(spec):
        def hook(state, bucket):
            group = _group(state.process_group)
            work = state._impl.allreduce(group, bucket.buffer(), bucket.gradients(), state._keys(bucket))
            return work.get_future().then(_first)
    else:
        def hook(state, bucket):
            group = _group(state.process_group)
            work = state._impl.allreduce(group, bucket.buffer(), bucket.gradients(), state._keys(bucket),
                                         bucket.index())
            return work.get_future().then(_first)

    hook.__name__ = "hopwise_" + "_".join(spec.split(":", 2)[:2 if spec.startswith("network:") else 1]) + "_hook"
    return state, hook
