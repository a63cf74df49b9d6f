"""hopwise as a PyTorch distributed backend.

    import hopwise.torch                      # registers backend "hopwise"
    dist.init_process_group("hopwise")        # under torchrun or mpirun, as with gloo
    ddp = DistributedDataParallel(model)      # unchanged
    ddp.register_comm_hook(*hopwise.torch.compression_hook("powersgd:rank=4"))   # optional
    hopwise.torch.allreduce(delta, state=hopwise.torch.CodecState("int8:ef=1"))   # a tensor of your own (compressed.py)
    avg = hopwise.torch.ModelAverager("local:period=8", model)   # fewer sync points (see averaging.py)
    opt = torch.optim.AdamW(model.parameters())  # the inner optimizer (its family sets DiLoCo's outer step)
    diloco = hopwise.torch.DiLoCo(model, opt, "diloco:auto")  # no DDP; diloco.step() after opt.step() (diloco.py)
    comp = hopwise.torch.fsdp.compress(model, grads="int8:ef=1", params="int8")  # after fully_shard (fsdp.py)
    mon = hopwise.torch.Monitor(util_alert=0.5); ...; mon.step()  # where the time goes (see monitor.py)
    ckpt = hopwise.torch.Checkpoints(path); ckpt.load_newest(); ckpt.save(step, state)  # restarts (checkpoint.py)
    ctx = hopwise.torch.ElasticContext(store_file); ...; ctx.shrink(why)    # survive a lost rank (elastic.py)

Under mpirun the group runs over MPI; otherwise over UCX, meeting through the store init_process_group made.
Under mpirun (or srun) nothing needs exporting: RANK and WORLD_SIZE default to the launcher's at import, and without
MASTER_ADDR/MASTER_PORT torch's store is met over MPI (see launch.py). Arguments passed to init_process_group win
over the environment.
Every HOPWISE_* variable applies (HOPWISE_ALGO, HOPWISE_TIMEOUT_S, HOPWISE_DEBUG=CHECK, ...).
"""
import torch

from ._build import HOPWISE_VERSION, TORCH_VERSION as BUILT_FOR_TORCH


def _release(version):
    return version.split("+")[0]


# The extension speaks torch's C++ ABI, which changes between releases: refuse another torch in one line rather
# than fail on a missing symbol (or worse, load).
if _release(torch.__version__) != _release(BUILT_FOR_TORCH):
    raise ImportError(f"hopwise.torch {HOPWISE_VERSION} was built for torch {BUILT_FOR_TORCH}, but this is torch "
                      f"{torch.__version__}: install the hopwise wheel built for it, or rebuild (pip install . with "
                      f"this torch)")

import torch.distributed as dist  # noqa: E402  (after the check)

from . import _C  # noqa: E402
from . import launch as _launch  # noqa: E402
from .compressed import CodecState, allreduce
from .averaging import ModelAverager, parse_averaging
from .checkpoint import Checkpoints
from .diloco import DiLoCo
from .elastic import ElasticContext
from . import fsdp
from .hooks import HookState, compression_hook
from .monitor import Monitor
from ._C import set_console_line_open

__version__ = HOPWISE_VERSION

__all__ = ["allreduce", "CodecState", "Checkpoints", "DiLoCo", "ElasticContext", "fsdp", "compression_hook", "HookState", "ModelAverager", "Monitor", "parse_averaging", "plan", "set_console_line_open", "stats", "BACKEND"]

BACKEND = "hopwise"


_launch.set_env_defaults()
_launch.register_rendezvous()


def _create(opts, pg_options=None):
    """torch's creator (extended API): only the group's members call it, with their global ranks."""
    ranks = list(opts.global_ranks_in_group)
    # The caller's rank and world size (init_process_group's arguments) win over RANK/WORLD_SIZE, as gloo's do.
    world_rank, world_size = _launch.world_rank_and_size(opts.group_rank, opts.group_size, ranks)
    return _C.HopwiseBackend(opts.store, opts.group_rank, opts.group_size, opts.timeout, str(opts.group_id), ranks,
                             -1 if world_rank is None else world_rank, -1 if world_size is None else world_size)


# One backend serves the group's CPU tensors, and its CUDA ones where the device communicator is built.
DEVICES = ["cpu", "cuda"] if _C.HAS_CUDA else ["cpu"]
if not hasattr(dist.Backend, "HOPWISE"):
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=DEVICES)


def _group(group):
    return dist.distributed_c10d._get_default_group() if group is None else group


def plan(group=None):
    """The plan a hopwise group's collectives follow: ring order, its edges' hops and bandwidth, the bottleneck,
    the hosts, the transport, and the allreduce algorithm chosen per size."""
    return _C.plan(_group(group))


def stats(group=None):
    """This rank's collective calls so far and their bytes: `bytes` on the wire (plain calls' buffers, compressed
    calls' payloads in place of theirs, so that a compression hook's saving shows), `user_bytes` (the buffers
    passed, compressed or not), `wire_bytes` (the compressed calls' payloads alone) and `sent_bytes` (what this
    rank's transport sent, whatever the algorithm)."""
    return _C.stats(_group(group))
