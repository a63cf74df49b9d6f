"""torchft's DiLoCo (torchft.local_sgd.DiLoCo) around the language model's AdamW, for train.py --torchft H: the
peer beside hopwise's diloco and the plain recipe. torchft is not part of hopwise's setup: run train.py with the
interpreter of an environment that has this torch and torchft (pip install torchft; measured with 0.2.0).

Each torchrun rank is one torchft replica group of size 1, with its own TCPStore and Manager (min_replica_size = the
world); rank 0 runs the lighthouse in its own process. torchrun's gloo group carries only the lighthouse's address
and the evaluation; the pseudo-gradients go over torchft's ProcessGroupGloo. The outer step is Nesterov SGD on the
model's parameters; torchft keeps the synced copy on the CPU and syncs inside the inner optimizer's step (a step
post-hook), so its time is in the step's. should_quantize needs CUDA in torchft 0.2.0, so nothing is quantized."""
import contextlib
import importlib.util
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def missing():
    """Why torchft cannot run here, or '' when it can."""
    try:
        importlib.import_module("torchft.local_sgd")
    except ImportError as e:
        return f"torchft is not installed ({e}): pip install torchft into an environment with this torch"
    return ""


def own_address():
    """This host's address toward MASTER_ADDR: scripts/diloco_torchft.py's (the MLP's torchft peer)."""
    spec = importlib.util.spec_from_file_location("diloco_torchft", SCRIPTS / "diloco_torchft.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.own_address()


class TorchftDiLoCo:
    """Enter it around the training loop (torchft hooks the inner optimizer's step while inside)."""

    def __init__(self, model, inner, period, outer_lr, outer_momentum, timeout_s=60):
        from torchft import Manager, ProcessGroupGloo
        from torchft._torchft import LighthouseServer
        from torchft.local_sgd import DiLoCo

        rank, world = dist.get_rank(), dist.get_world_size()
        me = own_address()
        self.lighthouse = LighthouseServer(bind="[::]:0", min_replicas=world) if rank == 0 else None
        where = [f"http://{me}:{self.lighthouse.address().rsplit(':', 1)[1]}" if self.lighthouse else None]
        dist.broadcast_object_list(where, 0)
        self.model = model
        self.outer = torch.optim.SGD(model.parameters(), lr=outer_lr, momentum=outer_momentum,
                                     nesterov=outer_momentum > 0)  # torch refuses Nesterov without momentum
        self.store = dist.TCPStore(me, 0, is_master=True, wait_for_workers=False)  # this replica group's own
        t = timedelta(seconds=timeout_s)
        self.manager = Manager(pg=ProcessGroupGloo(timeout=t), min_replica_size=world, use_async_quorum=False,
                               load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                                           inner.load_state_dict(sd["inner"])),
                               state_dict=lambda: {"model": model.state_dict(), "inner": inner.state_dict()},
                               replica_id=f"rank{rank}", rank=0, world_size=1, store_addr=me,
                               store_port=self.store.port, lighthouse_addr=where[0], hostname=me, timeout=t,
                               quorum_timeout=t, connect_timeout=t)
        self.diloco = DiLoCo(self.manager, [model], inner, self.outer, sync_every=period,
                             backup_device=torch.device("cpu"), pin_memory=False)
        self.spec = f"torchft-diloco:period={period},outer_lr={outer_lr},momentum={outer_momentum}"

    def __enter__(self):
        self.diloco.__enter__()
        return self

    def __exit__(self, *exc):
        return self.diloco.__exit__(*exc)

    def payload_bytes(self):
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    @contextlib.contextmanager
    def mean_model(self):
        """The ranks' mean model (over torchrun's gloo group, off the clock), as hopwise's diloco scores; between
        syncs the replicas differ and torchft keeps its synced copy to itself."""
        own = [p.detach().clone() for p in self.model.parameters()]
        with torch.no_grad():
            for p in self.model.parameters():
                dist.all_reduce(p)
                p.div_(dist.get_world_size())
        yield
        with torch.no_grad():
            for p, o in zip(self.model.parameters(), own):
                p.copy_(o)

    def close(self):
        errored = self.manager.errored()
        self.manager.shutdown(wait=False)
        if self.lighthouse:
            self.lighthouse.shutdown()
        return str(errored) if errored else None
