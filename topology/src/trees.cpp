// The plan's double binary trees (hierarchical_trees): NCCL's double binary tree over the hosts' leaders, a chain
// through the ranks of each host.
#include "hopwise/topology/planner.h"

#include <algorithm>
#include <map>
#include <vector>

namespace hopwise::topology {

namespace {
using std::size_t;
}  // namespace

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

}  // namespace hopwise::topology
