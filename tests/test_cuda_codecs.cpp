// The CUDA codecs against the CPU codecs of the same spec, on fresh random data of awkward sizes, over several
// steps (error feedback and the per-step random streams): scales, payloads, decode, decode_add and the residual.
// Skips, with the reason, where no GPU is visible.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/device_codec.h"
#include "spec_test_name.h"

namespace {

namespace hc = hopwise::compression;
using hopwise::DeviceBuffer;

unsigned test_seed() {
  if (const char* s = std::getenv("HOPWISE_TEST_SEED")) return static_cast<unsigned>(std::stoul(s));
  return std::random_device{}();
}

bool have_gpu(std::string& why) { return hopwise::cuda::device_count(&why) > 0; }

template <class T>
DeviceBuffer to_device(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T) + 1);
  if (!v.empty()) hopwise::cuda::copy_to_device(b.data(), v.data(), v.size() * sizeof(T));
  return b;
}
template <class T>
std::vector<T> to_host(const DeviceBuffer& b, std::size_t count) {
  std::vector<T> v(count);
  if (count) hopwise::cuda::copy_to_host(v.data(), b.data(), count * sizeof(T));
  return v;
}

float header_of(const std::vector<std::byte>& p) {
  float f = 0;
  std::memcpy(&f, p.data(), sizeof f);
  return f;
}

// Codecs whose header is a sum in double (qsgd's norm, sign's mean |x|): the GPU adds in another order.
bool header_summed(const std::string& spec) { return spec.rfind("qsgd", 0) == 0 || spec.rfind("sign", 0) == 0; }

// Data: normal values, or small integers (many equal magnitudes: top-k's ties).
std::vector<float> make_data(std::mt19937& rng, std::size_t n, bool ties) {
  std::vector<float> x(n);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> small(-3, 3);
  for (auto& v : x) v = ties ? static_cast<float>(small(rng)) : normal(rng);
  return x;
}

class CudaCodec : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaCodec, MatchesTheCpuCodecOnAwkwardSizesOverSteps) {
  std::string why;
  if (!have_gpu(why)) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  const std::string spec = GetParam();
  const unsigned seed = test_seed();
  SCOPED_TRACE("spec " + spec + ", seed " + std::to_string(seed) + " (HOPWISE_TEST_SEED replays it)");
  std::mt19937 rng(seed);
  const auto cpu = hc::make_codec(spec);
  const hc::DeviceCodec gpu(spec);
  ASSERT_EQ(gpu.name(), cpu->name());

