// The plan a communicator's algorithms follow: the ring order (and side-by-side channels), the trees, the hosts
// of the ranks and the groups the hierarchical allreduce makes from them. Set by the topology planner (or by the
// caller), read by the algorithm rows through AlgorithmContext::plan.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hopwise/topology/cluster.h"
#include "hopwise/topology/shapes.h"
#include "transports/group/group_transport.h"
#include "workspace.h"

namespace hopwise::comm::detail {

struct PlanState {
  std::vector<int> ring;
  std::string text;                          // the planner's description; empty for rank order
  std::optional<topology::Cluster> cluster;  // what discovery found
  std::vector<int> host_of;                  // per rank, from the plan (empty: all on one host); set_hosts()
  // Rings run side by side by a large allreduce (channels[0] is `ring`), and a workspace for each extra one.
  std::vector<std::vector<int>> channels;
  std::vector<std::unique_ptr<Workspace>> channel_workspaces;
  // Hierarchical allreduce: this rank's host group (ring order) and, on each host's first rank, the leaders.
  std::unique_ptr<GroupTransport> host_group, leader_group;
  topology::TreeShape host_tree;  // binary tree over host_group's ranks, rooted at the leader
  // The pipelined hierarchical allreduce's reduce and broadcast threads' scratch space.
  std::array<std::unique_ptr<Workspace>, 2> hier_workspaces{std::make_unique<Workspace>(),
                                                            std::make_unique<Workspace>()};
  topology::TreeShape tree_a, tree_b;
  bool two_trees = true;
  int tree_depth = 1;  // of tree_a, for the cost model

  // A new ring: one channel, a double binary tree over it, groups made again on next use.
  void set_ring(std::vector<int> order);
  // The host of every rank, from the plan.
  void set_hosts(std::vector<int> hosts);
  // Number of hosts the plan spans (1 without a plan); counted once, asked on every call.
  int hosts() const { return host_count_; }
  // The groups for the hierarchical allreduce: the ranks of each host in ring order (the first is the host's
  // leader) and the leaders in ring order. Made on first use after the plan or the ring changed.
  void make_groups(Transport& t);
  // The planned tree when its root is `root`, else a binary tree over the ring order rotated to start there.
  const topology::TreeShape& rooted_tree(int root);

 private:
  topology::TreeShape rooted_cache_;
  int host_count_ = 1;
};

}  // namespace hopwise::comm::detail
