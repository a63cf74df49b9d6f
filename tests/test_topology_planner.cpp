// hopwise::topology planner: exact and heuristic rings on the max-bottleneck-then-min-cost objective, hierarchical
// rings and trees across hosts, a DGX-1 built from public facts, and the real files in ../shared/topologies (those
// tests skip where the directory is absent).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/topology/formats.h"
#include "hopwise/topology/graph.h"
#include "hopwise/topology/planner.h"
#include "hopwise/topology/shapes.h"

namespace fs = std::filesystem;
using namespace hopwise::topology;

namespace {

unsigned test_seed() {
  static const unsigned seed = [] {
    if (const char* s = std::getenv("HOPWISE_TEST_SEED")) return static_cast<unsigned>(std::strtoul(s, nullptr, 10));
    return std::random_device{}();
  }();
  return seed;
}
#define SEED_TRACE() SCOPED_TRACE("HOPWISE_TEST_SEED=" + std::to_string(test_seed()))

fs::path shared_dir() {
  const char* env = std::getenv("HOPWISE_SHARED_TOPOLOGIES");
  return env ? fs::path(env) : fs::path(HOPWISE_SHARED_TOPOLOGIES_DEFAULT);
}

RingProblem random_problem(int n, std::mt19937& rng, bool symmetric = true) {
  RingProblem p;
  p.n = n;
  p.bw.assign(static_cast<size_t>(n * n), 0);
  p.cost.assign(static_cast<size_t>(n * n), 0);
  p.latency.assign(static_cast<size_t>(n * n), 1.0);
  const double levels[] = {10, 20, 25, 50, 100};
  std::uniform_int_distribution<int> lvl(0, 4), c(1, 20);
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) {
      if (a == b) continue;
      if (symmetric && b < a) {
        p.bw[static_cast<size_t>(a * n + b)] = p.bw[static_cast<size_t>(b * n + a)];
        p.cost[static_cast<size_t>(a * n + b)] = p.cost[static_cast<size_t>(b * n + a)];
        continue;
      }
      p.bw[static_cast<size_t>(a * n + b)] = levels[lvl(rng)];
      p.cost[static_cast<size_t>(a * n + b)] = c(rng);
    }
  return p;
}

RingScore brute_force(const RingProblem& p) {
  std::vector<int> order = identity_ring(p.n);
  RingScore best = score_ring(p, order);
  while (std::next_permutation(order.begin() + 1, order.end())) {
    const RingScore s = score_ring(p, order);
    if (better(s, best)) best = s;
  }
  return best;
}

void expect_same_objective(const RingScore& a, const RingScore& b) {
  EXPECT_DOUBLE_EQ(a.bottleneck_gbps, b.bottleneck_gbps);
  EXPECT_NEAR(a.total_cost, b.total_cost, 1e-9);
}

// Ranks whose host changes between consecutive ring positions (the ring closed).
int host_changes(const std::vector<int>& ring, const std::vector<int>& host) {
  int changes = 0;
  for (size_t i = 0; i < ring.size(); ++i)
    changes += host[static_cast<size_t>(ring[i])] != host[static_cast<size_t>(ring[(i + 1) % ring.size()])];
  return changes;
}

// DGX-1 (V100): 2 Xeon sockets, GPUs 0-3 under socket 0 and 4-7 under socket 1 behind PCIe switches, hybrid
// cube-mesh NVLink. The pairs with two bonded links are those of `nvidia-smi topo -m` on a DGX-1V.
const std::vector<std::pair<int, int>> kDgx1Pairs = {{0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 2}, {1, 3}, {1, 5}, {2, 3},
                                                     {2, 6}, {3, 7}, {4, 5}, {4, 6}, {4, 7}, {5, 6}, {5, 7}, {6, 7}};
const std::set<std::pair<int, int>> kDgx1Double = {{0, 3}, {0, 4}, {1, 2}, {1, 5}, {2, 3}, {4, 7}, {5, 6}, {6, 7}};

