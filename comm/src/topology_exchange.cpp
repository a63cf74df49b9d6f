#include "hopwise/comm/topology_exchange.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "hopwise/comm/communicator.h"
#include "hopwise/topology/discover.h"
#include "hopwise/topology/formats.h"

namespace hopwise::comm {

namespace {

struct LocalFacts {
  topology::Topology machine;
  std::string host;
  std::string cpus;
};

const LocalFacts& local_facts() {
  static const LocalFacts facts = [] {
    LocalFacts f;
    f.machine = topology::discover_machine();
    const auto hosts = f.machine.nodes_of(topology::NodeKind::Host);
    f.host = hosts.empty() ? "localhost" : f.machine.node(hosts.front()).name;
    f.cpus = topology::process_cpus();
    return f;
  }();
  return facts;
}

}  // namespace

const topology::Topology& local_machine() { return local_facts().machine; }

topology::Cluster gather_cluster(Communicator& c, const std::string& gpu_bus) {
  const LocalFacts& f = local_facts();
  const auto n = static_cast<std::size_t>(c.size());
  // Every rank's header (who and where it is: a few hundred bytes) in one padded allgather; then each host's
  // machine, sent by the first rank of the host only, in one broadcast per host. Padding the machines too would
  // move the largest machine from every rank to every rank.
  const std::string head = topology::encode_view({c.rank(), f.host, f.cpus, gpu_bus}, nullptr);
  const std::string machine = c.local_rank() == 0 ? topology::to_json(f.machine) : std::string();
  const std::int64_t mine[2] = {static_cast<std::int64_t>(head.size()), static_cast<std::int64_t>(machine.size())};
  std::vector<std::int64_t> lens(2 * n);
  c.allgather(mine, lens.data(), 2, DataType::kInt64);
  std::size_t width = 0;
  for (std::size_t r = 0; r < n; ++r) width = std::max(width, static_cast<std::size_t>(lens[2 * r]));
  std::vector<std::uint8_t> padded(width, 0), all(width * n);
  std::copy(head.begin(), head.end(), padded.begin());
  c.allgather(padded.data(), all.data(), width, DataType::kUInt8);
  std::vector<std::string> heads(n), machines(n);
  for (std::size_t r = 0; r < n; ++r) {
    heads[r].assign(reinterpret_cast<const char*>(all.data() + r * width), static_cast<std::size_t>(lens[2 * r]));
    const auto mlen = static_cast<std::size_t>(lens[2 * r + 1]);
    if (mlen == 0) continue;
    machines[r] = static_cast<int>(r) == c.rank() ? machine : std::string(mlen, '\0');
    c.broadcast(machines[r].data(), mlen, DataType::kUInt8, static_cast<int>(r));
  }
  return topology::assemble_cluster(heads, machines);
}

void dump_topology(const topology::Topology& t, const std::string& path) {
  const auto ends = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  topology::save_text(path, ends(".xml")   ? topology::to_nccl_xml(t)
                            : ends(".dot") ? topology::to_dot(t)
                                           : topology::to_json(t));
}

}  // namespace hopwise::comm
