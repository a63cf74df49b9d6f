// Robust summaries of timed samples, shared by the tuners of the engine (comm/src/tuner) and of the training layer
// (the reducer's step tuner).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <vector>

namespace hopwise::samples {

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

}  // namespace hopwise::samples