Topology dgx1(bool v100_double_links) {
  Topology t;
  t.source_name = "dgx1-test";
  const int host = t.add_node({.kind = NodeKind::Host, .name = "host0"});
  int numa[2];
  for (int s = 0; s < 2; ++s) {
    const int pkg = t.add_node({.kind = NodeKind::CpuPackage, .name = "Package" + std::to_string(s), .index = s});
    numa[s] = t.add_node({.kind = NodeKind::Numa, .name = "NUMA" + std::to_string(s), .numa = s, .index = s});
    t.add_link({host, pkg, LinkKind::Internal});
    t.add_link({pkg, numa[s], LinkKind::Internal});
  }
  t.add_link({.a = numa[0], .b = numa[1], .kind = LinkKind::InterSocket, .bandwidth_gbps = 10});
  std::vector<int> gpu(8);
  for (int sw = 0; sw < 4; ++sw) {
    const int s = t.add_node({.kind = NodeKind::PciSwitch, .name = "PLX" + std::to_string(sw), .numa = sw / 2});
    t.add_link({.a = numa[sw / 2],
                .b = s,
                .kind = LinkKind::PCIe,
                .pcie_gen = 3,
                .pcie_width = 16,
                .bandwidth_gbps = pcie_bandwidth_gbps(3, 16)});
    for (int k = 0; k < 2; ++k) {
      const int g = sw * 2 + k;
      gpu[static_cast<size_t>(g)] = t.add_node(
          {.kind = NodeKind::Gpu, .name = "GPU" + std::to_string(g), .numa = sw / 2, .index = g, .model = "V100"});
      t.add_link({.a = s,
                  .b = gpu[static_cast<size_t>(g)],
                  .kind = LinkKind::PCIe,
                  .pcie_gen = 3,
                  .pcie_width = 16,
                  .bandwidth_gbps = pcie_bandwidth_gbps(3, 16)});
    }
  }
  for (auto [a, b] : kDgx1Pairs) {
    const int count = v100_double_links && kDgx1Double.count({a, b}) ? 2 : 1;
    t.add_link({.a = gpu[static_cast<size_t>(a)],
                .b = gpu[static_cast<size_t>(b)],
                .kind = LinkKind::NVLink,
                .count = count,
                .bandwidth_gbps = nvlink_bandwidth_gbps(count)});
  }
  return t;
}

}  // namespace

TEST(Planner, ExactRingEqualsBruteForce) {
  SEED_TRACE();
  std::mt19937 rng(test_seed());
  for (int n = 1; n <= 8; ++n)
    for (int trial = 0; trial < 12; ++trial) {
      const RingProblem p = random_problem(n, rng, trial % 3 != 2);
      const std::vector<int> ring = exact_ring(p);
      SCOPED_TRACE("n=" + std::to_string(n) + " trial=" + std::to_string(trial));
      ASSERT_NO_THROW(validate_ring(ring, n));
      if (n >= 2) expect_same_objective(score_ring(p, ring), brute_force(p));
    }
}

TEST(Planner, ExactRingRejectsTooManyRanks) {
  std::mt19937 rng(1);
  EXPECT_THROW(exact_ring(random_problem(kMaxExactRanks + 1, rng)), hopwise::InvalidArgument);
  RingProblem bad;
  bad.n = 3;
  EXPECT_THROW(exact_ring(bad), hopwise::InvalidArgument);
}

TEST(Planner, ExactRingTwelveRanksIsFastAndNoWorseThanHeuristic) {
  SEED_TRACE();
  std::mt19937 rng(test_seed() + 7);
  const RingProblem p = random_problem(12, rng);
  const RingScore exact = score_ring(p, exact_ring(p));
  const RingScore heur = score_ring(p, heuristic_ring(p));
  EXPECT_FALSE(better(heur, exact));
}

