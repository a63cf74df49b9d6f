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
  // Only the first rank of each host sends the machine; the others send who and where they are.
  const std::string mine =
      topology::encode_view({c.rank(), f.host, f.cpus, gpu_bus}, c.local_rank() == 0 ? &f.machine : nullptr);
  const auto n = static_cast<std::size_t>(c.size());
  const auto len = static_cast<std::int64_t>(mine.size());
  std::vector<std::int64_t> lens(n);
  c.allgather(&len, lens.data(), 1, DataType::kInt64);
  const auto width = static_cast<std::size_t>(*std::max_element(lens.begin(), lens.end()));
  std::vector<std::uint8_t> padded(width, 0), all(width * n);
  std::copy(mine.begin(), mine.end(), padded.begin());
  c.allgather(padded.data(), all.data(), width, DataType::kUInt8);
  std::vector<std::string> views(n);
  for (std::size_t r = 0; r < n; ++r)
    views[r].assign(reinterpret_cast<const char*>(all.data() + r * width), static_cast<std::size_t>(lens[r]));
  return topology::assemble_cluster(views);
}

void dump_topology(const topology::Topology& t, const std::string& path) {
  const auto ends = [&](const char* ext) {
    const std::string e(ext);
    return path.size() >= e.size() && path.compare(path.size() - e.size(), e.size(), e) == 0;
  };
  topology::save_text(path, ends(".xml") ? topology::to_nccl_xml(t) : ends(".dot") ? topology::to_dot(t)
                                                                                  : topology::to_json(t));
}

}  // namespace hopwise::comm
