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

// Which kernel set the dispatcher picked on this CPU: "avx512", "avx2" or "generic".
// HOPWISE_ISA=generic|avx2|avx512 caps it (for tests and comparisons).
std::string_view active_isa();

}  // namespace hopwise
