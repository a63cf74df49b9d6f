// What the planner's files share (internal to topology/): bandwidth comparison with a tolerance, row-major matrix
// indexing, the ring-problem check and worst edge, the cross-host network metric and ring scoring.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

#include "hopwise/topology/planner.h"

namespace hopwise::topology::detail {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

inline bool bw_ge(double a, double b) { return a >= b - 1e-9 * std::max(std::abs(a), std::abs(b)); }
inline bool bw_eq(double a, double b) { return bw_ge(a, b) && bw_ge(b, a); }
inline std::size_t at(int n, int a, int b) {
  return static_cast<std::size_t>(a) * static_cast<std::size_t>(n) + static_cast<std::size_t>(b);
}

// Throws InvalidArgument unless bw and cost hold n*n entries, latency n*n or none and host n or none.
void check_problem(const RingProblem& p);

// The worst edge of a ring: the one after which to cut it into a path.
std::size_t worst_edge(const RingProblem& p, const std::vector<int>& order);

// GB/s a host reaches the network with: its NICs summed (multi-rail), 0 when the model does not say.
std::vector<double> host_network_gbps(const Topology& t);

// Ranks on different hosts talk over the network, whatever route the graph has: NET at the slower host's network
// bandwidth (the class default when unknown). No graph search, so that planning stays linear in the hosts.
EdgeMetric cross_host_metric(const std::vector<double>& host_gbps, int ha, int hb);

// Score of a closed ring from a per-hop function giving {bandwidth, cost, latency} (a template, so that the
// heuristic's inner loop on matrices stays free of calls through std::function).
template <class HopFigures>
RingScore score_hops(const std::vector<int>& order, HopFigures hop) {
  RingScore s;
  const std::size_t n = order.size();
  if (n < 2) return s;
  s.bottleneck_gbps = kInf;
  for (std::size_t i = 0; i < n; ++i) {
    const auto [bw, cost, latency] = hop(order[i], order[(i + 1) % n]);
    if (!bw_eq(bw, s.bottleneck_gbps) && bw < s.bottleneck_gbps) {
      s.bottleneck_gbps = bw;
      s.bottleneck_edges = 1;
    } else if (bw_eq(bw, s.bottleneck_gbps)) {
      ++s.bottleneck_edges;
    }
    s.total_cost += cost;
    s.max_latency_us = std::max(s.max_latency_us, latency);
  }
  return s;
}

}  // namespace hopwise::topology::detail
