// Element-wise reductions on device memory (CUDA). Built when HOPWISE_WITH_CUDA finds nvcc; the same semantics
// as reduce_into() on the host: float16/bfloat16 compute in float32, integers wrap.
#pragma once

#include <cstddef>
#include <string>

#include "hopwise/common/dtype.h"

namespace hopwise::cuda {

// Number of usable CUDA devices; 0 (with `why` set) when there is no driver or no GPU.
int device_count(std::string* why = nullptr);

// dst[i] = a[i] op b[i] on the given stream (nullptr = default stream). Pointers are device memory.
void reduce_into(DataType dt, ReduceOp op, void* dst, const void* a, const void* b, std::size_t n,
                 void* stream = nullptr);

// x[i] *= factor on the stream, for the floating dtypes (float16/bfloat16 in float32, float64 in double): the 1/n
// of an average. Integers are an InvalidArgument.
void scale(DataType dt, void* x, double factor, std::size_t n, void* stream = nullptr);

// Copies between host and device and synchronizes (for tests and tools).
void copy_to_device(void* dst, const void* src, std::size_t bytes);
void copy_to_host(void* dst, const void* src, std::size_t bytes);
void* device_alloc(std::size_t bytes);
void device_free(void* p);

}  // namespace hopwise::cuda
