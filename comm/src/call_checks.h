// The argument checks of every public call, host and device alike: each names the call, the rank, the argument
// that is wrong and what to pass instead.
#pragma once

#include <cstddef>
#include <string_view>

#include "hopwise/common/dtype.h"

namespace hopwise::comm::checks {

// A null buffer with a nonzero count, or a count whose bytes overflow.
void buffers(std::string_view what, const void* in, std::size_t in_count, const void* out, std::size_t out_count,
             DataType dt, int rank);
// A root outside 0..size-1.
void root(std::string_view what, int root, int size);
// `count` times `size` ranks (the whole buffer of a reduce_scatter input or an allgather output), checked for
// overflow.
std::size_t times_ranks(std::string_view what, std::size_t count, int size, int rank);
// The op a codec or PowerSGD can apply: sum or avg.
void sum_or_avg(std::string_view what, ReduceOp op, std::string_view why);

}  // namespace hopwise::comm::checks
