#include "hopwise/topology/planner.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>

#include "hopwise/common/error.h"

namespace hopwise::topology {

namespace {
using std::size_t;
constexpr double kInf = std::numeric_limits<double>::infinity();

bool bw_ge(double a, double b) { return a >= b - 1e-9 * std::max(std::abs(a), std::abs(b)); }
bool bw_eq(double a, double b) { return bw_ge(a, b) && bw_ge(b, a); }
size_t at(int n, int a, int b) { return static_cast<size_t>(a) * static_cast<size_t>(n) + static_cast<size_t>(b); }

// Heuristic search order: bottleneck, then fewer bottleneck edges, then cost.
bool search_better(const RingScore& a, const RingScore& b) {
  if (!bw_eq(a.bottleneck_gbps, b.bottleneck_gbps)) return a.bottleneck_gbps > b.bottleneck_gbps;
  if (a.bottleneck_edges != b.bottleneck_edges) return a.bottleneck_edges < b.bottleneck_edges;
  return a.total_cost < b.total_cost - 1e-9;
}

void check_problem(const RingProblem& p) {
  const size_t nn = static_cast<size_t>(std::max(p.n, 0)) * static_cast<size_t>(std::max(p.n, 0));
  if (p.n < 0 || p.bw.size() != nn || p.cost.size() != nn || (!p.latency.empty() && p.latency.size() != nn) ||
      (!p.host.empty() && p.host.size() != static_cast<size_t>(p.n)))
    throw InvalidArgument(fmt::format("ring problem over {} ranks has {} bandwidths, {} costs, {} latencies and {} "
                                      "hosts; give n*n of each matrix (latency may be empty) and n hosts or none",
                                      p.n, p.bw.size(), p.cost.size(), p.latency.size(), p.host.size()));
}

RingProblem sub_problem(const RingProblem& p, const std::vector<int>& ranks) {
  RingProblem s;
  s.n = static_cast<int>(ranks.size());
  const size_t nn = static_cast<size_t>(s.n) * static_cast<size_t>(s.n);
  s.bw.resize(nn);
  s.cost.resize(nn);
  if (!p.latency.empty()) s.latency.resize(nn);
  for (int i = 0; i < s.n; ++i)
    for (int j = 0; j < s.n; ++j) {
      s.bw[at(s.n, i, j)] = p.bandwidth(ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(j)]);
      s.cost[at(s.n, i, j)] = p.cost_of(ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(j)]);
      if (!p.latency.empty())
        s.latency[at(s.n, i, j)] = p.latency_of(ranks[static_cast<size_t>(i)], ranks[static_cast<size_t>(j)]);
    }
  return s;
}

// Is there a Hamiltonian cycle through 0 using only edges with bandwidth >= B?
bool hamiltonian(const RingProblem& p, double B) {
  const int n = p.n;
  if (n <= 1) return true;
  std::vector<std::uint32_t> ok(static_cast<size_t>(n), 0);  // ok[a] bit b: a->b allowed
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b && bw_ge(p.bandwidth(a, b), B)) ok[static_cast<size_t>(a)] |= 1u << b;
  const std::uint32_t full = (1u << n) - 1;
  std::vector<std::uint32_t> reach(static_cast<size_t>(full) + 1, 0);  // ends reachable from 0 covering mask
  reach[1] = 1;
  for (std::uint32_t mask = 1; mask <= full; ++mask) {
    if (!(mask & 1u)) continue;
    const std::uint32_t r = reach[mask];
    if (!r) continue;
    for (int e = 0; e < n; ++e) {
      if (!(r >> e & 1u)) continue;
      const std::uint32_t nxt = ok[static_cast<size_t>(e)] & ~mask;
      for (std::uint32_t m = nxt; m; m &= m - 1) {
        const int v = __builtin_ctz(m);
        reach[mask | (1u << v)] |= 1u << v;
      }
    }
  }
  for (int e = 1; e < n; ++e)
    if ((reach[full] >> e & 1u) && (ok[static_cast<size_t>(e)] & 1u)) return true;
  return false;
}

