// hopwise::topology: ring orders and the (double) binary trees the communicator runs its tree algorithms on.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "hopwise/common/error.h"
#include "hopwise/topology/shapes.h"

namespace {

using hopwise::topology::TreeShape;
namespace topo = hopwise::topology;

std::string error_of(const TreeShape& t, int n) {
  try {
    topo::validate_tree(t, n);
  } catch (const hopwise::InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// Every rank reaches the root by parent links, and children mirror parents.
void expect_spanning_tree(const TreeShape& t, int n) {
  ASSERT_EQ(static_cast<int>(t.parent.size()), n);
  ASSERT_EQ(static_cast<int>(t.children.size()), n);
  EXPECT_EQ(t.parent[static_cast<std::size_t>(t.root)], -1);
  for (int r = 0; r < n; ++r) {
    int x = r, hops = 0;
    while (x != t.root && hops <= n) {
      x = t.parent[static_cast<std::size_t>(x)];
      ASSERT_GE(x, 0) << "rank " << r << " does not reach the root";
      ++hops;
    }
    EXPECT_EQ(x, t.root) << "rank " << r;
    for (int c : t.children[static_cast<std::size_t>(r)]) EXPECT_EQ(t.parent[static_cast<std::size_t>(c)], r);
  }
}

TEST(Ring, Identity) {
  EXPECT_EQ(topo::identity_ring(0), std::vector<int>{});
  EXPECT_EQ(topo::identity_ring(1), std::vector<int>{0});
  EXPECT_EQ(topo::identity_ring(5), (std::vector<int>{0, 1, 2, 3, 4}));
  for (int n = 1; n <= 64; ++n) EXPECT_NO_THROW(topo::validate_ring(topo::identity_ring(n), n));
}

TEST(Ring, ValidateAcceptsPermutations) {
  std::mt19937 rng(std::random_device{}());
  for (int n = 1; n <= 40; ++n) {
    std::vector<int> v = topo::identity_ring(n);
    std::shuffle(v.begin(), v.end(), rng);
    EXPECT_NO_THROW(topo::validate_ring(v, n));
  }
}

TEST(Ring, ValidateRejectsNonPermutations) {
  const std::vector<std::pair<std::vector<int>, int>> bad = {{{0, 1, 1}, 3}, {{0, 1}, 3},     {{0, 1, 2, 3}, 3},
                                                             {{0, 1, 3}, 3}, {{-1, 0, 1}, 3}, {{}, 1},
                                                             {{0}, 2},       {{2, 2, 2}, 3}};
  for (const auto& [order, n] : bad) {
    SCOPED_TRACE(::testing::PrintToString(order) + " n=" + std::to_string(n));
    EXPECT_THROW(topo::validate_ring(order, n), hopwise::InvalidArgument);
  }
  try {
    topo::validate_ring({0, 0}, 2);
    FAIL() << "no exception";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("permutation"), std::string::npos) << e.what();
  }
}

TEST(Tree, BinaryTreeHeapLayout) {
  const std::vector<int> order{3, 0, 4, 1, 2};
  const TreeShape t = topo::binary_tree(order);
  EXPECT_EQ(t.root, 3);
  EXPECT_EQ(t.parent, (std::vector<int>{3, 0, 0, -1, 3}));
  EXPECT_EQ(t.children[3], (std::vector<int>{0, 4}));
  EXPECT_EQ(t.children[0], (std::vector<int>{1, 2}));
  EXPECT_TRUE(t.children[1].empty());
  EXPECT_TRUE(t.children[2].empty());
  EXPECT_TRUE(t.children[4].empty());
  EXPECT_EQ(t.depth(), 2);
  EXPECT_NO_THROW(topo::validate_tree(t, 5));
}

TEST(Tree, BinaryTreeShapesAndDepth) {
  std::mt19937 rng(std::random_device{}());
  for (int n = 1; n <= 70; ++n) {
    SCOPED_TRACE(n);
    std::vector<int> order = topo::identity_ring(n);
    std::shuffle(order.begin(), order.end(), rng);
    const TreeShape t = topo::binary_tree(order);
    EXPECT_EQ(t.root, order[0]);
    expect_spanning_tree(t, n);
    EXPECT_NO_THROW(topo::validate_tree(t, n));
    int expected_depth = 0;
    while ((2 << expected_depth) - 1 < n) ++expected_depth;  // floor(log2 n)
    EXPECT_EQ(t.depth(), expected_depth);
    for (int r = 0; r < n; ++r) EXPECT_LE(t.children[static_cast<std::size_t>(r)].size(), 2u);
  }
  EXPECT_THROW(topo::binary_tree({0, 0, 1}), hopwise::InvalidArgument);
}

TEST(Tree, DoubleBinaryTree) {
  for (int n = 1; n <= 64; ++n) {
    SCOPED_TRACE(n);
    const auto order = topo::identity_ring(n);
    const topo::DoubleTree d = topo::double_binary_tree(order);
    EXPECT_EQ(d.first.root, 0);
    EXPECT_EQ(d.second.root, n - 1);
    expect_spanning_tree(d.first, n);
    expect_spanning_tree(d.second, n);
    EXPECT_NO_THROW(topo::validate_tree(d.first, n));
    EXPECT_NO_THROW(topo::validate_tree(d.second, n));
    if (n % 2 == 0) {
      // The interior nodes of one tree are leaves of the other.
      for (int r = 0; r < n; ++r)
        EXPECT_FALSE(!d.first.children[static_cast<std::size_t>(r)].empty() &&
                     !d.second.children[static_cast<std::size_t>(r)].empty())
            << "rank " << r << " is interior in both trees";
    }
  }
}

TEST(Tree, Depth) {
  TreeShape chain;
  chain.root = 0;
  chain.parent = {-1, 0, 1, 2};
  chain.children = {{1}, {2}, {3}, {}};
  EXPECT_EQ(chain.depth(), 3);
  TreeShape star;
  star.root = 2;
  star.parent = {2, 2, -1, 2};
  star.children = {{}, {}, {0, 1, 3}, {}};
  EXPECT_EQ(star.depth(), 1);
  TreeShape one;
  one.parent = {-1};
  one.children = {{}};
  EXPECT_EQ(one.depth(), 0);
}

TEST(Tree, ValidateAcceptsCustomTrees) {
  TreeShape chain;
  chain.root = 3;
  chain.parent = {1, 2, 3, -1};
  chain.children = {{}, {0}, {1}, {2}};
  EXPECT_EQ(error_of(chain, 4), "");
  TreeShape star;
  star.root = 1;
  star.parent = {1, -1, 1, 1, 1};
  star.children = {{}, {4, 0, 3, 2}, {}, {}, {}};
  EXPECT_EQ(error_of(star, 5), "");
  TreeShape empty;
  EXPECT_EQ(error_of(empty, 0), "");
}

TEST(Tree, ValidateRejectsBrokenTrees) {
  auto base = [] {
    TreeShape t;  // 0 -> {1, 2}, 1 -> {3}
    t.root = 0;
    t.parent = {-1, 0, 0, 1};
    t.children = {{1, 2}, {3}, {}, {}};
    return t;
  };
  ASSERT_EQ(error_of(base(), 4), "");
  std::vector<std::pair<std::string, TreeShape>> bad;
  {
    TreeShape t = base();
    t.parent.pop_back();
    bad.emplace_back("parent too short", t);
  }
  {
    TreeShape t = base();
    t.children.emplace_back();
    bad.emplace_back("children too long", t);
  }
  {
    TreeShape t = base();
    t.root = 4;
    bad.emplace_back("root out of range", t);
  }
  {
    TreeShape t = base();
    t.root = 1;
    bad.emplace_back("root has a parent", t);
  }
  {
    TreeShape t = base();
    t.parent[3] = 2;  // parent says 2, children say 1
    bad.emplace_back("parent and children disagree", t);
  }
  {
    TreeShape t = base();
    t.children[2].push_back(3);  // 3 listed twice
    bad.emplace_back("child listed under two parents", t);
  }
  {
    TreeShape t = base();
    t.parent[3] = 7;
    bad.emplace_back("parent out of range", t);
  }
  {
    TreeShape t = base();
    t.children[0] = {1, 2, 2};
    bad.emplace_back("child listed twice", t);
  }
  {
    TreeShape t;  // 0 is the root; 1 and 2 are each other's parents: a cycle off the tree
    t.root = 0;
    t.parent = {-1, 2, 1};
    t.children = {{}, {2}, {1}};
    bad.emplace_back("cycle", t);
  }
  {
    TreeShape t = base();
    t.parent[2] = -1;  // a second root
    t.children[0] = {1};
    bad.emplace_back("two roots", t);
  }
  for (const auto& [why, t] : bad) {
    SCOPED_TRACE(why);
    EXPECT_NE(error_of(t, 4), "");
  }
  EXPECT_NE(error_of(base(), 5), "") << "wrong rank count";
}

}  // namespace
