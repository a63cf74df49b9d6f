// What the planner measures: per-class defaults, the metric of a device pair, rank placement, and the ring problem
// (every ordered pair's metric, the network's between hosts) built from a topology.
#include "hopwise/topology/planner.h"

#include <fmt/core.h>

#include <algorithm>
#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "hopwise/common/error.h"
#include "planner_internal.h"

namespace hopwise::topology {

namespace {
using std::size_t;
}  // namespace

using detail::at;
using detail::cross_host_metric;
using detail::host_network_gbps;

int class_weight(PathClass c) {
  switch (c) {
    case PathClass::LOC: return 0;
    case PathClass::NVL: return 1;
    case PathClass::NVB: return 2;
    case PathClass::C2C: return 2;
    case PathClass::PIX: return 3;
    case PathClass::PXB: return 4;
    case PathClass::PHB: return 5;
    case PathClass::NODE: return 6;
    case PathClass::SYS: return 8;
    case PathClass::NET: return 10;
    case PathClass::DIS: return 100;
  }
  return 100;
}

double class_default_bandwidth_gbps(PathClass c) {
  switch (c) {
    case PathClass::LOC: return kAssumedSharedMemoryGbps;
    case PathClass::NVL: return 20;
    case PathClass::NVB: return 20;
    case PathClass::C2C: return 40;
    case PathClass::PIX: return 24;
    case PathClass::PXB: return 24;
    case PathClass::PHB: return 12;
    case PathClass::NODE: return 12;
    case PathClass::SYS: return 10;
    case PathClass::NET: return 12.5;
    case PathClass::DIS: return 0;
  }
  return 0;
}

double class_default_latency_us(PathClass c) {
  switch (c) {
    case PathClass::LOC: return 0.2;
    case PathClass::NVL:
    case PathClass::NVB:
    case PathClass::C2C: return 0.7;
    case PathClass::PIX:
    case PathClass::PXB: return 1.0;
    case PathClass::PHB:
    case PathClass::NODE: return 1.5;
    case PathClass::SYS: return 2.0;
    case PathClass::NET: return 5.0;
    case PathClass::DIS: return 100.0;
  }
  return 100.0;
}

namespace {
bool cpu_device(NodeKind k) { return k == NodeKind::Numa || k == NodeKind::CpuPackage || k == NodeKind::Host; }
}  // namespace

EdgeMetric pair_metric(const Topology& t, int a, int b) {
  const PathInfo p = t.path(a, b);
  EdgeMetric m;
  m.cls = p.cls;
  m.hops = std::max(p.hops, 0);
  // NVLink paths: NVL declared by a matrix but routed through the graph keeps the NVLink bottleneck.
  m.bandwidth_gbps = p.bottleneck_gbps;
  if (p.cls == PathClass::NVL) {
    // Every link and switch plane at once, not the shortest route's one link.
    const NvlinkFlow flow = nvlink_flow(t, a, b);
    if (flow.gbps > m.bandwidth_gbps) {
      m.bandwidth_gbps = flow.gbps;
      m.assumed = flow.assumed;
    }
  }
  if (m.bandwidth_gbps <= 0 || p.cls == PathClass::LOC) {
    m.bandwidth_gbps = class_default_bandwidth_gbps(p.cls);
    m.assumed = true;
  }
  if (cpu_device(t.node(a).kind) && cpu_device(t.node(b).kind) && m.bandwidth_gbps > kAssumedSharedMemoryGbps) {
    m.bandwidth_gbps = kAssumedSharedMemoryGbps;  // ranks on CPUs move data by memory copies, whatever the path
    m.assumed = true;
  }
  m.latency_us = p.latency_us > 0 ? p.latency_us : class_default_latency_us(p.cls);
  m.cost = class_weight(p.cls) * 100.0 + m.hops;
  return m;
}

int host_index_of(const Topology& t, int id) {
  const auto hosts = t.nodes_of(NodeKind::Host);
  if (hosts.empty()) return 0;
  const size_t n = t.nodes().size();
  std::vector<char> seen(n, 0);
  std::deque<int> q{id};
  seen[static_cast<size_t>(id)] = 1;
  while (!q.empty()) {
    const int u = q.front();
    q.pop_front();
    if (t.node(u).kind == NodeKind::Host)
      return static_cast<int>(std::find(hosts.begin(), hosts.end(), u) - hosts.begin());
    if (t.node(u).kind == NodeKind::Network) continue;
    for (int li : t.links_of(u)) {
      const Link& l = t.links()[static_cast<size_t>(li)];
      if (l.kind == LinkKind::Network) continue;
      const int v = l.a == u ? l.b : l.a;
      if (!seen[static_cast<size_t>(v)]) {
        seen[static_cast<size_t>(v)] = 1;
        q.push_back(v);
      }
    }
  }
  return 0;
}

std::vector<RankPlacement> place_ranks(const Topology& t, int n) {
  std::vector<int> devices = t.nodes_of(NodeKind::Gpu);
  if (devices.empty()) devices = t.nodes_of(NodeKind::Numa);
  if (devices.empty()) devices = t.nodes_of(NodeKind::CpuPackage);
  if (devices.empty()) devices = t.nodes_of(NodeKind::Host);
  if (devices.empty())
    throw InvalidArgument(
        fmt::format("topology '{}' has no GPU, NUMA node, CPU package or host to place ranks on; "
                    "load a file that describes one",
                    t.source_name));
  if (n <= 0) n = static_cast<int>(devices.size());
  std::map<int, int> host_of;
  std::vector<RankPlacement> out(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const int d = devices[static_cast<size_t>(r) % devices.size()];
    if (!host_of.count(d)) host_of[d] = host_index_of(t, d);
    out[static_cast<size_t>(r)] = {d, host_of[d]};
  }
  return out;
}

namespace detail {

// GB/s a host reaches the network with: its NICs summed (multi-rail: NCCL spreads channels over the rails; each
// NIC's network link bandwidth, else its port speed), 0 when the model does not say.
std::vector<double> host_network_gbps(const Topology& t) {
  std::vector<double> bw(static_cast<size_t>(std::max(1, t.count(NodeKind::Host))), 0.0);
  for (const Link& l : t.links()) {
    if (l.kind != LinkKind::Network) continue;
    const int end = t.node(l.a).kind == NodeKind::Network ? l.b : l.a;
    const double gbps = l.bandwidth_gbps > 0 ? l.bandwidth_gbps : t.node(end).speed_gbps / 8.0;
    auto& h = bw[static_cast<size_t>(std::min<int>(host_index_of(t, end), static_cast<int>(bw.size()) - 1))];
    h += gbps;
  }
  return bw;
}

// Ranks on different hosts talk over the network, whatever route the graph has: NET at the slower host's network
// bandwidth (the class default when unknown). No graph search, so that planning stays linear in the hosts.
EdgeMetric cross_host_metric(const std::vector<double>& host_gbps, int ha, int hb) {
  EdgeMetric m;
  m.cls = PathClass::NET;
  m.hops = 2;  // NIC -> network -> NIC
  auto at_host = [&](int h) {
    return h >= 0 && static_cast<size_t>(h) < host_gbps.size() ? host_gbps[static_cast<size_t>(h)] : 0.0;
  };
  const double a = at_host(ha), b = at_host(hb);
  m.bandwidth_gbps = a > 0 && b > 0 ? std::min(a, b) : class_default_bandwidth_gbps(PathClass::NET);
  m.assumed = !(a > 0 && b > 0);
  m.latency_us = class_default_latency_us(PathClass::NET);
  m.cost = class_weight(PathClass::NET) * 100.0 + m.hops;
  return m;
}

}  // namespace detail

RingProblem make_problem(const Topology& t, const std::vector<RankPlacement>& placement) {
  RingProblem p;
  p.n = static_cast<int>(placement.size());
  const size_t nn = static_cast<size_t>(p.n) * static_cast<size_t>(p.n);
  p.bw.resize(nn);
  p.cost.resize(nn);
  p.latency.resize(nn);
  p.metric.resize(nn);
  p.host.resize(static_cast<size_t>(p.n));
  std::map<std::pair<int, int>, EdgeMetric> cache;
  std::vector<double> host_gbps;
  for (int a = 0; a < p.n; ++a) {
    const RankPlacement& ra = placement[static_cast<size_t>(a)];
    t.node(ra.device);
    p.host[static_cast<size_t>(a)] = ra.host;
    for (int b = 0; b < p.n; ++b) {
      const RankPlacement& rb = placement[static_cast<size_t>(b)];
      EdgeMetric m;
      if (a == b) {
        m.cls = PathClass::LOC;
      } else {
        if (ra.host != rb.host) {
          if (host_gbps.empty()) host_gbps = host_network_gbps(t);
          m = cross_host_metric(host_gbps, ra.host, rb.host);
        } else {
          auto key = std::make_pair(ra.device, rb.device);
          auto it = cache.find(key);
          if (it == cache.end()) it = cache.emplace(key, pair_metric(t, ra.device, rb.device)).first;
          m = it->second;
        }
      }
      p.bw[at(p.n, a, b)] = m.bandwidth_gbps;
      p.cost[at(p.n, a, b)] = m.cost;
      p.latency[at(p.n, a, b)] = m.latency_us;
      p.metric[at(p.n, a, b)] = m;
    }
  }
  return p;
}

}  // namespace hopwise::topology
