// The shapes that the topology planner hands to comm/: a ring order and trees over ranks.
// Pure data plus checks; the planner (planner.h) fills them from the machine, and rank order stands in without a plan.
#pragma once

#include <vector>

namespace hopwise::topology {

// A tree over ranks 0..n-1: parent[r] is -1 for the root; children[r] lists r's children in send order.
struct TreeShape {
  int root = 0;
  std::vector<int> parent;
  std::vector<std::vector<int>> children;
  int depth() const;  // edges on the longest root-to-leaf path
};

// 0, 1, ..., n-1.
std::vector<int> identity_ring(int n);

// Throws InvalidArgument unless `order` is a permutation of 0..n-1.
void validate_ring(const std::vector<int>& order, int n);

// Binary tree in heap layout over `order`: order[0] is the root, order[i]'s children are order[2i+1], order[2i+2].
TreeShape binary_tree(const std::vector<int>& order);

// NCCL-style double binary tree: the second tree is the heap over the reversed order, so that the interior
// nodes of one tree are (for even n) leaves of the other and every rank sends and receives about equally.
struct DoubleTree {
  TreeShape first;
  TreeShape second;
};
DoubleTree double_binary_tree(const std::vector<int>& order);

// Throws InvalidArgument unless `tree` spans 0..n-1 with consistent parent/children links and one root.
void validate_tree(const TreeShape& tree, int n);

}  // namespace hopwise::topology
