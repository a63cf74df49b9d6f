// CUDA reduction kernels against the host kernels. Skips, with the reason, where no GPU is visible.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/error.h"
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
    for (hopwise::ReduceOp op :
         {hopwise::ReduceOp::kSum, hopwise::ReduceOp::kMin, hopwise::ReduceOp::kMax, hopwise::ReduceOp::kProd}) {
      for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{1000003}}) {
        const std::size_t bytes = n * hopwise::dtype_size(dt);
        std::vector<unsigned char> a(bytes), b(bytes), host(bytes), dev(bytes);
        // Bytes of small values keep every dtype finite: use the same small integers for each type.
        for (std::size_t i = 0; i < n; ++i) {
          const int x = static_cast<int>(rng() % 7) + 1, y = static_cast<int>(rng() % 7) + 1;
          switch (dt) {
            case hopwise::DataType::kFloat32:
              reinterpret_cast<float*>(a.data())[i] = x;
              reinterpret_cast<float*>(b.data())[i] = y;
              break;
            case hopwise::DataType::kFloat64:
              reinterpret_cast<double*>(a.data())[i] = x;
              reinterpret_cast<double*>(b.data())[i] = y;
              break;
            case hopwise::DataType::kFloat16:
              reinterpret_cast<std::uint16_t*>(a.data())[i] = hopwise::float_to_fp16(x);
              reinterpret_cast<std::uint16_t*>(b.data())[i] = hopwise::float_to_fp16(y);
              break;
            case hopwise::DataType::kBFloat16:
              reinterpret_cast<std::uint16_t*>(a.data())[i] = hopwise::float_to_bf16(x);
              reinterpret_cast<std::uint16_t*>(b.data())[i] = hopwise::float_to_bf16(y);
              break;
            case hopwise::DataType::kInt32:
              reinterpret_cast<std::int32_t*>(a.data())[i] = x;
              reinterpret_cast<std::int32_t*>(b.data())[i] = y;
              break;
            case hopwise::DataType::kInt64:
              reinterpret_cast<std::int64_t*>(a.data())[i] = x;
              reinterpret_cast<std::int64_t*>(b.data())[i] = y;
              break;
            case hopwise::DataType::kUInt8:
              a[i] = static_cast<unsigned char>(x);
              b[i] = static_cast<unsigned char>(y);
              break;
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

namespace {

// cuda::scale against the same multiplication on the host, for every floating dtype; integers are rejected.
TEST(CudaReduce, ScaleMatchesTheHostAndRejectsIntegers) {
  std::string why;
  if (hopwise::cuda::device_count(&why) == 0) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  const std::size_t n = 1000003;
  std::vector<float> x(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  const double f = 1.0 / 3.0;
  {
    std::vector<float> want(n), got(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = x[i] * static_cast<float>(f);
    void* d = hopwise::cuda::device_alloc(n * 4);
    hopwise::cuda::copy_to_device(d, x.data(), n * 4);
    hopwise::cuda::scale(hopwise::DataType::kFloat32, d, f, n);
    hopwise::cuda::copy_to_host(got.data(), d, n * 4);
    hopwise::cuda::device_free(d);
    EXPECT_EQ(got, want);
  }
  {
    std::vector<double> xd(x.begin(), x.end()), want(n), got(n);
    for (std::size_t i = 0; i < n; ++i) want[i] = xd[i] * f;
    void* d = hopwise::cuda::device_alloc(n * 8);
    hopwise::cuda::copy_to_device(d, xd.data(), n * 8);
    hopwise::cuda::scale(hopwise::DataType::kFloat64, d, f, n);
    hopwise::cuda::copy_to_host(got.data(), d, n * 8);
    hopwise::cuda::device_free(d);
    EXPECT_EQ(got, want);
  }
  for (bool bf16 : {false, true}) {
    std::vector<std::uint16_t> h(n), want(n), got(n);
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = bf16 ? hopwise::float_to_bf16(x[i]) : hopwise::float_to_fp16(x[i]);
      const float v = (bf16 ? hopwise::bf16_to_float(h[i]) : hopwise::fp16_to_float(h[i])) * static_cast<float>(f);
      want[i] = bf16 ? hopwise::float_to_bf16(v) : hopwise::float_to_fp16(v);
    }
    void* d = hopwise::cuda::device_alloc(n * 2);
    hopwise::cuda::copy_to_device(d, h.data(), n * 2);
    hopwise::cuda::scale(bf16 ? hopwise::DataType::kBFloat16 : hopwise::DataType::kFloat16, d, f, n);
    hopwise::cuda::copy_to_host(got.data(), d, n * 2);
    hopwise::cuda::device_free(d);
    EXPECT_EQ(got, want) << (bf16 ? "bfloat16" : "float16");
  }
  void* d = hopwise::cuda::device_alloc(16);
  EXPECT_THROW(hopwise::cuda::scale(hopwise::DataType::kInt32, d, f, 4), hopwise::InvalidArgument);
  hopwise::cuda::device_free(d);
}

}  // namespace