  for (int world : {1, 4}) {
    for (std::size_t n : {0ul, 1ul, 2ul, 7ul, 13ul, 255ul, 256ul, 257ul, 4099ul, 65537ul, 1000003ul, 4194319ul}) {
      for (bool ties : {false, true}) {
        if (ties && n > 70000) continue;
        SCOPED_TRACE("world " + std::to_string(world) + ", n " + std::to_string(n) + (ties ? ", ties" : ""));
        const int rank = world - 1;
        hc::CodecState cs(seed + n, rank, world);
        hc::DeviceCodecState gs(seed + n, rank, world);
        const std::size_t bytes = cpu->payload_bytes(n), scales_n = cpu->scale_count(n);
        for (int step = 0; step < 3; ++step) {
          SCOPED_TRACE("step " + std::to_string(step));
          const std::vector<float> x = make_data(rng, n, ties);
          // Step 1 reads the gradient 4 bytes past an allocation's start (a tensor inside a flat buffer): the
          // kernels' vector loads must not assume 16-byte alignment.
          const std::size_t shift = step == 1 ? 1 : 0;
          std::vector<float> shifted(shift, 0.0f);
          shifted.insert(shifted.end(), x.begin(), x.end());
          DeviceBuffer dx_owner = to_device(shifted);
          const float* dx_at = dx_owner.as<float>() + shift;

          // Scales: each rank's own here (the allreduce of them is the communicator's).
          std::vector<float> scales(scales_n);
          DeviceBuffer dscales(scales_n * sizeof(float) + 4);
          if (scales_n) {
            cpu->local_scales(x.data(), n, scales.data(), cs);
            gpu.local_scales(dx_at, n, dscales.as<float>(), gs, nullptr);
            ASSERT_EQ(to_host<float>(dscales, scales_n), scales);
          }

          const std::vector<float> before = cs.residual;  // equal to the device's (checked last step)
          std::vector<std::byte> payload(bytes);
          cpu->encode(x.data(), n, payload.data(), cs, scales.data());
          DeviceBuffer dpayload(bytes + 4);
          gpu.encode(dx_at, n, dpayload.as<std::byte>(), gs, dscales.as<float>(), nullptr);
          ASSERT_EQ(gs.host.step, cs.step);
          const auto gpayload = to_host<std::byte>(dpayload, bytes);

          bool same_payload = gpayload == payload;
          if (!same_payload && header_summed(spec) && bytes >= 4) {
            // Headers differ in the last bits only; with equal headers the rest must be equal too.
            const float a = header_of(payload), b = header_of(gpayload);
            ASSERT_NEAR(a, b, 1e-6 * std::fabs(a)) << "header";
            ASSERT_NE(std::memcmp(payload.data(), gpayload.data(), 4), 0) << "equal headers, different payloads";
            if (spec.rfind("qsgd", 0) == 0) {
              std::size_t differ = 0;
              for (std::size_t i = 4; i < bytes; ++i) {
                const int d = static_cast<int>(static_cast<std::int8_t>(payload[i])) -
                              static_cast<int>(static_cast<std::int8_t>(gpayload[i]));
                ASSERT_LE(std::abs(d), 1) << "level of element " << i - 4;
                differ += d != 0;
              }
              EXPECT_LE(differ, 1 + n / 1000) << "levels that differ";
            } else {
              ASSERT_EQ(0, std::memcmp(payload.data() + 4, gpayload.data() + 4, bytes - 4)) << "sign bits";
            }
          } else {
            ASSERT_TRUE(same_payload) << "payloads differ";
          }

          // decode and decode_add of the device payload, against the CPU's of the same bytes.
          std::vector<float> out(n), acc = make_data(rng, n, false);
          DeviceBuffer dout(n * sizeof(float) + 4), dacc = to_device(acc);
          cpu->decode(gpayload.data(), n, out.data(), cs, scales.data());
          cpu->decode_add(gpayload.data(), n, acc.data(), cs, scales.data());
          gpu.decode(dpayload.as<std::byte>(), n, dout.as<float>(), gs, dscales.as<float>(), nullptr);
          gpu.decode_add(dpayload.as<std::byte>(), n, dacc.as<float>(), gs, dscales.as<float>(), nullptr);
          ASSERT_EQ(to_host<float>(dout, n), out) << "decode";
          ASSERT_EQ(to_host<float>(dacc, n), acc) << "decode_add";

          // Error feedback: the residuals agree wherever the payloads did; elsewhere the device residual is its
          // own identity, residual = before + x - decode(payload), and the CPU state continues from it.
          const std::vector<float> residual = gpu.residual(gs, nullptr);
          ASSERT_EQ(residual.size(), cs.residual.size());
          if (same_payload) {
            ASSERT_EQ(residual, cs.residual) << "residual";
          } else if (!residual.empty()) {
            for (std::size_t i = 0; i < n; ++i) {
              const float expect = (before.empty() ? 0.0f : before[i]) + x[i] - out[i];
              ASSERT_NEAR(residual[i], expect, 1e-5f * (1.0f + std::fabs(expect))) << "residual " << i;
            }
            cs.residual = residual;
          }
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryCodec, CudaCodec,
                         ::testing::Values("none", "fp16", "bf16", "fp16:ef=1", "int8", "int8:round=stochastic",
                                           "int8:block=100,ef=1", "int8:block=7,round=stochastic", "int4",
                                           "int4:round=stochastic", "int4:block=7,ef=1",
                                           "int4:block=1,round=stochastic,ef=1", "fp8", "fp8:block=5,ef=1",
                                           "fp8:block=1", "qsgd", "qsgd:levels=4,ef=1", "terngrad", "terngrad:ef=1",
                                           "sign", "sign:ef=0", "topk", "topk:ratio=0.3,ef=0", "topk:ratio=1",
                                           "randomk", "randomk:ratio=0.5,ef=0"),
                         hwtest::SpecTestName());

TEST(CudaCodecErrors, BadBuffersNameTheProblem) {
  std::string why;
  if (!have_gpu(why)) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  const hc::DeviceCodec fp16("fp16");
  hc::DeviceCodecState st(1, 0, 1);
  std::vector<float> host(16, 1.0f);
  DeviceBuffer dx(64), dp(64);
  // A host pointer where device memory belongs.
  EXPECT_THROW(fp16.encode(host.data(), 16, dp.as<std::byte>(), st, nullptr, nullptr), hopwise::InvalidArgument);
  // A misaligned payload.
  EXPECT_THROW(fp16.encode(dx.as<float>(), 4, dp.as<std::byte>() + 1, st, nullptr, nullptr), hopwise::InvalidArgument);
  // Null buffers with elements.
  EXPECT_THROW(fp16.encode(nullptr, 4, dp.as<std::byte>(), st, nullptr, nullptr), hopwise::InvalidArgument);
  // int8 without its agreed scales.
  const hc::DeviceCodec int8("int8");
  EXPECT_THROW(int8.encode(dx.as<float>(), 4, dp.as<std::byte>(), st, nullptr, nullptr), hopwise::InvalidArgument);
  EXPECT_EQ(st.host.step, 0u) << "rejected calls are not steps";
  // An unknown codec, as on the CPU.
  EXPECT_THROW(hc::DeviceCodec("zip"), hopwise::InvalidArgument);
}

TEST(CudaCodecErrors, TopkRejectsACorruptPayloadAndAResidualOfAnotherSize) {
  std::string why;
  if (!have_gpu(why)) GTEST_SKIP() << "needs a CUDA GPU: " << why;
  const hc::DeviceCodec topk("topk:ratio=0.5");
  hc::DeviceCodecState st(1, 0, 1);
  const std::vector<float> x = {1, -5, 3, 2};
  DeviceBuffer dx = to_device(x), dp(64), dout(64);
  topk.encode(dx.as<float>(), 4, dp.as<std::byte>(), st, nullptr, nullptr);
  auto p = to_host<std::uint32_t>(dp, 4);  // indices then values, k = 2
  EXPECT_EQ(p[0], 1u);
  EXPECT_EQ(p[1], 2u);
  p[1] = 99;  // out of range for 4 elements
  hopwise::cuda::copy_to_device(dp.data(), p.data(), p.size() * 4);
  EXPECT_THROW(topk.decode(dp.as<std::byte>(), 4, dout.as<float>(), st, nullptr, nullptr), hopwise::InvalidArgument);
  // ef=1 keeps a residual of 4 elements: a tensor of 3 is another tensor.
  EXPECT_THROW(topk.encode(dx.as<float>(), 3, dp.as<std::byte>(), st, nullptr, nullptr), hopwise::InvalidArgument);
}

}  // namespace