TEST(Planner, HeuristicIsValidAndReasonable) {
  SEED_TRACE();
  std::mt19937 rng(test_seed() + 1);
  for (int n : {16, 24, 32, 64}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    // Clustered machine: groups of 8 with 100 GB/s inside and 10 GB/s between, ranks shuffled. The optimum has
    // bottleneck 10 and exactly n/8 inter-group edges.
    std::vector<int> group(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) group[static_cast<size_t>(r)] = r / 8;
    std::shuffle(group.begin(), group.end(), rng);
    RingProblem p;
    p.n = n;
    p.bw.resize(static_cast<size_t>(n * n));
    p.cost.resize(static_cast<size_t>(n * n));
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        const bool same = group[static_cast<size_t>(a)] == group[static_cast<size_t>(b)];
        p.bw[static_cast<size_t>(a * n + b)] = same ? 100 : 10;
        p.cost[static_cast<size_t>(a * n + b)] = same ? 1 : 8;
      }
    const std::vector<int> ring = heuristic_ring(p);
    ASSERT_NO_THROW(validate_ring(ring, n));
    const RingScore s = score_ring(p, ring);
    EXPECT_DOUBLE_EQ(s.bottleneck_gbps, 10);
    EXPECT_EQ(s.bottleneck_edges, n / 8);
    EXPECT_LE(s.total_cost, (n - n / 8) * 1.0 + (n / 8) * 8.0 + 1e-9);

    // Random instance: a permutation, never worse than rank order.
    const RingProblem q = random_problem(n, rng);
    const std::vector<int> r2 = heuristic_ring(q);
    ASSERT_NO_THROW(validate_ring(r2, n));
    EXPECT_FALSE(better(score_ring(q, identity_ring(n)), score_ring(q, r2)));
  }
}

TEST(Planner, HeuristicMatchesExactOftenOnSmallInstances) {
  SEED_TRACE();
  std::mt19937 rng(test_seed() + 2);
  int same_bottleneck = 0;
  const int trials = 20;
  for (int trial = 0; trial < trials; ++trial) {
    const RingProblem p = random_problem(9, rng);
    const RingScore e = score_ring(p, exact_ring(p)), h = score_ring(p, heuristic_ring(p));
    EXPECT_FALSE(better(h, e));
    same_bottleneck += e.bottleneck_gbps == h.bottleneck_gbps;
  }
  EXPECT_GE(same_bottleneck, trials * 3 / 4);
}

TEST(Planner, HierarchicalRingEntersAndLeavesEachHostOnce) {
  SEED_TRACE();
  std::mt19937 rng(test_seed() + 3);
  for (auto [hosts, per_host] : {std::pair{4, 4}, std::pair{3, 20}, std::pair{2, 1}, std::pair{5, 3}}) {
    const int n = hosts * per_host;
    SCOPED_TRACE(std::to_string(hosts) + " hosts x " + std::to_string(per_host));
    RingProblem p = random_problem(n, rng);
    p.host.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) p.host[static_cast<size_t>(r)] = r % hosts;  // interleaved
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b)
        if (p.host[static_cast<size_t>(a)] != p.host[static_cast<size_t>(b)]) {
          p.bw[static_cast<size_t>(a * n + b)] = 12.5;
          p.cost[static_cast<size_t>(a * n + b)] = 1000;
        }
    const std::vector<int> ring = hierarchical_ring(p);
    ASSERT_NO_THROW(validate_ring(ring, n));
    EXPECT_EQ(host_changes(ring, p.host), hosts);
    const Plan plan = plan_collectives(p);
    EXPECT_EQ(plan.hosts, hosts);
    EXPECT_EQ(host_changes(plan.ring, p.host), hosts);
    EXPECT_NO_THROW(validate_tree(plan.trees.first, n));
    EXPECT_NO_THROW(validate_tree(plan.trees.second, n));
  }
}

TEST(Planner, HierarchicalTreesAreChainsWithinHostsAndBinaryAcross) {
  // 4 hosts x 3 ranks, ring already host-contiguous.
  std::vector<int> ring, host(12);
  for (int r = 0; r < 12; ++r) {
    ring.push_back(r);
    host[static_cast<size_t>(r)] = r / 3;
  }
  const DoubleTree t = hierarchical_trees(ring, host);
  validate_tree(t.first, 12);
  validate_tree(t.second, 12);
  EXPECT_EQ(t.first.root, 0);
  // Within a host each rank but the leader has its ring predecessor (tree 1) / successor (tree 2) as parent.
  for (int h = 0; h < 4; ++h) {
    EXPECT_EQ(t.first.parent[static_cast<size_t>(3 * h + 1)], 3 * h);
    EXPECT_EQ(t.first.parent[static_cast<size_t>(3 * h + 2)], 3 * h + 1);
    EXPECT_EQ(t.second.parent[static_cast<size_t>(3 * h + 1)], 3 * h + 2);
    EXPECT_EQ(t.second.parent[static_cast<size_t>(3 * h)], 3 * h + 1);
  }
  // Across hosts: leaders 0,3,6,9 in a heap (tree 1): 3 and 6 under 0, 9 under 3.
  EXPECT_EQ(t.first.parent[3], 0);
  EXPECT_EQ(t.first.parent[6], 0);
  EXPECT_EQ(t.first.parent[9], 3);
  EXPECT_LE(t.first.depth(), 2 + 2 * 2);
  // Single host: a chain and its reverse.
  const DoubleTree one = hierarchical_trees({2, 0, 1}, {});
  EXPECT_EQ(one.first.root, 2);
  EXPECT_EQ(one.first.parent[0], 2);
  EXPECT_EQ(one.second.root, 1);
  EXPECT_EQ(one.second.parent[0], 1);
}

