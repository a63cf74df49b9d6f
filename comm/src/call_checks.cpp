#include "call_checks.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>

#include "hopwise/common/error.h"

namespace hopwise::comm::checks {

void buffers(std::string_view what, const void* in, std::size_t in_count, const void* out, std::size_t out_count,
             DataType dt, int rank) {
  checked_bytes(std::max(in_count, out_count), dt, what);
  if (in_count > 0 && in == nullptr)
    throw InvalidArgument(
        fmt::format("{} on rank {}: input buffer is null but count is {}; pass a buffer of {} "
                    "elements of {}",
                    what, rank, in_count, in_count, to_string(dt)));
  if (out_count > 0 && out == nullptr)
    throw InvalidArgument(
        fmt::format("{} on rank {}: output buffer is null but count is {}; pass a buffer of {} "
                    "elements of {}",
                    what, rank, out_count, out_count, to_string(dt)));
}

void root(std::string_view what, int root, int size) {
  if (root < 0 || root >= size)
    throw InvalidArgument(fmt::format("{}: root {} is out of range; use a rank in 0..{}", what, root, size - 1));
}

std::size_t times_ranks(std::string_view what, std::size_t count, int size, int rank) {
  if (count > 0 && count > std::numeric_limits<std::size_t>::max() / 16 / static_cast<std::size_t>(size))
    throw InvalidArgument(fmt::format("{} on rank {}: count {} times {} ranks overflows", what, rank, count, size));
  return count * static_cast<std::size_t>(size);
}

void sum_or_avg(std::string_view what, ReduceOp op, std::string_view why) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAvg)
    throw InvalidArgument(fmt::format("{}: op {} is not available; {} (use sum or avg)", what, to_string(op), why));
}

}  // namespace hopwise::comm::checks
