// Bucket planning (bucket_plan.h): the assignment, the FNV-1a layout fingerprint and the rebuild rule, once for
// the host and the device reducer.
#include "bucket_plan.h"

#include <fmt/core.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "hopwise/common/error.h"

namespace hopwise::comm::bucket_plan {

std::vector<int> reverse_order(std::size_t n) {
  std::vector<int> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<int>(n - 1 - i);
  return order;
}

std::vector<Planned> assign(std::span<const Gradient> gradients, std::span<const int> order,
                            const ReducerOptions& options) {
  const auto first_cap = static_cast<std::size_t>(options.first_bucket_mb * (1 << 20) / sizeof(float));
  const auto cap = static_cast<std::size_t>(options.bucket_mb * (1 << 20) / sizeof(float));
  std::vector<Planned> buckets;
  for (int i : order) {
    const std::size_t count = gradients[static_cast<std::size_t>(i)].count;
    const std::size_t limit = buckets.size() <= 1 ? first_cap : cap;
    if (buckets.empty() || (buckets.back().count > 0 && buckets.back().count + count > limit)) buckets.emplace_back();
    buckets.back().members.push_back(i);
    buckets.back().count += count;
  }
  return buckets;
}

std::uint64_t fingerprint(std::span<const Gradient> gradients, std::string_view compression,
                          std::span<const Planned> buckets) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  auto mix = [&](std::uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(gradients.size());
  for (const Gradient& g : gradients) {
    mix(g.count);
    mix(g.rows);
    for (char ch : g.name) mix(static_cast<unsigned char>(ch));
  }
  for (char ch : compression) mix(static_cast<unsigned char>(ch));
  mix(buckets.size());
  for (const Planned& b : buckets) mix(b.count);
  return h;
}

void check_same_layout(std::span<const std::uint64_t> all, int rank, std::string_view kind) {
  std::vector<int> differ;
  for (std::size_t r = 0; r < all.size(); ++r)
    if (all[r] != all[0]) differ.push_back(static_cast<int>(r));
  if (!differ.empty())
    throw InvalidArgument(
        fmt::format("rank {}: {} bucket layout differs from rank 0's on rank(s) {}; every rank "
                    "must register the same parameters (names, sizes, order) with the same bucket "
                    "and compression options",
                    rank, kind, fmt::join(differ, ",")));
}

std::optional<std::vector<int>> rebuild_order(std::span<const int> observed, std::size_t n) {
  const std::vector<int> expected = reverse_order(n);
  if (std::equal(observed.begin(), observed.end(), expected.begin(), expected.end())) return std::nullopt;
  return std::vector<int>(observed.begin(), observed.end());
}

}  // namespace hopwise::comm::bucket_plan