TEST(Planner, Dgx1CubeMeshIsValid) {
  // 16 undirected pairs, every GPU of degree 4: a full quad {0..3}, a full quad {4..7}, and i <-> i+4.
  std::vector<int> degree(8, 0);
  std::set<std::pair<int, int>> pairs;
  for (auto [a, b] : kDgx1Pairs) {
    ++degree[static_cast<size_t>(a)];
    ++degree[static_cast<size_t>(b)];
    pairs.insert({a, b});
  }
  EXPECT_EQ(pairs.size(), 16u);
  for (int d : degree) EXPECT_EQ(d, 4);
  for (int q : {0, 4})
    for (int a = q; a < q + 4; ++a)
      for (int b = a + 1; b < q + 4; ++b) EXPECT_TRUE(pairs.count({a, b})) << a << "-" << b;
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(pairs.count({i, i + 4})) << i;
}

TEST(Planner, Dgx1RingUsesOnlyNvlink) {
  for (bool doubled : {false, true}) {
    SCOPED_TRACE(doubled ? "DGX-1V (NV2 pairs)" : "DGX-1P (single links)");
    const Topology t = dgx1(doubled);
    const auto placement = place_ranks(t);
    ASSERT_EQ(placement.size(), 8u);
    const Plan plan = plan_collectives(t, placement);
    EXPECT_TRUE(plan.exact);
    ASSERT_NO_THROW(validate_ring(plan.ring, 8));
    ASSERT_EQ(plan.ring_edges.size(), 8u);
    for (size_t i = 0; i < plan.ring.size(); ++i) {
      const int a = placement[static_cast<size_t>(plan.ring[i])].device;
      const int b = placement[static_cast<size_t>(plan.ring[(i + 1) % 8])].device;
      EXPECT_EQ(t.path(a, b).cls, PathClass::NVL) << plan.describe();
      EXPECT_EQ(plan.ring_edges[i].cls, PathClass::NVL);
    }
    // With the NV2 pairs the 8 doubled links form a Hamiltonian cycle: 0-3-2-1-5-6-7-4-0.
    EXPECT_DOUBLE_EQ(plan.ring_score.bottleneck_gbps, doubled ? 50.0 : 25.0);
    EXPECT_GE(plan.ring_score.bottleneck_gbps, plan.identity_score.bottleneck_gbps);
    EXPECT_NO_THROW(validate_tree(plan.trees.first, 8));
    EXPECT_NO_THROW(validate_tree(plan.trees.second, 8));
    EXPECT_NE(plan.describe().find("bottleneck"), std::string::npos);
  }
}

TEST(Planner, CostEstimateFollowsTheRingFormula) {
  const Topology t = dgx1(true);
  const Plan plan = plan_collectives(t, place_ranks(t));
  const double bytes = 64.0 * 1024 * 1024;
  const double p = 8;
  const double expect = 2 * (p - 1) / p * bytes / (plan.ring_score.bottleneck_gbps * 1e9) +
                        2 * (p - 1) * plan.ring_score.max_latency_us * 1e-6;
  EXPECT_NEAR(plan.ring_allreduce_seconds(bytes), expect, 1e-12);
  EXPECT_GT(plan.tree_allreduce_seconds(bytes), 0);
  EXPECT_LT(plan.ring_allreduce_seconds(1024), plan.ring_allreduce_seconds(bytes));
  Plan single;
  single.ranks = 1;
  EXPECT_EQ(single.ring_allreduce_seconds(bytes), 0);
}

