// The order the bench times its rows in, iteration by iteration: balanced, so that no row more often follows the
// one that helps or hurts it.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

namespace hopwise::bench {

// Iteration `it`'s order of n rows: row `it mod n` of a Williams square (0, 1, n-1, 2, n-2, ..., every entry
// shifted by the row), mirrored in every other block of n iterations where n is odd. Over every n iterations (2n
// for an odd n) each row directly follows each other row equally often: once (odd n: twice).
inline std::vector<std::size_t> balanced_order(std::size_t n, int it) {
  std::vector<std::size_t> order(n);
  if (n == 0) return order;
  const std::size_t shift = static_cast<std::size_t>(it) % n;
  for (std::size_t j = 0, lo = 1, hi = n - 1; j < n; ++j) order[j] = j == 0 ? 0 : j % 2 == 1 ? lo++ : hi--;
  for (std::size_t& k : order) k = (k + shift) % n;
  if (n % 2 == 1 && (static_cast<std::size_t>(it) / n) % 2 == 1) std::reverse(order.begin(), order.end());
  return order;
}

}  // namespace hopwise::bench
