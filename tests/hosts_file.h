// A topology file of several identical hosts, for HOPWISE_TOPO_FILE: in-process ranks then plan as if spread over
// hosts (the hierarchical groups, link_bytes(), host_ranks()), host after host.
#pragma once

#include <fmt/core.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "hopwise/topology/cluster.h"
#include "hopwise/topology/formats.h"

namespace hwtest {

// `hosts` machines of `gpus` GPUs each (ranks go round-robin on them, host after host).
inline std::filesystem::path hosts_file(int hosts, int gpus) {
  namespace ht = hopwise::topology;
  std::vector<std::string> views;
  ht::Topology m;
  const int host = m.add_node({.kind = ht::NodeKind::Host, .name = "m"});
  const int numa =
      m.add_node({.kind = ht::NodeKind::Numa, .name = "NUMA0", .numa = 0, .index = 0, .cpu_affinity = "0-7"});
  m.add_link({host, numa, ht::LinkKind::Internal});
  for (int g = 0; g < gpus; ++g) {
    const int gpu = m.add_node({.kind = ht::NodeKind::Gpu, .name = "GPU" + std::to_string(g), .index = g});
    m.add_link({numa, gpu, ht::LinkKind::PCIe, 1, 4, 16, 0, 0});
  }
  const int nic = m.add_node({.kind = ht::NodeKind::Nic, .name = "eth0", .speed_gbps = 10});
  m.add_link({numa, nic, ht::LinkKind::PCIe, 1, 4, 16, 0, 0});
  for (int h = 0; h < hosts; ++h) views.push_back(ht::encode_view({h, "host" + std::to_string(h), "", ""}, &m));
  const ht::Cluster c = ht::assemble_cluster(views);
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() / fmt::format("hopwise-hosts-{}x{}-{}.json", hosts, gpus, getpid());
  ht::save_text(file.string(), ht::to_json(c.topology));
  return file;
}

}  // namespace hwtest
