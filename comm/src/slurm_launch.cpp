// A job step that srun started (launch.h): its task's place from Slurm's variables, and where its ranks meet when
// MPI does not join them (srun without --mpi=pmix): a TCP store on the step's first node, on a port derived from
// the job and step ids.
#include <fmt/core.h>

#include <cctype>
#include <string>

#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "launch_table.h"

namespace hopwise::comm {

namespace {

// A variable srun sets, as an integer of at least `min`; InvalidArgument naming it where it is missing or malformed.
long long slurm_int(const char* name, long long min) {
  const auto v = env::get(name);
  if (!v) throw InvalidArgument(fmt::format("{} is not set, but srun sets it in every task of a step", name));
  const long long x = env::get_int(name, min - 1);
  if (x < min) throw InvalidArgument(fmt::format("{}={} must be an integer of at least {}", name, *v, min));
  return x;
}

}  // namespace

std::string slurm_first_host(const std::string& nodelist) {
  // "h[0-3],g5" -> h0, "node[07-09,12]" -> node07, "rack[1-2]-n[4-5]" -> rack1-n4, "a,b" -> a.
  std::string host;
  std::size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    if (nodelist[i] != '[') {
      host += nodelist[i++];
      continue;
    }
    const std::size_t close = nodelist.find(']', i);
    if (close == std::string::npos)
      throw InvalidArgument(fmt::format("SLURM_STEP_NODELIST={}: a '[' without its ']'", nodelist));
    std::size_t end = i + 1;
    while (end < close && std::isdigit(static_cast<unsigned char>(nodelist[end]))) ++end;
    if (end == i + 1)
      throw InvalidArgument(fmt::format("SLURM_STEP_NODELIST={}: a range that does not start with a number", nodelist));
    host += nodelist.substr(i + 1, end - i - 1);  // the first number of the range, its zero padding kept
    i = close + 1;
  }
  if (host.empty()) throw InvalidArgument(fmt::format("SLURM_STEP_NODELIST='{}' names no node", nodelist));
  return host;
}

bool slurm_step() { return env::get("SLURM_STEP_ID") && env::get("SLURM_PROCID"); }

void read_slurm_step(Launch& l) {
  l.launcher = "srun";
  l.size = static_cast<int>(env::get("SLURM_STEP_NUM_TASKS") ? slurm_int("SLURM_STEP_NUM_TASKS", 1)
                                                             : slurm_int("SLURM_NTASKS", 1));
  l.rank = static_cast<int>(slurm_int("SLURM_PROCID", 0));
  if (l.rank >= l.size)
    throw InvalidArgument(
        fmt::format("SLURM_PROCID={} is not below the step's {} tasks (SLURM_STEP_NUM_TASKS, "
                    "SLURM_NTASKS)",
                    l.rank, l.size));
  // srun --mpi=pmix (or pmi2) hands MPI the step: MPI_Init joins its tasks into one world, as under mpirun.
  l.mpi_world = env::get("PMIX_RANK") || env::get("PMI_RANK");
  const long long nodes =
      env::get("SLURM_STEP_NUM_NODES") ? slurm_int("SLURM_STEP_NUM_NODES", 1) : env::get_int("SLURM_NNODES", 1);
  l.spans_hosts = nodes > 1;
  l.hosts_known_many = l.spans_hosts;
}

std::string slurm_store_address(const Launch& l) {
  const auto nodelist = env::get("SLURM_STEP_NODELIST");
  if (!nodelist)
    throw InvalidArgument(
        "srun started this rank without MPI (no --mpi=pmix) and SLURM_STEP_NODELIST is not set: the ranks cannot "
        "find the step's first node to meet at; set HOPWISE_STORE=tcp://HOST:PORT or file:///DIR");
  const std::string host = slurm_first_host(*nodelist);
  const long long job = slurm_int("SLURM_JOB_ID", 0), step = slurm_int("SLURM_STEP_ID", 0);
  // Rank 0 serves the store: it must run on that node (srun's default block distribution puts it there).
  if (l.rank == 0) {
    const std::string here = env::get_or("SLURMD_NODENAME", host);
    if (here != host)
      throw InvalidArgument(fmt::format(
          "rank 0 runs on {} (SLURMD_NODENAME), not on the step's first node {} (SLURM_STEP_NODELIST={}), where "
          "the ranks meet: use srun --distribution=block, or set HOPWISE_STORE=tcp://{}:PORT",
          here, host, *nodelist, here));
  }
  // A port per job and step, so that steps running at once on one node do not meet at the same one; below the
  // kernel's ephemeral ports (32768 up), which connections of other programs take.
  // Rank 0 serves on the first free port of 8 (another program may hold one; a neighbouring step's server is told
  // apart by its job's name).
  if (env::get("HOPWISE_SLURM_PORT")) {
    const long long port = slurm_int("HOPWISE_SLURM_PORT", 1);
    if (port > 65535) throw InvalidArgument(fmt::format("HOPWISE_SLURM_PORT={} is not a port number", port));
    return fmt::format("tcp://{}:{}", host, port);
  }
  const long long port = 20000 + (job * 64 + step) % 12768;
  return fmt::format("tcp://{}:{}-{}", host, port, port + 7);
}

}  // namespace hopwise::comm
