#include "plan_state.h"

#include <algorithm>

#include "algorithms/algorithms.h"

namespace hopwise::comm::detail {

void PlanState::set_ring(std::vector<int> order) {
  ring = std::move(order);
  channels.clear();    // one ring until the caller sets channels
  host_group.reset();  // the hierarchical groups follow the ring
  leader_group.reset();
  const auto trees = topology::double_binary_tree(ring);
  tree_a = trees.first;
  tree_b = trees.second;
  tree_depth = tree_a.depth();
  two_trees = true;
}

void PlanState::set_hosts(std::vector<int> hosts) {
  host_of = std::move(hosts);
  std::vector<int> seen(host_of);
  std::sort(seen.begin(), seen.end());
  host_count_ = std::max(1, static_cast<int>(std::unique(seen.begin(), seen.end()) - seen.begin()));
  host_group.reset();  // the hierarchical groups follow the hosts
  leader_group.reset();
}

void PlanState::make_groups(Transport& t) {
  if (host_group) return;
  std::vector<int> mine, leaders, seen_hosts;
  const int me = t.rank();
  auto host = [&](int r) { return host_of.empty() ? 0 : host_of[static_cast<std::size_t>(r)]; };
  for (int r : ring) {
    if (host(r) == host(me)) mine.push_back(r);
    if (std::find(seen_hosts.begin(), seen_hosts.end(), host(r)) == seen_hosts.end()) {
      seen_hosts.push_back(host(r));
      leaders.push_back(r);
    }
  }
  host_group = std::make_unique<GroupTransport>(t, mine);
  host_tree = topology::binary_tree(topology::identity_ring(static_cast<int>(mine.size())));
  if (mine.front() == me) leader_group = std::make_unique<GroupTransport>(t, leaders);
}

const topology::TreeShape& PlanState::rooted_tree(int root) {
  if (tree_a.root == root) return tree_a;
  if (rooted_cache_.root != root || rooted_cache_.parent.size() != ring.size()) {
    std::vector<int> order(ring);
    std::rotate(order.begin(), order.begin() + algo::position_of(order, root), order.end());
    rooted_cache_ = topology::binary_tree(order);
  }
  return rooted_cache_;
}

}  // namespace hopwise::comm::detail
