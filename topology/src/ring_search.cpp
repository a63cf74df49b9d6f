// Ring search over a RingProblem: scoring, the exact solver (bottleneck by Hamiltonian-cycle search, then
// Held-Karp), the greedy + 2-opt/Or-opt heuristic, and the host-aware hierarchical ring.
#include "hopwise/topology/planner.h"

#include <fmt/core.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <vector>

#include "hopwise/common/error.h"
#include "planner_internal.h"

namespace hopwise::topology {

using detail::at;
using detail::bw_eq;
using detail::bw_ge;
using detail::check_problem;
using detail::kInf;
using detail::score_hops;
using detail::worst_edge;

namespace {
using std::size_t;

// Heuristic search order: bottleneck, then fewer bottleneck edges, then cost.
bool search_better(const RingScore& a, const RingScore& b) {
  if (!bw_eq(a.bottleneck_gbps, b.bottleneck_gbps)) return a.bottleneck_gbps > b.bottleneck_gbps;
  if (a.bottleneck_edges != b.bottleneck_edges) return a.bottleneck_edges < b.bottleneck_edges;
  return a.total_cost < b.total_cost - 1e-9;
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
}  // namespace

namespace detail {

void check_problem(const RingProblem& p) {
  const size_t nn = static_cast<size_t>(std::max(p.n, 0)) * static_cast<size_t>(std::max(p.n, 0));
  if (p.n < 0 || p.bw.size() != nn || p.cost.size() != nn || (!p.latency.empty() && p.latency.size() != nn) ||
      (!p.host.empty() && p.host.size() != static_cast<size_t>(p.n)))
    throw InvalidArgument(
        fmt::format("ring problem over {} ranks has {} bandwidths, {} costs, {} latencies and {} "
                    "hosts; give n*n of each matrix (latency may be empty) and n hosts or none",
                    p.n, p.bw.size(), p.cost.size(), p.latency.size(), p.host.size()));
}

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

}  // namespace detail

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
    throw InvalidArgument(
        fmt::format("exact_ring solves at most {} ranks, got {}; use heuristic_ring or best_ring", kMaxExactRanks, n));
  if (n <= 2) return identity_ring(n);
  // 1. The largest bottleneck B for which a Hamiltonian cycle exists.
  std::vector<double> values;
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b)
      if (a != b) values.push_back(p.bandwidth(a, b));
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end(), [](double x, double y) { return bw_eq(x, y); }), values.end());
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

}  // namespace hopwise::topology