// The worst edge of a ring: the one after which to cut it into a path.
size_t worst_edge(const RingProblem& p, const std::vector<int>& order) {
  size_t worst = 0;
  const size_t n = order.size();
  for (size_t i = 1; i < n; ++i) {
    const int a = order[i], b = order[(i + 1) % n], wa = order[worst], wb = order[(worst + 1) % n];
    const double bw = p.bandwidth(a, b), wbw = p.bandwidth(wa, wb);
    if (!bw_eq(bw, wbw) ? bw < wbw : p.cost_of(a, b) > p.cost_of(wa, wb) + 1e-9) worst = i;
  }
  return worst;
}
}  // namespace

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
    case PathClass::LOC: return 1000;
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

EdgeMetric pair_metric(const Topology& t, int a, int b) {
  const PathInfo p = t.path(a, b);
  EdgeMetric m;
  m.cls = p.cls;
  m.hops = std::max(p.hops, 0);
  // NVLink paths: NVL declared by a matrix but routed through the graph keeps the NVLink bottleneck.
  m.bandwidth_gbps = p.bottleneck_gbps > 0 ? p.bottleneck_gbps : class_default_bandwidth_gbps(p.cls);
  if (p.cls == PathClass::LOC) m.bandwidth_gbps = class_default_bandwidth_gbps(PathClass::LOC);
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
    throw InvalidArgument(fmt::format("topology '{}' has no GPU, NUMA node, CPU package or host to place ranks on; "
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

namespace {

// GB/s a host reaches the network with: its fastest NIC (the network link's bandwidth, else the port speed), 0 when
// the model does not say.
std::vector<double> host_network_gbps(const Topology& t) {
  std::vector<double> bw(static_cast<size_t>(std::max(1, t.count(NodeKind::Host))), 0.0);
  for (const Link& l : t.links()) {
    if (l.kind != LinkKind::Network) continue;
    const int end = t.node(l.a).kind == NodeKind::Network ? l.b : l.a;
    const double gbps = l.bandwidth_gbps > 0 ? l.bandwidth_gbps : t.node(end).speed_gbps / 8.0;
    auto& h = bw[static_cast<size_t>(std::min<int>(host_index_of(t, end), static_cast<int>(bw.size()) - 1))];
    h = std::max(h, gbps);
  }
  return bw;
}

// Ranks on different hosts talk over the network, whatever route the graph has: NET at the slower host's network
// bandwidth (the class default when unknown). No graph search, so that planning stays linear in the hosts.
EdgeMetric cross_host_metric(const std::vector<double>& host_gbps, int ha, int hb) {
  EdgeMetric m;
  m.cls = PathClass::NET;
  m.hops = 2;  // NIC -> network -> NIC
  auto at_host = [&](int h) { return h >= 0 && static_cast<size_t>(h) < host_gbps.size() ? host_gbps[static_cast<size_t>(h)] : 0.0; };
  const double a = at_host(ha), b = at_host(hb);
  m.bandwidth_gbps = a > 0 && b > 0 ? std::min(a, b) : class_default_bandwidth_gbps(PathClass::NET);
  m.latency_us = class_default_latency_us(PathClass::NET);
  m.cost = class_weight(PathClass::NET) * 100.0 + m.hops;
  return m;
}

}  // namespace

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

namespace {

// Score of a closed ring from a per-hop function giving {bandwidth, cost, latency} (a template, so that the
// heuristic's inner loop on matrices stays free of calls through std::function).
template <class HopFigures>
RingScore score_hops(const std::vector<int>& order, HopFigures hop) {
  RingScore s;
  const size_t n = order.size();
  if (n < 2) return s;
  s.bottleneck_gbps = kInf;
  for (size_t i = 0; i < n; ++i) {
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

}  // namespace

RingScore score_ring(const RingProblem& p, const std::vector<int>& order) {
  return score_hops(order, [&](int a, int b) {
    return std::tuple<double, double, double>{p.bandwidth(a, b), p.cost_of(a, b), p.latency_of(a, b)};
  });
}

bool better(const RingScore& a, const RingScore& b) {
  if (!bw_eq(a.bottleneck_gbps, b.bottleneck_gbps)) return a.bottleneck_gbps > b.bottleneck_gbps;
  return a.total_cost < b.total_cost - 1e-9;
}

std::vector<int> exact_ring(const RingProblem& p) {
  check_problem(p);
  const int n = p.n;
  if (n > kMaxExactRanks)
    throw InvalidArgument(fmt::format("exact_ring solves at most {} ranks, got {}; use heuristic_ring or best_ring",
                                      kMaxExactRanks, n));
  if (n <= 2) return identity_ring(n);
  // 1. The largest bottleneck B for which a Hamiltonian cycle exists.
  std::vector<double> values;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) values.push_back(p.bandwidth(a, b));
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end(), [](double x, double y) { return bw_eq(x, y); }),
               values.end());
  int lo = 0, hi = static_cast<int>(values.size()) - 1;  // values[lo] always feasible (complete graph)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (hamiltonian(p, values[static_cast<size_t>(mid)]))
      lo = mid;
    else
      hi = mid - 1;
  }
  const double B = values[static_cast<size_t>(lo)];
  // 2. Held-Karp minimum cost over the edges with bandwidth >= B; cycles start at rank 0.
  const std::uint32_t full = (1u << n) - 1;
  std::vector<double> dp((static_cast<size_t>(full) + 1) * static_cast<size_t>(n), kInf);
  std::vector<std::int8_t> from(dp.size(), -1);
  auto D = [&](std::uint32_t mask, int e) -> size_t { return static_cast<size_t>(mask) * static_cast<size_t>(n) + e; };
  dp[D(1, 0)] = 0;
  for (std::uint32_t mask = 1; mask <= full; ++mask) {
    if (!(mask & 1u)) continue;
    for (int e = 0; e < n; ++e) {
      const double cur = dp[D(mask, e)];
      if (cur == kInf) continue;
      for (int v = 1; v < n; ++v) {
        if (mask >> v & 1u) continue;
        if (!bw_ge(p.bandwidth(e, v), B)) continue;
        const double c = cur + p.cost_of(e, v);
        const size_t k = D(mask | (1u << v), v);
        if (c < dp[k]) {
          dp[k] = c;
          from[k] = static_cast<std::int8_t>(e);
        }
      }
    }
  }
  int best_end = -1;
  double best = kInf;
  for (int e = 1; e < n; ++e) {
    if (!bw_ge(p.bandwidth(e, 0), B)) continue;
    const double c = dp[D(full, e)] + p.cost_of(e, 0);
    if (c < best) {
      best = c;
      best_end = e;
    }
  }
  if (best_end < 0) return identity_ring(n);  // unreachable: B is feasible
  std::vector<int> order;
  std::uint32_t mask = full;
  for (int e = best_end; e != 0;) {
    order.push_back(e);
    const int prev = from[D(mask, e)];
    mask &= ~(1u << e);
    e = prev;
  }
  order.push_back(0);
  std::reverse(order.begin(), order.end());
  return order;
}

std::vector<int> heuristic_ring(const RingProblem& p) {
  check_problem(p);
  const int n = p.n;
  if (n <= 3) return n <= 16 && n >= 0 ? exact_ring(p) : identity_ring(n);
  // Greedy nearest neighbour (best bandwidth, then lowest cost) from up to 8 starts.
  std::vector<int> best = identity_ring(n);
  RingScore best_score = score_ring(p, best);
  const int starts = std::min(n, 8);
  for (int s = 0; s < starts; ++s) {
    const int start = static_cast<int>(static_cast<long>(s) * n / starts);
    std::vector<char> used(static_cast<size_t>(n), 0);
    std::vector<int> order{start};
    used[static_cast<size_t>(start)] = 1;
    while (static_cast<int>(order.size()) < n) {
      const int u = order.back();
      int pick = -1;
      for (int v = 0; v < n; ++v) {
        if (used[static_cast<size_t>(v)]) continue;
        if (pick < 0) {
          pick = v;
          continue;
        }
        const double bv = p.bandwidth(u, v), bp = p.bandwidth(u, pick);
        if (!bw_eq(bv, bp) ? bv > bp : p.cost_of(u, v) < p.cost_of(u, pick) - 1e-9) pick = v;
      }
      used[static_cast<size_t>(pick)] = 1;
      order.push_back(pick);
    }
    const RingScore sc = score_ring(p, order);
    if (search_better(sc, best_score)) {
      best = order;
      best_score = sc;
    }
  }
  // Local search: 2-opt (segment reversal) and Or-opt (move a segment of 1..3), first improvement, with an
  // evaluation budget so that large n stays bounded.
  long budget = std::max<long>(20000, 400000000L / n);
  bool improved = true;
  std::vector<int> cand(static_cast<size_t>(n));
  while (improved && budget > 0) {
    improved = false;
    for (int i = 1; i < n - 1 && budget > 0; ++i)
      for (int j = i + 1; j < n && budget > 0; ++j) {
        cand = best;
        std::reverse(cand.begin() + i, cand.begin() + j + 1);
        --budget;
        const RingScore sc = score_ring(p, cand);
        if (search_better(sc, best_score)) {
          best.swap(cand);
          best_score = sc;
          improved = true;
        }
      }
    for (int len = 1; len <= 3 && budget > 0; ++len)
      for (int i = 0; i + len <= n && budget > 0; ++i) {
        std::vector<int> seg(best.begin() + i, best.begin() + i + len);
        std::vector<int> rest;
        rest.reserve(static_cast<size_t>(n - len));
        rest.insert(rest.end(), best.begin(), best.begin() + i);
        rest.insert(rest.end(), best.begin() + i + len, best.end());
        for (int pos = 0; pos <= static_cast<int>(rest.size()) && budget > 0; ++pos) {
          if (pos == i) continue;
          for (int rev = 0; rev < (len > 1 ? 2 : 1); ++rev) {
            cand = rest;
            if (rev) std::reverse(seg.begin(), seg.end());
            cand.insert(cand.begin() + pos, seg.begin(), seg.end());
            if (rev) std::reverse(seg.begin(), seg.end());
            --budget;
            const RingScore sc = score_ring(p, cand);
            if (search_better(sc, best_score)) {
              best.swap(cand);
              best_score = sc;
              improved = true;
              goto next_segment;
            }
          }
        }
      next_segment:;
      }
  }
  // Rotate so that the ring starts at rank 0 (cosmetic; the ring is the same).
  std::rotate(best.begin(), std::find(best.begin(), best.end(), 0), best.end());
  return best;
}

std::vector<int> best_ring(const RingProblem& p, int exact_limit) {
  check_problem(p);
  exact_limit = std::clamp(exact_limit, 0, kMaxExactRanks);
  std::vector<int> ring = p.n <= exact_limit ? exact_ring(p) : heuristic_ring(p);
  // Deterministic orientation: of the two directions with the same score, the one visiting the smaller rank second.
  if (ring.size() > 2) {
    std::vector<int> rev(ring.begin(), ring.end());
    std::reverse(rev.begin() + 1, rev.end());
    const RingScore a = score_ring(p, ring), b = score_ring(p, rev);
    if (better(b, a) || (!better(a, b) && rev < ring)) ring.swap(rev);
  }
  return ring;
}

std::vector<int> hierarchical_ring(const RingProblem& p, int exact_limit) {
  check_problem(p);
  std::map<int, std::vector<int>> by_host;
  for (int r = 0; r < p.n; ++r) by_host[p.host.empty() ? 0 : p.host[static_cast<size_t>(r)]].push_back(r);
  if (by_host.size() <= 1) return best_ring(p, exact_limit);
  std::vector<int> out;
  for (const auto& [h, ranks] : by_host) {
    const RingProblem s = sub_problem(p, ranks);
    std::vector<int> local = best_ring(s, exact_limit);
    if (local.size() >= 2) {
      // Cut at the worst edge: the segment runs from the rank after it round to the rank before it.
      const size_t w = worst_edge(s, local);
      std::rotate(local.begin(), local.begin() + static_cast<long>((w + 1) % local.size()), local.end());
    }
    for (int i : local) out.push_back(ranks[static_cast<size_t>(i)]);
  }
  return out;
}

DoubleTree hierarchical_trees(const std::vector<int>& ring, const std::vector<int>& host) {
  const int n = static_cast<int>(ring.size());
  validate_ring(ring, n);
  std::vector<int> host_order;
  std::map<int, std::vector<int>> chain;
  for (int r : ring) {
    const int h = host.empty() ? 0 : host.at(static_cast<size_t>(r));
    if (!chain.count(h)) host_order.push_back(h);
    chain[h].push_back(r);
  }
  const int k = static_cast<int>(host_order.size());
  const DoubleTree host_trees = double_binary_tree(identity_ring(k));
  auto build = [&](const TreeShape& ht, bool reversed_chains) {
    TreeShape t;
    t.parent.assign(static_cast<size_t>(n), -1);
    t.children.assign(static_cast<size_t>(n), {});
    if (n == 0) return t;
    auto chain_of = [&](int hi) {
      std::vector<int> c = chain[host_order[static_cast<size_t>(hi)]];
      if (reversed_chains) std::reverse(c.begin(), c.end());
      return c;
    };
    auto leader = [&](int hi) { return chain_of(hi).front(); };
    t.root = leader(ht.root);
    for (int hi = 0; hi < k; ++hi) {
      const int hp = ht.parent[static_cast<size_t>(hi)];
      if (hp >= 0) {
        t.parent[static_cast<size_t>(leader(hi))] = leader(hp);
      }
    }
    // Children: other hosts' leaders first (in host-tree send order), then the next rank of the chain.
    for (int hi = 0; hi < k; ++hi)
      for (int hc : ht.children[static_cast<size_t>(hi)])
        t.children[static_cast<size_t>(leader(hi))].push_back(leader(hc));
    for (int hi = 0; hi < k; ++hi) {
      const std::vector<int> c = chain_of(hi);
      for (size_t i = 1; i < c.size(); ++i) {
        t.parent[static_cast<size_t>(c[i])] = c[i - 1];
        t.children[static_cast<size_t>(c[i - 1])].push_back(c[i]);
      }
    }
    return t;
  };
  return {build(host_trees.first, false), build(host_trees.second, true)};
}

double Plan::ring_allreduce_seconds(double bytes) const {
  if (ranks <= 1 || ring_score.bottleneck_gbps <= 0) return 0;
  const double p = ranks;
  return 2 * (p - 1) / p * bytes / (ring_score.bottleneck_gbps * 1e9) + 2 * (p - 1) * ring_score.max_latency_us * 1e-6;
}

double Plan::tree_allreduce_seconds(double bytes) const {
  if (ranks <= 1 || tree_bottleneck_gbps <= 0) return 0;
  const int depth = std::max(trees.first.depth(), trees.second.depth());
  return bytes / (tree_bottleneck_gbps * 1e9) + 2.0 * depth * tree_max_latency_us * 1e-6;
}

namespace {
std::string rank_name(const Plan& p, int r) {
  if (static_cast<size_t>(r) < p.device_names.size() && !p.device_names[static_cast<size_t>(r)].empty())
    return fmt::format("{}({})", r, p.device_names[static_cast<size_t>(r)]);
  return std::to_string(r);
}

std::string tree_text(const Plan& p, const TreeShape& t) {
  std::string out;
  std::function<void(int, int)> rec = [&](int r, int depth) {
    out += fmt::format("    {}{}\n", std::string(static_cast<size_t>(depth) * 2, ' '), rank_name(p, r));
    for (int c : t.children[static_cast<size_t>(r)]) rec(c, depth + 1);
  };
  if (!t.parent.empty()) rec(t.root, 0);
  return out;
}

std::string human_time(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}
}  // namespace

std::string Plan::describe() const {
  std::string out;
  out += fmt::format("plan: {} ranks on {} host(s), ring {}, {} channel(s){}\n", ranks, hosts, exact ? "exact" : "heuristic",
                     std::max<size_t>(1, channels.size()),
                     channels.size() > 1 ? " (the ring and its reverse share no directed link)" : "");
  std::vector<std::string> names;
  for (int r : ring) names.push_back(rank_name(*this, r));
  out += fmt::format("ring: {}\n", fmt::join(names, " -> "));
  for (size_t c = 1; c < channels.size(); ++c) {
    std::vector<std::string> ch;
    for (int r : channels[c]) ch.push_back(rank_name(*this, r));
    out += fmt::format("channel {}: {}\n", c + 1, fmt::join(ch, " -> "));
  }
  out += "ring edges:\n";
  for (size_t i = 0; i < ring.size() && ring.size() > 1; ++i) {
    const int a = ring[i], b = ring[(i + 1) % ring.size()];
    if (i < ring_edges.size()) {
      const EdgeMetric& m = ring_edges[i];
      out += fmt::format("  {} -> {}: {} {} hop(s), {:.1f} GB/s, {:.1f} us\n", a, b, to_string(m.cls), m.hops,
                         m.bandwidth_gbps, m.latency_us);
    }
  }
  if (ranks <= 1) out += "single rank: no ring or tree traffic\n";
  out += fmt::format("bottleneck: {:.1f} GB/s ({} edge(s)), total cost {:.0f}, max latency {:.1f} us\n",
                     ring_score.bottleneck_gbps, ring_score.bottleneck_edges, ring_score.total_cost,
                     ring_score.max_latency_us);
  out += fmt::format("rank-order ring: bottleneck {:.1f} GB/s, total cost {:.0f}\n", identity_score.bottleneck_gbps,
                     identity_score.total_cost);
  out += fmt::format("tree 1 (root {}, depth {}):\n", trees.first.root, trees.first.depth());
  out += tree_text(*this, trees.first);
  out += fmt::format("tree 2 (root {}, depth {}):\n", trees.second.root, trees.second.depth());
  out += tree_text(*this, trees.second);
  out += fmt::format("tree bottleneck: {:.1f} GB/s, max latency {:.1f} us\n", tree_bottleneck_gbps,
                     tree_max_latency_us);
  out += "allreduce estimate:\n";
  for (double bytes : {8.0 * 1024, 1024.0 * 1024, 256.0 * 1024 * 1024}) {
    const std::string size = bytes >= 1024 * 1024 ? fmt::format("{:.0f} MiB", bytes / (1024 * 1024))
                                                   : fmt::format("{:.0f} KiB", bytes / 1024);
    out += fmt::format("  {:>8}: ring {}, double tree {}\n", size, human_time(ring_allreduce_seconds(bytes)),
                       human_time(tree_allreduce_seconds(bytes)));
  }
  return out;
}

namespace {

using Metric = std::function<EdgeMetric(int, int)>;

RingScore score_edges(const std::vector<int>& order, const Metric& metric) {
  return score_hops(order, [&](int a, int b) {
    const EdgeMetric m = metric(a, b);
    return std::tuple<double, double, double>{m.bandwidth_gbps, m.cost, m.latency_us};
  });
}

// Everything a Plan holds besides the ring search itself: scores, the rank-order baseline (taken instead when it
// is as good), the ring's edges, the trees and their figures. `metric` answers for any pair of ranks.
void finish_plan(Plan& plan, std::vector<int> ring, const std::vector<int>& host, const Metric& metric) {
  const int n = static_cast<int>(ring.size());
  validate_ring(ring, n);
  plan.ranks = n;
  plan.hosts = std::max<int>(1, static_cast<int>(std::set<int>(host.begin(), host.end()).size()));
  plan.ring = std::move(ring);
  plan.ring_score = score_edges(plan.ring, metric);
  plan.identity_ring_order = identity_ring(n);
  plan.identity_score = score_edges(plan.identity_ring_order, metric);
  // Rank order when it is as good and as host-contiguous: a reordering that gains nothing only makes traces harder
  // to read.
  auto host_changes = [&](const std::vector<int>& r) {
    int c = 0;
    for (size_t i = 0; i < r.size() && !host.empty(); ++i)
      c += host[static_cast<size_t>(r[i])] != host[static_cast<size_t>(r[(i + 1) % r.size()])];
    return c;
  };
  if (!better(plan.ring_score, plan.identity_score) &&
      host_changes(plan.identity_ring_order) <= host_changes(plan.ring)) {
    plan.ring = plan.identity_ring_order;
    plan.ring_score = plan.identity_score;
  }
  plan.ring_edges.clear();
  for (size_t i = 0; i < plan.ring.size() && plan.ring.size() > 1; ++i)
    plan.ring_edges.push_back(metric(plan.ring[i], plan.ring[(i + 1) % plan.ring.size()]));
  plan.trees = hierarchical_trees(plan.ring, host);
  validate_tree(plan.trees.first, n);
  validate_tree(plan.trees.second, n);
  double tbw = kInf, tlat = 0;
  for (const TreeShape* t : {&plan.trees.first, &plan.trees.second})
    for (int r = 0; r < n; ++r) {
      const int par = t->parent[static_cast<size_t>(r)];
      if (par < 0) continue;
      const EdgeMetric up = metric(r, par), down = metric(par, r);
      tbw = std::min({tbw, up.bandwidth_gbps, down.bandwidth_gbps});
      tlat = std::max(tlat, down.latency_us);
    }
  plan.tree_bottleneck_gbps = tbw == kInf ? 0 : tbw;
  plan.tree_max_latency_us = tlat;
}

bool levels_exact(const std::vector<int>& host, int n, int limit) {
  std::map<int, int> per_host;
  for (int h : host) ++per_host[h];
  if (per_host.size() <= 1) return n <= limit;
  for (const auto& [h, c] : per_host)
    if (c > limit) return false;
  return true;
}

}  // namespace

Plan plan_collectives(const RingProblem& p, const PlannerOptions& o) {
  check_problem(p);
  const int limit = std::clamp(o.exact_limit, 0, kMaxExactRanks);
  Plan plan;
  const Metric metric = [&](int a, int b) {
    if (!p.metric.empty()) return p.metric[at(p.n, a, b)];
    EdgeMetric m;
    m.bandwidth_gbps = p.bandwidth(a, b);
    m.cost = p.cost_of(a, b);
    m.latency_us = p.latency_of(a, b);
    m.cls = PathClass::DIS;
    return m;
  };
  finish_plan(plan, hierarchical_ring(p, limit), p.host, metric);
  plan.exact = levels_exact(p.host, p.n, limit);
  plan.channels = {plan.ring};  // no routes in a bare matrix: one ring
  return plan;
}

namespace {

// The directed links (node pairs, in travel order) of the routes of a ring's hops; false if a hop has no route
// in the graph or stays on one device.
bool ring_links(const Topology& t, const std::vector<RankPlacement>& placement, const std::vector<int>& ring,
                std::set<std::pair<int, int>>& links) {
  for (size_t i = 0; i < ring.size(); ++i) {
    const int a = placement[static_cast<size_t>(ring[i])].device;
    const int b = placement[static_cast<size_t>(ring[(i + 1) % ring.size()])].device;
    const PathInfo path = t.path(a, b);
    if (a == b || path.route.size() < 2) return false;
    for (size_t k = 0; k + 1 < path.route.size(); ++k) links.insert({path.route[k], path.route[k + 1]});
  }
  return true;
}

std::vector<std::vector<int>> plan_channels(const Topology& t, const std::vector<RankPlacement>& placement,
                                            const std::vector<int>& ring, int hosts) {
  std::vector<std::vector<int>> channels{ring};
  if (ring.size() < 3 || hosts > 1) return channels;
  std::vector<int> reverse(ring.rbegin(), ring.rend());
  std::rotate(reverse.begin(), std::find(reverse.begin(), reverse.end(), ring.front()), reverse.end());
  std::set<std::pair<int, int>> forward, backward;
  if (!ring_links(t, placement, ring, forward) || !ring_links(t, placement, reverse, backward)) return channels;
  for (const auto& l : backward)
    if (forward.count(l)) return channels;
  channels.push_back(std::move(reverse));
  return channels;
}

}  // namespace

Plan plan_collectives(const Topology& t, const std::vector<RankPlacement>& placement, const PlannerOptions& o) {
  std::set<int> hosts;
  for (const auto& r : placement) hosts.insert(r.host);
  Plan plan;
  if (hosts.size() <= 1) {
    plan = plan_collectives(make_problem(t, placement), o);
  } else {
    // Across hosts, only pairs within a host need the graph: one small problem per host, solved as
    // hierarchical_ring does, and the network's figures between hosts. Linear in the hosts, not quadratic in ranks.
    const int limit = std::clamp(o.exact_limit, 0, kMaxExactRanks);
    const int n = static_cast<int>(placement.size());
    std::map<int, std::vector<int>> by_host;
    for (int r = 0; r < n; ++r) by_host[placement[static_cast<size_t>(r)].host].push_back(r);
    std::vector<int> local_index(static_cast<size_t>(n)), host(static_cast<size_t>(n));
    std::map<int, RingProblem> problems;
    std::vector<int> ring;
    for (const auto& [h, ranks] : by_host) {
      std::vector<RankPlacement> sub;
      for (size_t i = 0; i < ranks.size(); ++i) {
        local_index[static_cast<size_t>(ranks[i])] = static_cast<int>(i);
        host[static_cast<size_t>(ranks[i])] = h;
        sub.push_back(placement[static_cast<size_t>(ranks[i])]);
      }
      RingProblem& s = problems[h] = make_problem(t, sub);
      std::vector<int> local = best_ring(s, limit);
      if (local.size() >= 2) {
        const size_t w = worst_edge(s, local);  // cut there: the host is entered and left once
        std::rotate(local.begin(), local.begin() + static_cast<long>((w + 1) % local.size()), local.end());
      }
      for (int i : local) ring.push_back(ranks[static_cast<size_t>(i)]);
    }
    const std::vector<double> host_gbps = host_network_gbps(t);
    const Metric metric = [&](int a, int b) {
      const int ha = host[static_cast<size_t>(a)], hb = host[static_cast<size_t>(b)];
      if (ha != hb) return cross_host_metric(host_gbps, ha, hb);
      const RingProblem& s = problems.at(ha);
      EdgeMetric m = s.metric[at(s.n, local_index[static_cast<size_t>(a)], local_index[static_cast<size_t>(b)])];
      return m;
    };
    finish_plan(plan, std::move(ring), host, metric);
    plan.exact = levels_exact(host, n, limit);
  }
  plan.placement = placement;
  for (const auto& r : placement) plan.device_names.push_back(t.node(r.device).name);
  plan.channels = plan_channels(t, placement, plan.ring, plan.hosts);
  return plan;
}

}  // namespace hopwise::topology
