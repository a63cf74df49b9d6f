// CUDA reduction kernels against the host kernels. Skips, with the reason, where no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/half.h"
#include "hopwise/common/reduce.h"

namespace {

TEST(CudaReduce, MatchesHostKernelsForEveryDtypeAndOp) {
  std::string why;
  if (hopwise::cuda::device_count(&why) == 0) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  std::mt19937 rng(std::random_device{}());
  const unsigned seed = rng();
  SCOPED_TRACE("seed " + std::to_string(seed));
  rng.seed(seed);
  for (hopwise::DataType dt : hopwise::kAllDataTypes) {
    for (hopwise::ReduceOp op : {hopwise::ReduceOp::kSum, hopwise::ReduceOp::kMin, hopwise::ReduceOp::kMax,
                                 hopwise::ReduceOp::kProd}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000003}}) {
        const std::size_t bytes = n * hopwise::dtype_size(dt);
        std::vector<unsigned char> a(bytes), b(bytes), host(bytes), dev(bytes);
        // Bytes of small values keep every dtype finite: use the same small integers for each type.
        for (std::size_t i = 0; i < n; ++i) {
          const int x = static_cast<int>(rng() % 7) + 1, y = static_cast<int>(rng() % 7) + 1;
          switch (dt) {
            case hopwise::DataType::kFloat32: reinterpret_cast<float*>(a.data())[i] = x; reinterpret_cast<float*>(b.data())[i] = y; break;
            case hopwise::DataType::kFloat64: reinterpret_cast<double*>(a.data())[i] = x; reinterpret_cast<double*>(b.data())[i] = y; break;
            case hopwise::DataType::kFloat16: reinterpret_cast<std::uint16_t*>(a.data())[i] = hopwise::float_to_fp16(x); reinterpret_cast<std::uint16_t*>(b.data())[i] = hopwise::float_to_fp16(y); break;
            case hopwise::DataType::kBFloat16: reinterpret_cast<std::uint16_t*>(a.data())[i] = hopwise::float_to_bf16(x); reinterpret_cast<std::uint16_t*>(b.data())[i] = hopwise::float_to_bf16(y); break;
            case hopwise::DataType::kInt32: reinterpret_cast<std::int32_t*>(a.data())[i] = x; reinterpret_cast<std::int32_t*>(b.data())[i] = y; break;
            case hopwise::DataType::kInt64: reinterpret_cast<std::int64_t*>(a.data())[i] = x; reinterpret_cast<std::int64_t*>(b.data())[i] = y; break;
            case hopwise::DataType::kUInt8: a[i] = static_cast<unsigned char>(x); b[i] = static_cast<unsigned char>(y); break;
          }
        }
        hopwise::reduce_into(dt, op, host.data(), a.data(), b.data(), n);
        void* da = hopwise::cuda::device_alloc(bytes);
        void* db = hopwise::cuda::device_alloc(bytes);
        hopwise::cuda::copy_to_device(da, a.data(), bytes);
        hopwise::cuda::copy_to_device(db, b.data(), bytes);
        hopwise::cuda::reduce_into(dt, op, da, da, db, n);
        hopwise::cuda::copy_to_host(dev.data(), da, bytes);
        hopwise::cuda::device_free(da);
        hopwise::cuda::device_free(db);
        EXPECT_EQ(0, std::memcmp(host.data(), dev.data(), bytes))
            << hopwise::to_string(dt) << " " << hopwise::to_string(op) << " n=" << n;
      }
    }
  }
}

}  // namespace
