// plan-bench: how long the planner takes for 8 to 4096 ranks on clusters of 8-GPU hosts (2 sockets, PCIe switches,
// one NVSwitch, a 400 Gb/s NIC per GPU pair), ranks placed round-robin over hosts as `mpirun --map-by node` does,
// so the rank-order ring crosses hosts at every hop and the planned one once per host. Goal: under 100 ms at 4096.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>

#include "hopwise/topology/planner.h"

using namespace hopwise::topology;

namespace {

struct Cluster {
  Topology t;
  std::vector<RankPlacement> placement;
};

Cluster make_cluster(int hosts) {
  Cluster c;
  Topology& t = c.t;
  const int net = hosts > 1 ? t.add_node({.kind = NodeKind::Network, .name = "fabric"}) : -1;
  std::vector<std::vector<int>> gpus(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) {
    const std::string p = fmt::format("node{}:", h);
    const int host = t.add_node({.kind = NodeKind::Host, .name = fmt::format("node{}", h)});
    const int nvs = t.add_node({.kind = NodeKind::NvSwitch, .name = p + "NVSwitch"});
    int prev = -1;
    for (int s = 0; s < 2; ++s) {
      const int pkg = t.add_node({.kind = NodeKind::CpuPackage, .name = p + fmt::format("Package{}", s), .index = s});
      const int numa =
          t.add_node({.kind = NodeKind::Numa, .name = p + fmt::format("NUMA{}", s), .numa = s, .index = s});
      t.add_link({host, pkg, LinkKind::Internal});
      t.add_link({pkg, numa, LinkKind::Internal});
      if (prev >= 0) t.add_link({prev, numa, LinkKind::InterSocket, 1, 0, 0, 40, 0});
      prev = numa;
      for (int w = 0; w < 2; ++w) {
        const int sw = t.add_node({.kind = NodeKind::PciSwitch, .name = p + fmt::format("PLX{}{}", s, w)});
        t.add_link({numa, sw, LinkKind::PCIe, 1, 5, 16, 0, 0});
        for (int g = 0; g < 2; ++g) {
          const int gi = s * 4 + w * 2 + g;
          const int gpu = t.add_node({.kind = NodeKind::Gpu, .name = p + fmt::format("GPU{}", gi), .index = gi});
          t.add_link({sw, gpu, LinkKind::PCIe, 1, 5, 16, 0, 0});
          t.add_link({gpu, nvs, LinkKind::NVLink, 18, 0, 0, 18 * 20.6, 0});
          gpus[static_cast<size_t>(h)].push_back(gpu);
        }
        const int nic =
            t.add_node({.kind = NodeKind::Nic, .name = p + fmt::format("mlx5_{}", s * 2 + w), .speed_gbps = 400});
        t.add_link({sw, nic, LinkKind::PCIe, 1, 5, 16, 0, 0});
        if (net >= 0) t.add_link({nic, net, LinkKind::Network, 1, 0, 0, 50, 0});
      }
    }
  }
  const int ranks = hosts * 8;
  for (int r = 0; r < ranks; ++r)  // --map-by node: consecutive ranks on different hosts
    c.placement.push_back({gpus[static_cast<size_t>(r % hosts)][static_cast<size_t>(r / hosts)], r % hosts});
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int max_ranks = 4096;
  if (argc > 1) max_ranks = std::atoi(argv[1]);
  if (max_ranks < 8) {
    fmt::print(stderr, "usage: plan-bench [MAX_RANKS >= 8] (default 4096)\n");
    return 2;
  }
  fmt::print("{:>6} {:>6} {:>10} {:>10} {:>12} {:>12} {:>11} {:>11} {:>6}\n", "ranks", "hosts", "plan_ms", "min_ms",
             "planned_GBs", "rankord_GBs", "planned_x", "rankord_x", "exact");
  double at_max = 0;
  for (int ranks = 8; ranks <= max_ranks; ranks *= 8) {
    const Cluster c = make_cluster(ranks / 8);
    std::vector<double> ms;
    Plan plan;
    for (int rep = 0; rep < 5; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      plan = plan_collectives(c.t, c.placement);
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    // Host boundaries crossed by a ring: once per host when planned, at every hop in rank order.
    auto crossings = [&](const std::vector<int>& ring) {
      int x = 0;
      for (size_t i = 0; i < ring.size(); ++i)
        x += c.placement[static_cast<size_t>(ring[i])].host !=
             c.placement[static_cast<size_t>(ring[(i + 1) % ring.size()])].host;
      return x;
    };
    fmt::print("{:>6} {:>6} {:>10.2f} {:>10.2f} {:>12.1f} {:>12.1f} {:>11} {:>11} {:>6}\n", ranks, ranks / 8, ms[2],
               ms[0], plan.ring_score.bottleneck_gbps, plan.identity_score.bottleneck_gbps, crossings(plan.ring),
               crossings(plan.identity_ring_order), plan.exact ? "yes" : "no");
    at_max = ms[2];
  }
  fmt::print("goal: under 100 ms at {} ranks on one core: {} ({:.2f} ms)\n", max_ranks, at_max < 100 ? "met" : "MISSED",
             at_max);
  return 0;
}