TEST(Planner, PlacesRanksOnNumaNodesWithoutGpus) {
  Topology t;
  const int h = t.add_node({.kind = NodeKind::Host, .name = "h"});
  for (int i = 0; i < 4; ++i) {
    const int n = t.add_node({.kind = NodeKind::Numa, .name = "NUMA" + std::to_string(i), .numa = i, .index = i});
    t.add_link({h, n, LinkKind::Internal});
  }
  const auto pl = place_ranks(t, 6);
  ASSERT_EQ(pl.size(), 6u);
  EXPECT_EQ(t.node(pl[5].device).name, "NUMA1");
  const Plan plan = plan_collectives(t, pl);
  EXPECT_NO_THROW(validate_ring(plan.ring, 6));
  EXPECT_THROW(place_ranks(Topology{}), hopwise::InvalidArgument);
}

TEST(Planner, MultiHostTopologyGetsHostContiguousRing) {
  // Two DGX-1-like hosts joined by one network: ranks interleaved across hosts.
  Topology t;
  const int net = t.add_node({.kind = NodeKind::Network, .name = "ib"});
  std::vector<int> gpus[2];
  for (int h = 0; h < 2; ++h) {
    const int host = t.add_node({.kind = NodeKind::Host, .name = "host" + std::to_string(h)});
    const int numa = t.add_node({.kind = NodeKind::Numa, .name = "NUMA" + std::to_string(h), .numa = 0});
    t.add_link({host, numa, LinkKind::Internal});
    const int nic = t.add_node({.kind = NodeKind::Nic, .name = "mlx5_" + std::to_string(h), .speed_gbps = 100});
    t.add_link({.a = numa, .b = nic, .kind = LinkKind::PCIe, .bandwidth_gbps = 16});
    t.add_link({.a = nic, .b = net, .kind = LinkKind::Network, .bandwidth_gbps = 12.5});
    for (int g = 0; g < 4; ++g) {
      std::string name = "GPU";
      name += std::to_string(h * 4 + g);
      const int id = t.add_node({.kind = NodeKind::Gpu, .name = name});
      t.add_link({.a = numa, .b = id, .kind = LinkKind::PCIe, .bandwidth_gbps = 16});
      gpus[h].push_back(id);
    }
  }
  std::vector<RankPlacement> pl;
  for (int r = 0; r < 8; ++r) pl.push_back({gpus[r % 2][static_cast<size_t>(r / 2)], host_index_of(t, gpus[r % 2][0])});
  EXPECT_EQ(pl[0].host, 0);
  EXPECT_EQ(pl[1].host, 1);
  const Plan plan = plan_collectives(t, pl);
  std::vector<int> host;
  for (const auto& r : pl) host.push_back(r.host);
  EXPECT_EQ(host_changes(plan.ring, host), 2);
  EXPECT_EQ(plan.hosts, 2);
  for (const auto& e : plan.ring_edges) EXPECT_NE(e.cls, PathClass::DIS);
}

TEST(Planner, SharedTopologiesWithGpus) {
  if (!fs::is_directory(shared_dir())) GTEST_SKIP() << "no shared topology files at " << shared_dir().string();
  int planned = 0;
  for (const auto& e : fs::recursive_directory_iterator(shared_dir())) {
    if (!e.is_regular_file() || (e.path().extension() != ".xml" && e.path().extension() != ".txt")) continue;
    SCOPED_TRACE(e.path().string());
    Topology t;
    try {
      t = load_topology(e.path().string());
    } catch (const hopwise::InvalidArgument&) {
      continue;  // the formats test owns parse errors
    }
    if (t.count(NodeKind::Gpu) == 0) continue;
    const auto placement = place_ranks(t);
    const Plan plan = plan_collectives(t, placement);
    const int n = static_cast<int>(placement.size());
    ASSERT_NO_THROW(validate_ring(plan.ring, n));
    EXPECT_GE(plan.ring_score.bottleneck_gbps, plan.identity_score.bottleneck_gbps * (1 - 1e-9));
    if (plan.ring_score.bottleneck_gbps == plan.identity_score.bottleneck_gbps && plan.exact) {
      EXPECT_LE(plan.ring_score.total_cost, plan.identity_score.total_cost + 1e-9);
    }
    EXPECT_NO_THROW(validate_tree(plan.trees.first, n));
    EXPECT_NO_THROW(validate_tree(plan.trees.second, n));
    if (n >= 2) {
      EXPECT_GT(plan.ring_allreduce_seconds(1 << 20), 0);
    }
    ++planned;
  }
  EXPECT_GT(planned, 0);
}

