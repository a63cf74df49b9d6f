"""Where the ranks come from, so that `init_process_group("hopwise")` runs under mpirun as under torchrun.

torchrun exports RANK, WORLD_SIZE and MASTER_ADDR/MASTER_PORT, which torch's env:// rendezvous needs. mpirun exports
its own (Open MPI's OMPI_COMM_WORLD_*, MPICH's and Intel MPI's PMI_RANK/PMI_SIZE), srun its SLURM_*. At import,
where RANK and WORLD_SIZE are both unset, they default to the launcher's (and LOCAL_RANK, LOCAL_WORLD_SIZE too).
Under mpirun without MASTER_ADDR/MASTER_PORT, the env:// rendezvous gets torch's store from MPI: MPI rank 0 serves
a TCPStore on a port the kernel picks and tells the other ranks its address over MPI (the store's host:
MASTER_ADDR where set, else 127.0.0.1 when every rank is on one host, else rank 0's host name). Variables the
caller set, and arguments passed to init_process_group, win over all of this.
"""
import importlib
import os
import socket
from urllib.parse import parse_qs, urlparse

import torch.distributed as dist

_rendezvous = importlib.import_module("torch.distributed.rendezvous")  # dist.rendezvous is a function of that name

# (rank, size, local rank, local size) variables of each launcher, first found first used.
_LAUNCHERS = [
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("mpirun (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    # A Slurm step's tasks (srun): the batch script itself has no SLURM_STEP_ID and is no rank.
    ("srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID", None),
]


def launcher():
    """The launcher that started this process as one of several ranks: (name, rank, size, local rank, local size),
    or None."""
    env = os.environ
    for name, rank, size, local, local_size in _LAUNCHERS:
        if name == "srun" and "SLURM_STEP_ID" not in env:
            continue
        if rank in env and size in env:
            try:
                r, n = int(env[rank]), int(env[size])
            except ValueError:
                continue
            lr = env.get(local) if local else None
            ls = env.get(local_size) if local_size else None
            return name, r, n, lr, ls
    return None


def under_mpi():
    return "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ


def set_env_defaults():
    """RANK, WORLD_SIZE (and LOCAL_RANK, LOCAL_WORLD_SIZE) from the launcher's, where RANK and WORLD_SIZE are unset."""
    if "RANK" in os.environ or "WORLD_SIZE" in os.environ:
        return
    found = launcher()
    if found is None:
        return
    _, rank, size, local_rank, local_size = found
    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(size)
    if local_rank is not None:
        os.environ.setdefault("LOCAL_RANK", local_rank)
    if local_size is not None:
        os.environ.setdefault("LOCAL_WORLD_SIZE", local_size)


# ---- torch's store under mpirun, met over MPI ----

_torch_env_handler = _rendezvous._rendezvous_handlers["env"]


def _store_host():
    if os.environ.get("MASTER_ADDR"):
        return os.environ["MASTER_ADDR"]
    local = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE") or os.environ.get("MPI_LOCALNRANKS")
    size = os.environ.get("OMPI_COMM_WORLD_SIZE") or os.environ.get("PMI_SIZE")
    if local and local == size:
        return "127.0.0.1"  # every rank on this host
    return socket.getfqdn()


def _env_rendezvous_handler(url, timeout=dist.constants.default_pg_timeout, **kwargs):
    """torch's env:// rendezvous, unless this is an mpirun job without MASTER_ADDR and MASTER_PORT: then MPI rank 0
    serves the store and the ranks learn its address over MPI."""
    if not under_mpi() or os.environ.get("MASTER_PORT"):
        yield from _torch_env_handler(url, timeout, **kwargs)
        return
    from . import _C

    query = {k: v[-1] for k, v in parse_qs(urlparse(url).query).items()}
    rank = int(query.get("rank", os.environ.get("RANK", "-1")))
    world_size = int(query.get("world_size", os.environ.get("WORLD_SIZE", "-1")))
    if rank < 0 or world_size < 1:
        raise ValueError("hopwise: env:// rendezvous under mpirun: no rank or world size (RANK and WORLD_SIZE are "
                         "unset and mpirun's OMPI_COMM_WORLD_RANK/SIZE or PMI_RANK/SIZE were not found); pass "
                         "rank= and world_size= to init_process_group or export RANK and WORLD_SIZE")
    mpi_rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK", "0")))
    serves = mpi_rank == 0
    store = None
    if serves:
        store = dist.TCPStore(_store_host(), 0, world_size, True, timeout, wait_for_workers=False,
                              multi_tenant=True)
        address = f"{_store_host()}:{store.port}"
    else:
        address = ""
    address = _C._mpi_broadcast(address)
    if not serves:
        host, port = address.rsplit(":", 1)
        store = dist.TCPStore(host, int(port), world_size, False, timeout)
    yield (store, rank, world_size)
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def register_rendezvous():
    """Puts the handler above in place of torch's env:// one (it hands every other case to torch's)."""
    if _rendezvous._rendezvous_handlers.get("env") is not _env_rendezvous_handler:
        _rendezvous._rendezvous_handlers["env"] = _env_rendezvous_handler


# ---- the caller's rank and world size, which win over the environment's (comm::JobRank) ----

def world_rank_and_size(group_rank, group_size, global_ranks):
    """This process's rank and the world's size, from what torch hands the backend's creator."""
    if not global_ranks:  # the default group
        return group_rank, group_size
    try:
        return global_ranks[group_rank], dist.get_world_size()
    except (RuntimeError, ValueError):
        return None, None
