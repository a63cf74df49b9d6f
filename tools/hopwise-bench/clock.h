// The bench's clock: seconds on the steady clock, read by the memcpy probe (buffers.cpp), the timed rows
// (bench.h, bench.cpp) and the overlap table (bench_overlap.cpp).
#pragma once

#include <chrono>

namespace hopwise::bench {

using Clock = std::chrono::steady_clock;

inline double now_s() { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); }

}  // namespace hopwise::bench