TEST(Planner, SharedDgx1MatrixRingIsAllNvlink) {
  const fs::path f = shared_dir() / "nvidia-smi" / "dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt";
  if (!fs::exists(f)) GTEST_SKIP() << "no " << f.string();
  const Topology t = load_topology(f.string());
  const Plan plan = plan_collectives(t, place_ranks(t));
  for (const auto& e : plan.ring_edges) EXPECT_EQ(e.cls, PathClass::NVL);
  EXPECT_DOUBLE_EQ(plan.ring_score.bottleneck_gbps, 50.0);
}

namespace {

// Every shared topology file with GPUs that loads, with its name.
std::vector<std::pair<std::string, Topology>> shared_gpu_topologies() {
  std::vector<std::pair<std::string, Topology>> out;
  if (!fs::is_directory(shared_dir())) return out;
  for (const auto& e : fs::recursive_directory_iterator(shared_dir())) {
    if (!e.is_regular_file() || (e.path().extension() != ".xml" && e.path().extension() != ".txt")) continue;
    try {
      Topology t = load_topology(e.path().string());
      if (t.count(NodeKind::Gpu) > 0) out.emplace_back(e.path().filename().string(), std::move(t));
    } catch (const hopwise::InvalidArgument&) {
      // the formats test owns parse errors
    }
  }
  return out;
}

// The best bottleneck over all rings (rank 0 fixed first), by enumeration.
double brute_force_bottleneck(const RingProblem& p) {
  std::vector<int> order(static_cast<size_t>(p.n));
  std::iota(order.begin(), order.end(), 0);
  double best = 0;
  do {
    best = std::max(best, score_ring(p, order).bottleneck_gbps);
  } while (std::next_permutation(order.begin() + 1, order.end()));
  return best;
}

}  // namespace

TEST(PlannerQuality, SharedRingsReachTheExhaustiveBottleneck) {
  const auto files = shared_gpu_topologies();
  if (files.empty()) GTEST_SKIP() << "no shared topology files at " << shared_dir().string();
  int checked = 0;
  for (const auto& [name, t] : files) {
    if (t.count(NodeKind::Gpu) > 10 || t.count(NodeKind::Gpu) < 3) continue;
    SCOPED_TRACE(name);
    const auto placement = place_ranks(t);
    const RingProblem p = make_problem(t, placement);
    const Plan plan = plan_collectives(t, placement);
    EXPECT_NEAR(plan.ring_score.bottleneck_gbps, brute_force_bottleneck(p), 1e-9);
    EXPECT_GE(plan.ring_score.bottleneck_gbps, plan.identity_score.bottleneck_gbps - 1e-9);
    ++checked;
  }
  EXPECT_GE(checked, 5);
}

