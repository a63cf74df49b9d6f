// Element-wise reduction kernels on host memory, vectorized with run-time dispatch (AVX-512, AVX2, generic).
#pragma once

#include <cstddef>
#include <string_view>

#include "hopwise/common/dtype.h"

namespace hopwise {

// dst[i] = a[i] op b[i] for i < n. dst may alias a or b (not partially overlap).
// kAvg reduces as kSum: averaging is a final scale_by(). float16/bfloat16 compute in float32.
void reduce_into(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n);

// buf[i] *= factor (floating types only; used for kAvg).
void scale_by(DataType dt, void* buf, std::size_t n, double factor);

// dst = src for `bytes` bytes (memmove: they may overlap); the copies of the collective algorithms go through it,
// so that a simulation sees them (set_work_hook).
void copy_bytes(void* dst, const void* src, std::size_t bytes);

// The element-wise work above as a simulation sees it: a hook installed on a thread is told the bytes of each
// reduce_into (its output's), scale_by and copy_bytes on that thread, and returns true where the work is to be
// skipped (simulated ranks whose buffers hold nothing: only the time is charged). nullptr removes it.
enum class ElementWork { kReduce, kScale, kCopy };
using WorkHook = bool (*)(ElementWork work, std::size_t bytes);
void set_work_hook(WorkHook hook);

// Which kernel set the dispatcher picked on this CPU: "avx512", "avx2" or "generic".
// HOPWISE_ISA=generic|avx2|avx512 caps it (for tests and comparisons).
std::string_view active_isa();

}  // namespace hopwise
