// From a ring to a Plan: scores against rank order, the trees and their figures, the parallel channels, the time
// estimates and describe(); the plan_collectives entry points run the whole planning.
#include "hopwise/topology/planner.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "planner_internal.h"

namespace hopwise::topology {

using detail::at;
using detail::check_problem;
using detail::cross_host_metric;
using detail::host_network_gbps;
using detail::kInf;
using detail::score_hops;
using detail::worst_edge;

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
using std::size_t;

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
  out += fmt::format("plan: {} ranks on {} host(s), ring {}, {} channel(s){}\n", ranks, hosts,
                     exact ? "exact" : "heuristic", std::max<size_t>(1, channels.size()),
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
      out += fmt::format("  {} -> {}: {} {} hop(s), {:.1f} GB/s{}, {:.1f} us\n", a, b, to_string(m.cls), m.hops,
                         m.bandwidth_gbps, m.assumed ? " (assumed)" : "", m.latency_us);
    }
  }
  if (ranks <= 1) out += "single rank: no ring or tree traffic\n";
  out += fmt::format("bottleneck: {:.1f} GB/s{} ({} edge(s)), total cost {:.0f}, max latency {:.1f} us\n",
                     ring_score.bottleneck_gbps, bottleneck_assumed ? " (assumed)" : "", ring_score.bottleneck_edges,
                     ring_score.total_cost, ring_score.max_latency_us);
  out += fmt::format("rank-order ring: bottleneck {:.1f} GB/s, total cost {:.0f}\n", identity_score.bottleneck_gbps,
                     identity_score.total_cost);
  out += fmt::format("tree 1 (root {}, depth {}):\n", trees.first.root, trees.first.depth());
  out += tree_text(*this, trees.first);
  out += fmt::format("tree 2 (root {}, depth {}):\n", trees.second.root, trees.second.depth());
  out += tree_text(*this, trees.second);
  out +=
      fmt::format("tree bottleneck: {:.1f} GB/s, max latency {:.1f} us\n", tree_bottleneck_gbps, tree_max_latency_us);
  out += fmt::format("allreduce estimate{}:\n", bottleneck_assumed ? " (on an assumed bottleneck)" : "");
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
  plan.bottleneck_assumed = false;
  for (const EdgeMetric& e : plan.ring_edges)
    plan.bottleneck_assumed |= e.assumed && detail::bw_eq(e.bandwidth_gbps, plan.ring_score.bottleneck_gbps);
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