TEST(PlannerQuality, AllNvlinkMachinesGetAnAllNvlinkRing) {
  const auto files = shared_gpu_topologies();
  if (files.empty()) GTEST_SKIP() << "no shared topology files at " << shared_dir().string();
  int checked = 0;
  for (const auto& [name, t] : files) {
    const auto gpus = t.nodes_of(NodeKind::Gpu);
    if (gpus.size() < 2 || t.count(NodeKind::Host) > 1) continue;
    bool all_nvl = true;
    for (size_t i = 0; i < gpus.size() && all_nvl; ++i)
      for (size_t j = i + 1; j < gpus.size() && all_nvl; ++j) all_nvl = t.path(gpus[i], gpus[j]).cls == PathClass::NVL;
    if (!all_nvl) continue;
    SCOPED_TRACE(name);
    const Plan plan = plan_collectives(t, place_ranks(t));
    for (const auto& e : plan.ring_edges) EXPECT_EQ(e.cls, PathClass::NVL);
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

TEST(PlannerQuality, TwoSocketPcieMachinesCrossTheSocketsTwice) {
  const auto files = shared_gpu_topologies();
  if (files.empty()) GTEST_SKIP() << "no shared topology files at " << shared_dir().string();
  int checked = 0;
  for (const auto& [name, t] : files) {
    // GPUs on both of exactly two sockets, with nothing better than SYS between GPUs of different sockets.
    if (t.count(NodeKind::Host) > 1 || t.count(NodeKind::Numa) != 2) continue;
    const auto gpus = t.nodes_of(NodeKind::Gpu);
    std::set<int> numas;
    for (int g : gpus) numas.insert(t.node(g).numa);
    if (gpus.size() < 4 || numas.size() != 2 || numas.count(-1)) continue;
    bool only_sys_across = true;
    for (int a : gpus)
      for (int b : gpus)
        if (t.node(a).numa != t.node(b).numa) only_sys_across = only_sys_across && t.path(a, b).cls == PathClass::SYS;
    if (!only_sys_across) continue;
    SCOPED_TRACE(name);
    const Plan plan = plan_collectives(t, place_ranks(t));
    int sys = 0;
    for (const auto& e : plan.ring_edges) sys += e.cls == PathClass::SYS;
    EXPECT_EQ(sys, 2);
    ++checked;
  }
  EXPECT_GE(checked, 1);
}

// Channels: the reverse ring joins the planned one only where the two share no directed link.
TEST(PlannerChannels, ReverseRingOnlyWhereNoDirectedLinkIsShared) {
  // 4 GPUs in an NVLink ring of point-to-point links: the reverse uses every link's other direction.
  Topology mesh;
  const int host = mesh.add_node({.kind = NodeKind::Host, .name = "h"});
  std::vector<int> g;
  for (int i = 0; i < 4; ++i) {
    g.push_back(mesh.add_node({.kind = NodeKind::Gpu, .name = "GPU" + std::to_string(i), .index = i}));
    mesh.add_link({host, g.back(), LinkKind::PCIe, 1, 3, 16, 0, 0});
  }
  for (int i = 0; i < 4; ++i)
    mesh.add_link({g[static_cast<size_t>(i)], g[static_cast<size_t>((i + 1) % 4)], LinkKind::NVLink, 2, 0, 0, 50, 0});
  const Plan p = plan_collectives(mesh, place_ranks(mesh));
  ASSERT_EQ(p.channels.size(), 2u);
  EXPECT_EQ(p.channels[0], p.ring);
  std::vector<int> rev(p.ring.rbegin(), p.ring.rend());
  std::rotate(rev.begin(), std::find(rev.begin(), rev.end(), p.ring.front()), rev.end());
  EXPECT_EQ(p.channels[1], rev);
  EXPECT_NE(p.describe().find("2 channel(s)"), std::string::npos);

  // The same GPUs behind one NVSwitch: every rank's way out is one link, shared by both directions' rings.
  Topology sw;
  const int h2 = sw.add_node({.kind = NodeKind::Host, .name = "h"});
  const int nvs = sw.add_node({.kind = NodeKind::NvSwitch, .name = "NVS"});
  for (int i = 0; i < 4; ++i) {
    const int id = sw.add_node({.kind = NodeKind::Gpu, .name = "GPU" + std::to_string(i), .index = i});
    sw.add_link({h2, id, LinkKind::PCIe, 1, 3, 16, 0, 0});
    sw.add_link({id, nvs, LinkKind::NVLink, 6, 0, 0, 150, 0});
  }
  EXPECT_EQ(plan_collectives(sw, place_ranks(sw)).channels.size(), 1u);
  // Ranks sharing a device (no link at all), and two ranks: one ring.
  EXPECT_EQ(plan_collectives(mesh, std::vector<RankPlacement>(3, {g[0], 0})).channels.size(), 1u);
  EXPECT_EQ(plan_collectives(mesh, place_ranks(mesh, 2)).channels.size(), 1u);
}

TEST(PlannerChannels, SharedDgx1GetsTwoChannels) {
  const fs::path f = shared_dir() / "nvidia-smi" / "dgx1-v100-8gpu-4ib.pytorch-ddp-readme.topo-m.txt";
  if (!fs::exists(f)) GTEST_SKIP() << "no " << f.string();
  const Topology t = load_topology(f.string());
  const Plan plan = plan_collectives(t, place_ranks(t));
  EXPECT_EQ(plan.channels.size(), 2u);
}
