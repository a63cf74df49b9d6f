// hopwise-bench's row order: every iteration a permutation, and over a full block each row follows each other row
// equally often (the bench's rows are compared with each other, so none may sit more often behind a row that
// helps or hurts it).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <utility>

#include "../tools/hopwise-bench/order.h"

using hopwise::bench::balanced_order;

TEST(BenchOrder, EveryRowFollowsEveryOtherEquallyOften) {
  for (std::size_t n = 1; n <= 12; ++n) {
    const int block = static_cast<int>(n % 2 == 0 ? n : 2 * n);
    std::map<std::pair<std::size_t, std::size_t>, int> follows;
    std::vector<int> first(n, 0);
    for (int it = 0; it < block; ++it) {
      auto order = balanced_order(n, it);
      auto sorted = order;
      std::sort(sorted.begin(), sorted.end());
      std::vector<std::size_t> all(n);
      std::iota(all.begin(), all.end(), std::size_t{0});
      ASSERT_EQ(sorted, all) << "n " << n << ", iteration " << it << ": not a permutation";
      ++first[order[0]];
      for (std::size_t j = 1; j < n; ++j) ++follows[{order[j - 1], order[j]}];
    }
    const int each = n % 2 == 0 ? 1 : 2;
    for (std::size_t a = 0; a < n; ++a)
      for (std::size_t b = 0; b < n; ++b)
        if (a != b) {
          EXPECT_EQ((follows[{a, b}]), each) << "n " << n << ": row " << b << " after row " << a;
        }
    for (std::size_t a = 0; a < n; ++a) EXPECT_EQ(first[a], block / static_cast<int>(n)) << "n " << n;
  }
}

TEST(BenchOrder, NoRowsNoOrder) { EXPECT_TRUE(balanced_order(0, 3).empty()); }
