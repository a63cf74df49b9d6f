// The topology planner: from a machine model and the placement of ranks on its devices, a ring order and NCCL-style
// double binary trees, with a cost estimate. Pure computation (no MPI, no I/O).
//
// Ring objective (lexicographic): maximise the bottleneck bandwidth between consecutive ranks, then minimise the
// total path cost. Exact (bottleneck by binary search over Hamiltonian-cycle feasibility, then Held-Karp on the
// cost restricted to edges at or above it) for at most PlannerOptions::exact_limit ranks per level; greedy +
// 2-opt/Or-opt above. Across hosts the ring is hierarchical: the ranks of one host are contiguous, so each host is
// entered and left exactly once.
#pragma once

#include <string>
#include <vector>

#include "hopwise/topology/graph.h"
#include "hopwise/topology/shapes.h"

namespace hopwise::topology {

// Where rank r runs: its device node (a GPU, or a CPU package / NUMA node when there are no GPUs) and its host
// (a dense host index 0..H-1; ranks on the same host share it).
struct RankPlacement {
  int device = -1;
  int host = 0;
};

// Places n ranks round-robin on the GPUs of `t` (in the order of nodes_of(Gpu)); without GPUs on the NUMA nodes,
// then the CPU packages, then the hosts. n <= 0 means one rank per device. Host indices come from the Host node the
// device hangs off (without crossing the network); 0 when the model has no Host node. Throws InvalidArgument if
// the model has none of these devices.
std::vector<RankPlacement> place_ranks(const Topology& t, int n = 0);

// The host index of node `id` (see place_ranks).
int host_index_of(const Topology& t, int id);

// What moving data between two devices costs.
struct EdgeMetric {
  PathClass cls = PathClass::DIS;
  int hops = 0;
  double bandwidth_gbps = 0;  // the path's known bottleneck, else a per-class default (see class_default_*)
  double latency_us = 0;      // the path's known latency, else a per-class default
  double cost = 0;            // class weight * 100 + hops: what the ring minimises after the bottleneck
  bool assumed = false;       // bandwidth_gbps is a default or an inferred figure, not one the model states
};

// GB/s of one hop that stays in host memory (two ranks on one device, or CPU ranks talking through shared
// memory): assumed, not read from any file. One core's memcpy out of cache measures about 8 GB/s on the
// development machines, and a hop through shared memory copies every byte twice (into the slot and out of it).
inline constexpr double kAssumedSharedMemoryGbps = 4.0;
// NVL pairs take the NVLink max flow (parallel links and NVSwitch planes summed); hops between CPU-side devices
// (NUMA nodes, packages, hosts) are capped at kAssumedSharedMemoryGbps, since their data moves by memory copies.
EdgeMetric pair_metric(const Topology& t, int device_a, int device_b);
double class_default_bandwidth_gbps(PathClass c);
double class_default_latency_us(PathClass c);
int class_weight(PathClass c);  // LOC 0, NVL 1, NVB 2, C2C 2, PIX 3, PXB 4, PHB 5, NODE 6, SYS 8, NET 10, DIS 100

// The matrix form of the ring problem: n ranks, bandwidth/cost/latency of every ordered pair (row-major n*n),
// host[r] of every rank. Built from a Topology by make_problem, or directly (tests, synthetic machines).
struct RingProblem {
  int n = 0;
  std::vector<double> bw;          // GB/s
  std::vector<double> cost;        // path cost
  std::vector<double> latency;     // us
  std::vector<int> host;           // empty: all on host 0
  std::vector<EdgeMetric> metric;  // optional, per pair (filled by make_problem)
  double bandwidth(int a, int b) const { return bw[static_cast<std::size_t>(a * n + b)]; }
  double cost_of(int a, int b) const { return cost[static_cast<std::size_t>(a * n + b)]; }
  double latency_of(int a, int b) const { return latency.empty() ? 0 : latency[static_cast<std::size_t>(a * n + b)]; }
};
RingProblem make_problem(const Topology& t, const std::vector<RankPlacement>& placement);

// The score of a closed ring (order[last] -> order[0] included).
struct RingScore {
  double bottleneck_gbps = 0;
  double total_cost = 0;
  double max_latency_us = 0;
  int bottleneck_edges = 0;  // edges whose bandwidth equals the bottleneck
};
RingScore score_ring(const RingProblem& p, const std::vector<int>& order);
// True if a is strictly better than b under max-bottleneck-then-min-cost (bandwidths compared with a 1e-9 relative
// tolerance, costs with 1e-9 absolute).
bool better(const RingScore& a, const RingScore& b);

// Exact optimum over all ranks of p (ignores hosts). Throws InvalidArgument above kMaxExactRanks ranks.
inline constexpr int kMaxExactRanks = 16;
std::vector<int> exact_ring(const RingProblem& p);
// Greedy nearest neighbour from several starts, then 2-opt and Or-opt (ignores hosts). Always a permutation.
std::vector<int> heuristic_ring(const RingProblem& p);
// Exact when n <= exact_limit, heuristic otherwise (ignores hosts).
std::vector<int> best_ring(const RingProblem& p, int exact_limit = 12);
// Host-aware: ranks of one host contiguous (hosts in increasing index order), each host's segment the best ring of
// its ranks cut at its worst edge. Equal to best_ring when there is one host.
std::vector<int> hierarchical_ring(const RingProblem& p, int exact_limit = 12);

struct PlannerOptions {
  int exact_limit = 12;  // ranks per level solved exactly; capped at kMaxExactRanks
};

struct Plan {
  int ranks = 0;
  int hosts = 1;
  std::vector<RankPlacement> placement;
  std::vector<int> ring;  // ranks in ring order
  // Rings a large allreduce may run side by side: the ring, and its reverse where the two share no directed
  // link of the machine (each hop a link of its own, full duplex: an NVLink mesh). One ring within a NUMA node
  // (no links), through a switch or NVSwitch (every rank's way out is shared), or across hosts (one NIC path).
  std::vector<std::vector<int>> channels;
  RingScore ring_score;
  bool bottleneck_assumed = false;  // a ring edge at the bottleneck has an assumed bandwidth
  bool exact = false;               // every level solved exactly
  std::vector<int> identity_ring_order;
  RingScore identity_score;  // the rank-order ring, for comparison
  DoubleTree trees;          // double binary tree across hosts, a chain within each host
  double tree_bottleneck_gbps = 0;
  double tree_max_latency_us = 0;
  std::vector<EdgeMetric> ring_edges;  // ring_edges[i]: ring[i] -> ring[i+1 mod n]
  std::vector<std::string> device_names;

  // Estimates, in seconds, for an allreduce of `bytes`.
  // ring: 2(p-1)/p * bytes / bottleneck + 2(p-1) * max_latency
  double ring_allreduce_seconds(double bytes) const;
  // double tree: bytes / tree_bottleneck (each tree carries half, up and down) + 2 * depth * max_latency
  double tree_allreduce_seconds(double bytes) const;
  std::string describe() const;
};

// Chain within each host (in ring order), NCCL double binary tree over the hosts (host leaders in ring order);
// the second tree uses the reversed host order and each chain reversed. Trees are over ranks 0..n-1.
DoubleTree hierarchical_trees(const std::vector<int>& ring, const std::vector<int>& host);

Plan plan_collectives(const Topology& t, const std::vector<RankPlacement>& placement, const PlannerOptions& o = {});
Plan plan_collectives(const RingProblem& p, const PlannerOptions& o = {});

// to_dot's picture with the plan drawn over it: the ring as red arrows labelled 1, 2... in hop order,
// the trees' edges that the ring does not draw as blue dashed arrows, each device labelled with its ranks.
std::string plan_to_dot(const Topology& t, const Plan& plan);

}  // namespace hopwise::topology
