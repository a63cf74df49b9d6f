// The check pattern and the memcpy probe of buffers.h.
#include "buffers.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "clock.h"
#include "hopwise/common/half.h"

namespace hopwise::bench {
namespace {

// Small integers, so that every sum, product, min and max is exact in every dtype and any order of reduction.
int pattern(std::size_t i, int rank, ReduceOp op, DataType dt) {
  const std::size_t k = i * 7 + static_cast<std::size_t>(rank) * 13;
  if (op == ReduceOp::kProd) {
    const std::size_t m = (i + static_cast<std::size_t>(rank)) % 5;
    return m == 1 ? 2 : (m == 3 && dt != DataType::kUInt8 ? -1 : 1);
  }
  return dt == DataType::kUInt8 ? static_cast<int>(k % 9) : static_cast<int>(k % 9) - 4;
}

}  // namespace

void fill(void* buf, std::size_t count, DataType dt, int rank, ReduceOp op, std::size_t first) {
  for (std::size_t j = 0; j < count; ++j) {
    const int v = pattern(first + j, rank, op, dt);
    switch (dt) {
      case DataType::kFloat32: static_cast<float*>(buf)[j] = static_cast<float>(v); break;
      case DataType::kFloat64: static_cast<double*>(buf)[j] = v; break;
      case DataType::kFloat16: static_cast<std::uint16_t*>(buf)[j] = float_to_fp16(static_cast<float>(v)); break;
      case DataType::kBFloat16: static_cast<std::uint16_t*>(buf)[j] = float_to_bf16(static_cast<float>(v)); break;
      case DataType::kInt32: static_cast<std::int32_t*>(buf)[j] = v; break;
      case DataType::kInt64: static_cast<std::int64_t*>(buf)[j] = v; break;
      case DataType::kUInt8: static_cast<std::uint8_t*>(buf)[j] = static_cast<std::uint8_t>(v); break;
    }
  }
}

double memcpy_gbs() {
  constexpr std::size_t kBytes = 64 << 20;
  Buffer a(kBytes), b(kBytes);
  double best = 1e9;
  for (int i = 0; i < 5; ++i) {
    const double t0 = now_s();
    std::memcpy(b.data, a.data, kBytes);
    best = std::min(best, now_s() - t0);
  }
  return kBytes / best / 1e9;
}

}  // namespace hopwise::bench
