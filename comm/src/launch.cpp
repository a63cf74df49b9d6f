// Which launcher started this process and which transport and store go with it (launch.h); the rows are in
// launch_table.cpp.
#include "hopwise/comm/launch.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "launch_table.h"

namespace hopwise::comm {

namespace {

int required_int(const char* name, int min) {
  const auto v = env::get(name);
  if (!v) return -1;
  const long long x = env::get_int(name, -1);
  if (x < min) throw InvalidArgument(fmt::format("{}={} must be an integer of at least {}", name, *v, min));
  return static_cast<int>(x);
}

// mpirun's own variables. Under srun --mpi=pmix a task has PMIX_RANK but none of OMPI_COMM_WORLD_*, and under
// srun's pmi2 PMI_SIZE: those are Slurm steps (slurm_launch.cpp).
bool under_mpirun() {
  if (env::get("OMPI_COMM_WORLD_SIZE")) return true;
  if (slurm_step()) return false;
  for (const char* v : {"PMI_SIZE", "PMIX_RANK"})
    if (env::get(v)) return true;
  return false;
}

// tcp://HOST:PORT from HOPWISE_STORE, else torchrun's MASTER_ADDR and MASTER_PORT.
std::string torchrun_store_address(const std::string& why_missing) {
  const auto addr = env::get("MASTER_ADDR");
  const auto port = env::get("MASTER_PORT");
  if (!addr || !port)
    throw InvalidArgument(
        fmt::format("{} but MASTER_ADDR and MASTER_PORT are not both set; set them (torchrun does) "
                    "or HOPWISE_STORE=tcp://HOST:PORT or file:///DIR",
                    why_missing));
  int p = required_int("MASTER_PORT", 1);
  if (p > 65535) throw InvalidArgument(fmt::format("MASTER_PORT={} is not a port number", *port));
  // Where torchrun's agent already serves torch's own store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True: its
  // static rendezvous, and --standalone's, whose MASTER_PORT the kernel picked among the ephemeral ports), hopwise's
  // rank 0 serves the first free one of the next 16: the next port alone was once taken by a connection to the agent.
  if (env::get_or("TORCHELASTIC_USE_AGENT_STORE", "") == "True") {
    if (p == 65535)
      throw InvalidArgument("MASTER_PORT=65535 leaves no port above it for hopwise's store; pick a lower one");
    return fmt::format("tcp://{}:{}-{}", *addr, p + 1, std::min(p + 16, 65535));
  }
  return fmt::format("tcp://{}:{}", *addr, p);
}

}  // namespace

bool launched_as_job() {
  if (under_mpirun()) return env::get_int("OMPI_COMM_WORLD_SIZE", env::get_int("PMI_SIZE", 2)) > 1;
  if (!env::get("WORLD_SIZE") && slurm_step())
    return env::get_int("SLURM_STEP_NUM_TASKS", env::get_int("SLURM_NTASKS", 1)) > 1;
  return env::get_int("WORLD_SIZE", 1) > 1;
}

Launch detect_launch(bool own_store, JobRank given) {
  Launch l;
  const std::string forced = env::get_or("HOPWISE_TRANSPORT", "");
  if (!forced.empty()) {
    const auto names = transport_names();
    if (std::find(names.begin(), names.end(), forced) == names.end())
      throw InvalidArgument(fmt::format("HOPWISE_TRANSPORT={} is not a transport; use {} (or leave it unset)", forced,
                                        fmt::join(names, " or ")));
  }
  const bool mpirun = under_mpirun();
  // The caller's rank and size (a framework's arguments) win over the environment's, which is then not read.
  const bool caller = given.given() && !mpirun;
  const int rank = caller ? given.rank : required_int("RANK", 0),
            size = caller ? given.size : required_int("WORLD_SIZE", 1);
  const bool ranked_env = rank >= 0 && size >= 1;
  if ((rank >= 0) != (size >= 1) && !mpirun)
    throw InvalidArgument("RANK and WORLD_SIZE must be set together (torchrun sets both)");
  if (ranked_env && rank >= size) throw InvalidArgument(fmt::format("RANK={} is not below WORLD_SIZE={}", rank, size));

  // torchrun's variables win over Slurm's: under `srun torchrun` each worker has both, and SLURM_PROCID is its
  // node's.
  const bool srun = !mpirun && !ranked_env && slurm_step();
  if (mpirun) {
    l.launcher = "mpirun";
    l.mpi_world = true;
    l.rank = static_cast<int>(env::get_int("OMPI_COMM_WORLD_RANK", 0));
    l.size = static_cast<int>(env::get_int("OMPI_COMM_WORLD_SIZE", 1));
  } else if (ranked_env) {
    l.launcher = env::get("TORCHELASTIC_RUN_ID") ? "torchrun" : "environment";
    l.rank = rank;
    l.size = size;
  } else if (srun) {
    read_slurm_step(l);
  } else {
    l.launcher = "single process";
  }
  // Under mpirun a job that spans hosts goes over UCX too (meeting through MPI): train_mnist's 7.45 MB of buckets a
  // step (59.6 ms on a 1 Gbit/s link) took 72-74 ms over Open MPI's TCP path and 64-65 ms over UCX's (2 hosts: 81
  // against 71-72 ms a step). Alike on every rank: each host's ranks see the same local size, and some host has fewer
  // than all.
  const long local = mpirun ? env::get_int("OMPI_COMM_WORLD_LOCAL_SIZE", 0) : 0;
  if (mpirun) l.spans_hosts = local > 0 && local < l.size;
  const bool over_store = (!l.mpi_world && (ranked_env || own_store || srun)) || l.spans_hosts;
  l.transport = !forced.empty() ? forced : over_store ? "ucx" : "mpi";
  const TransportRow row = transport_row(l.transport);
  const bool runtime_ok = row.launcher == "mpirun" ? l.mpi_world : row.launcher == l.launcher;
  if (!row.launcher.empty() && !runtime_ok && l.size > 1)
    throw InvalidArgument(fmt::format(
        "HOPWISE_TRANSPORT={}, but this process was started by {} (rank {} of {}), not {}; launch with {} "
        "or use another transport ({})",
        l.transport, l.launcher, l.rank, l.size, row.launcher,
        row.launcher == "mpirun" ? "mpirun or srun --mpi=pmix" : row.launcher, fmt::join(transport_names(), ", ")));
  if (row.needs_store) {
    if (own_store) {
      l.store = "";  // the caller's
    } else if (auto s = env::get("HOPWISE_STORE")) {
      l.store = *s;
    } else if (l.mpi_world) {
      l.store = "mpi";
    } else if (l.size == 1) {
      l.store = "inproc";
    } else if (srun) {
      l.store = slurm_store_address(l);
    } else {
      l.store = torchrun_store_address(
          fmt::format("{} started this rank (RANK={}, WORLD_SIZE={})", l.launcher, l.rank, l.size));
    }
    if (!own_store) store_scheme_of(l.store, "HOPWISE_STORE=" + l.store);  // throws for an unknown scheme
    l.job = env::get_or("TORCHELASTIC_RUN_ID", srun ? fmt::format("slurm:{}.{}:{}", env::get_or("SLURM_JOB_ID", "?"),
                                                                  env::get_or("SLURM_STEP_ID", "?"), l.size)
                                                    : fmt::format("hopwise:{}:{}", l.store, l.size));
    if (env::get("TORCHELASTIC_RESTART_COUNT")) l.attempt = required_int("TORCHELASTIC_RESTART_COUNT", 0);
    const long local_size = env::get_int("LOCAL_WORLD_SIZE", 0);
    if (!srun) l.hosts_known_many = !mpirun && local_size > 0 && local_size < l.size;
  }
  l.why = fmt::format(
      "{} (rank {} of {}): {}{}", l.launcher, l.rank, l.size,
      !row.needs_store ? l.transport
                       : fmt::format("{}, meeting through {}", l.transport, own_store ? "the caller's store" : l.store),
      !forced.empty() ? " (HOPWISE_TRANSPORT=" + forced + ")"
      : l.spans_hosts ? " (the job spans hosts; HOPWISE_TRANSPORT=mpi keeps MPI)"
                      : "");
  return l;
}

}  // namespace hopwise::comm
