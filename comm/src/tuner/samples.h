// What the tuners share: robust summaries of timed samples, and a size class as logs name it.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <string>
#include <vector>

#include "hopwise/comm/tuning.h"

namespace hopwise::comm::detail {

// The middle sample (the upper one of an even count); `empty` where there is none.
inline double median_of(std::vector<double> v, double empty = INFINITY) {
  if (v.empty()) return empty;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The mean without the slowest eighth: calls in a row are not alike (a rank that arrives late finds its peers'
// data ready and finishes at once, the early one waits), so their sum, what the run pays, is what counts; a median
// would drop exactly those differences. The slowest eighth goes because on shared cores a call that lost its core
// says nothing about the algorithm.
inline double trimmed_mean_of(std::vector<double> v, double empty = INFINITY) {
  if (v.empty()) return empty;
  std::sort(v.begin(), v.end());
  const std::size_t keep = v.size() - v.size() / 8;
  return std::accumulate(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(keep), 0.0) / static_cast<double>(keep);
}

// "4 KiB", "16 MiB": the largest call of a size class.
inline std::string size_class_text(int size_class) {
  const std::size_t hi = size_class_max_bytes(size_class);
  return hi >= (1u << 20) ? fmt::format("{} MiB", hi >> 20)
         : hi >= 1024     ? fmt::format("{} KiB", hi >> 10)
                          : fmt::format("{} B", hi);
}

}  // namespace hopwise::comm::detail
