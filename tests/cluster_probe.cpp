// Shows where the ranks of a job run, as hopwise sees it, and checks it against what the job asked for:
//   mpirun ... cluster_probe [--hosts H] [--map slot|node]
// Rank 0 prints one line per rank (host name, MPI's processor name, hopwise's host id, local rank and size) and
// "N ranks on H hosts". With --hosts it exits 1 unless there are H hosts by name and by hopwise's host ids, the same
// number of ranks on each, placed as --map says: slot (by host: ranks 0..k-1 on the first) or node (round robin).
#include <fmt/core.h>
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "hopwise/comm/communicator.h"

namespace {

struct Where {
  char host[64] = {};
  char processor[64] = {};
  std::int32_t host_id = 0, local_rank = 0, local_size = 0, pad = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int want_hosts = 0;
  std::string map = "slot";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--hosts") == 0)
      want_hosts = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--map") == 0)
      map = argv[i + 1];
  }
  hopwise::comm::Communicator comm;
  const int p = comm.size(), rank = comm.rank();
  Where mine;
  gethostname(mine.host, sizeof mine.host - 1);
  int len = 0;
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Get_processor_name(name, &len);
  std::snprintf(mine.processor, sizeof mine.processor, "%s", name);
  mine.host_id = comm.host_id();
  mine.local_rank = comm.local_rank();
  mine.local_size = comm.local_size();
  std::vector<Where> all(static_cast<std::size_t>(p));
  comm.allgather(&mine, all.data(), sizeof(Where), hopwise::DataType::kUInt8);

  std::set<std::string> names;
  std::set<int> ids;
  for (const Where& w : all) {
    names.insert(std::string(w.host, strnlen(w.host, sizeof w.host)));
    ids.insert(w.host_id);
  }
  const int hosts = static_cast<int>(names.size());
  std::vector<std::string> problems;
  if (want_hosts > 0) {
    if (hosts != want_hosts) problems.push_back(fmt::format("{} host names, expected {}", hosts, want_hosts));
    if (static_cast<int>(ids.size()) != want_hosts)
      problems.push_back(fmt::format("{} hopwise host ids, expected {}", ids.size(), want_hosts));
    const int per_host = p / want_hosts;
    for (int r = 0; r < p; ++r) {
      const Where& w = all[static_cast<std::size_t>(r)];
      const int expect = map == "node" ? r % want_hosts : r / per_host;
      if (w.host_id != expect)
        problems.push_back(fmt::format("rank {} has host id {}, expected {}", r, w.host_id, expect));
      if (w.local_size != per_host)
        problems.push_back(
            fmt::format("rank {} shares its host with {} ranks, expected {}", r, w.local_size, per_host));
      if (std::strcmp(w.host, w.processor) != 0)
        problems.push_back(fmt::format("rank {}: host name {} but MPI processor name {}", r, w.host, w.processor));
    }
  }
  if (rank == 0) {
    for (int r = 0; r < p; ++r) {
      const Where& w = all[static_cast<std::size_t>(r)];
      fmt::print("rank {:>3}: host {:<10} processor {:<10} host id {:>2}, local rank {} of {}\n", r, w.host,
                 w.processor, w.host_id, w.local_rank, w.local_size);
    }
    fmt::print("{} ranks on {} hosts\n", p, hosts);
    for (const auto& s : problems) fmt::print("PROBLEM: {}\n", s);
    std::fflush(stdout);
  }
  return problems.empty() ? 0 : 1;
}
