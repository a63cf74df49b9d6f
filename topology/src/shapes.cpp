// Ring orders and tree shapes (shapes.h): the identity ring, binary and double binary trees, depth, and the checks.
#include "hopwise/topology/shapes.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "hopwise/common/error.h"

namespace hopwise::topology {

int TreeShape::depth() const {
  int best = 0;
  for (std::size_t r = 0; r < parent.size(); ++r) {
    int d = 0;
    for (int p = parent[r]; p >= 0 && d <= static_cast<int>(parent.size()); p = parent[p]) ++d;
    best = std::max(best, d);
  }
  return best;
}

std::vector<int> identity_ring(int n) {
  std::vector<int> v(static_cast<std::size_t>(std::max(n, 0)));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

void validate_ring(const std::vector<int>& order, int n) {
  std::vector<char> seen(static_cast<std::size_t>(n), 0);
  bool ok = static_cast<int>(order.size()) == n;
  for (int r : order) {
    if (!ok) break;
    ok = r >= 0 && r < n && !seen[static_cast<std::size_t>(r)];
    if (ok) seen[static_cast<std::size_t>(r)] = 1;
  }
  if (!ok)
    throw InvalidArgument(
        fmt::format("ring order [{}] is not a permutation of the {} ranks 0..{}; pass each rank "
                    "exactly once",
                    fmt::join(order, ","), n, n - 1));
}

TreeShape binary_tree(const std::vector<int>& order) {
  const int n = static_cast<int>(order.size());
  validate_ring(order, n);
  TreeShape t;
  t.root = n > 0 ? order[0] : 0;
  t.parent.assign(static_cast<std::size_t>(n), -1);
  t.children.assign(static_cast<std::size_t>(n), {});
  for (int i = 1; i < n; ++i) {
    const int parent = order[static_cast<std::size_t>((i - 1) / 2)];
    t.parent[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = parent;
    t.children[static_cast<std::size_t>(parent)].push_back(order[static_cast<std::size_t>(i)]);
  }
  return t;
}

DoubleTree double_binary_tree(const std::vector<int>& order) {
  std::vector<int> reversed(order.rbegin(), order.rend());
  return {binary_tree(order), binary_tree(reversed)};
}

void validate_tree(const TreeShape& t, int n) {
  auto fail = [&](const std::string& why) {
    throw InvalidArgument(
        fmt::format("tree over {} ranks is invalid: {}; give every rank but the root one parent "
                    "and list it among that parent's children",
                    n, why));
  };
  if (static_cast<int>(t.parent.size()) != n || static_cast<int>(t.children.size()) != n)
    fail(fmt::format("parent has {} entries and children {}", t.parent.size(), t.children.size()));
  if (n == 0) return;
  if (t.root < 0 || t.root >= n || t.parent[static_cast<std::size_t>(t.root)] != -1)
    fail(fmt::format("root {} is out of range or has a parent", t.root));
  std::size_t edges = 0;
  for (int r = 0; r < n; ++r) {
    const int p = t.parent[static_cast<std::size_t>(r)];
    if (r != t.root) {
      if (p < 0 || p >= n) fail(fmt::format("rank {} has parent {}", r, p));
      const auto& c = t.children[static_cast<std::size_t>(p)];
      if (std::find(c.begin(), c.end(), r) == c.end())
        fail(fmt::format("rank {} names parent {} but is not among its children", r, p));
    }
    for (int c : t.children[static_cast<std::size_t>(r)]) {
      if (c < 0 || c >= n || t.parent[static_cast<std::size_t>(c)] != r)
        fail(fmt::format("rank {} lists child {} whose parent is not {}", r, c, r));
      ++edges;
    }
  }
  if (edges != static_cast<std::size_t>(n - 1)) fail(fmt::format("{} edges, expected {}", edges, n - 1));
  if (t.depth() >= n) fail("it has a cycle");
}

}  // namespace hopwise::topology
