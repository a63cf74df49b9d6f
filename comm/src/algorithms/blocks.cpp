#include <fmt/core.h>
#include <algorithm>

#include "algorithms.h"
#include "hopwise/common/error.h"

namespace hopwise::comm::algo {

Blocks Blocks::even(std::size_t count, int p) {
  Blocks b;
  b.offsets.resize(static_cast<std::size_t>(p) + 1);
  const std::size_t base = count / static_cast<std::size_t>(p), extra = count % static_cast<std::size_t>(p);
  for (int i = 0; i < p; ++i)
    b.offsets[static_cast<std::size_t>(i) + 1] =
        b.offsets[static_cast<std::size_t>(i)] + base + (static_cast<std::size_t>(i) < extra ? 1 : 0);
  return b;
}

Blocks Blocks::uniform(std::size_t block_count, int p) {
  Blocks b;
  b.offsets.resize(static_cast<std::size_t>(p) + 1);
  for (int i = 0; i <= p; ++i) b.offsets[static_cast<std::size_t>(i)] = static_cast<std::size_t>(i) * block_count;
  return b;
}

int position_of(const std::vector<int>& order, int rank) {
  auto it = std::find(order.begin(), order.end(), rank);
  if (it == order.end()) throw InvalidArgument(fmt::format("rank {} is missing from the ring order", rank));
  return static_cast<int>(it - order.begin());
}

}  // namespace hopwise::comm::algo
