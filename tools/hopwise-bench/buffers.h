// The bench's data: the page-aligned buffers every row runs in, the exact integer pattern the checks fill them
// with, and the single-core memcpy rate the header prints as the physical limit. Kept apart from Bench, which
// only uses them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>

#include "hopwise/common/dtype.h"

namespace hopwise::bench {

// Page-aligned, pre-touched buffer: page faults inside a timed call would measure the kernel, not the collective.
struct Buffer {
  explicit Buffer(std::size_t bytes) : size(std::max<std::size_t>(bytes, 64)) {
    data = static_cast<char*>(std::aligned_alloc(4096, (size + 4095) & ~std::size_t{4095}));
    if (data == nullptr) throw std::bad_alloc();
    std::memset(data, 0, size);
    // The buffer escapes here, as it did while this constructor was out of line in main.cpp: inlined into
    // memcpy_gbs, the compiler dropped the timed copies into a buffer freed unread (and that buffer's memset), and
    // the memcpy rate read ~10^6 GB/s.
    asm volatile("" : : "r"(data) : "memory");
  }
  ~Buffer() { std::free(data); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data;
  std::size_t size;
};

// `count` elements of `dt` holding rank `rank`'s check pattern for `op` (small integers, exact in every dtype and
// any order of reduction), starting at element `first` of the pattern.
void fill(void* buf, std::size_t count, DataType dt, int rank, ReduceOp op, std::size_t first = 0);

// The single-core memcpy rate in GB/s: the best of 5 copies of 64 MiB.
double memcpy_gbs();

}  // namespace hopwise::bench
