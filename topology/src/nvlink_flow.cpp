// NVLink bandwidth between two devices as a max flow over the NVLink links through NVSwitches. The shortest route's
// smallest link undercounts an NVSwitch machine by the number of switch planes: a GPU reaches every peer through
// all of its links at once.
#include <algorithm>
#include <cstddef>
#include <deque>
#include <limits>
#include <map>
#include <vector>

#include "hopwise/topology/graph.h"

namespace hopwise::topology {

NvlinkFlow nvlink_flow(const Topology& t, int a, int b) {
  NvlinkFlow out;
  if (a == b) return out;
  // Vertices: a, b and the NVSwitches a's NVLinks reach through other switches (a route through another GPU is
  // NVB, not a flow of a's own links). Only those: a cluster of many hosts has thousands of switches, and every
  // pair of GPUs asks.
  std::map<int, int> vertex;
  auto vertex_of = [&](int id) {
    auto [it, added] = vertex.emplace(id, static_cast<int>(vertex.size()));
    return it->second;
  };
  const int s = vertex_of(a), d = vertex_of(b);
  std::vector<int> links, frontier{a};  // a few dozen at most: searched, not indexed by the cluster's link count
  while (!frontier.empty()) {
    const int id = frontier.back();
    frontier.pop_back();
    for (int li : t.links_of(id)) {
      const Link& l = t.links()[static_cast<std::size_t>(li)];
      if (l.kind != LinkKind::NVLink || l.bandwidth_gbps <= 0) continue;
      if (std::find(links.begin(), links.end(), li) != links.end()) continue;
      const int other = l.a == id ? l.b : l.a;
      const bool is_switch = t.node(other).kind == NodeKind::NvSwitch;
      if (!is_switch && other != a && other != b) continue;
      links.push_back(li);
      if (is_switch && vertex.find(other) == vertex.end()) frontier.push_back(other);
      vertex_of(other);
    }
  }
  const std::size_t n = vertex.size();
  // Residual capacities; parallel links between one pair add up. Each link carries its bandwidth each way.
  std::vector<std::vector<double>> cap(n, std::vector<double>(n, 0.0));
  std::vector<std::vector<char>> assumed(n, std::vector<char>(n, 0));
  for (int li : links) {
    const Link& l = t.links()[static_cast<std::size_t>(li)];
    const auto u = static_cast<std::size_t>(vertex.at(l.a)), v = static_cast<std::size_t>(vertex.at(l.b));
    cap[u][v] += l.bandwidth_gbps;
    cap[v][u] += l.bandwidth_gbps;
    assumed[u][v] = assumed[v][u] = assumed[u][v] || l.assumed;
  }
  const auto original = cap;
  // Edmonds-Karp: the graphs are a few dozen vertices.
  for (;;) {
    std::vector<int> prev(n, -1);
    prev[static_cast<std::size_t>(s)] = s;
    std::deque<int> q{s};
    while (!q.empty() && prev[static_cast<std::size_t>(d)] < 0) {
      const auto u = static_cast<std::size_t>(q.front());
      q.pop_front();
      for (std::size_t v = 0; v < n; ++v)
        if (prev[v] < 0 && cap[u][v] > 1e-12) {
          prev[v] = static_cast<int>(u);
          q.push_back(static_cast<int>(v));
        }
    }
    if (prev[static_cast<std::size_t>(d)] < 0) break;
    double push = std::numeric_limits<double>::infinity();
    for (int v = d; v != s; v = prev[static_cast<std::size_t>(v)])
      push =
          std::min(push, cap[static_cast<std::size_t>(prev[static_cast<std::size_t>(v)])][static_cast<std::size_t>(v)]);
    for (int v = d; v != s; v = prev[static_cast<std::size_t>(v)]) {
      const auto u = static_cast<std::size_t>(prev[static_cast<std::size_t>(v)]);
      cap[u][static_cast<std::size_t>(v)] -= push;
      cap[static_cast<std::size_t>(v)][u] += push;
    }
    out.gbps += push;
  }
  for (std::size_t u = 0; u < n; ++u)
    for (std::size_t v = 0; v < n; ++v)
      if (assumed[u][v] && cap[u][v] < original[u][v] - 1e-9) out.assumed = true;
  return out;
}

}  // namespace hopwise::topology
