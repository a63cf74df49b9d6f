// DevicePowerSgd against the CPU PowerSgd on the same data: P, Q, the output and the residual, step by step, over
// 1 and 3 simulated ranks (the allreduce-sums done on the host). Every case skips where no GPU is visible.
//
// Tolerance: relative L2 difference <= 1e-4. Not exact: cuBLAS sums the products in another order than the CPU
// loops (and with FMA), so P differs by float rounding (~1e-6 relative at these sizes); Gram-Schmidt, the warm
// start and error feedback carry that on over the steps, amplified at most by P's conditioning. The output and
// the residual are measured against the norm of this step's M, as they can be (near) zero where r' = rows or
// r' = cols (the projection keeps everything), and then both sides hold only rounding noise.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/device_powersgd.h"
#include "hopwise/compression/powersgd.h"

namespace {

namespace hc = hopwise::compression;
using hopwise::DeviceBuffer;

#define HOPWISE_NEEDS_GPU()                                                                  \
  do {                                                                                       \
    std::string why;                                                                         \
    if (hopwise::cuda::device_count(&why) == 0) GTEST_SKIP() << "needs a CUDA GPU: " << why; \
  } while (0)

constexpr double kTol = 1e-4;
constexpr std::uint64_t kSeed = 20240611;  // data seed; each case prints the seeds it derives

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

DeviceBuffer upload(const std::vector<float>& v) {
  DeviceBuffer b(v.size() * sizeof(float));
  if (!v.empty()) hopwise::cuda::copy_to_device(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

std::vector<float> download(const DeviceBuffer& b, std::size_t n) {
  std::vector<float> v(n);
  if (n > 0) hopwise::cuda::copy_to_host(v.data(), b.data(), n * sizeof(float));
  return v;
}

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

// ||got - want|| <= kTol * max(||want||, floor).
void expect_close(const std::vector<float>& got, const std::vector<float>& want, double floor,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double d = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double e = static_cast<double>(got[i]) - want[i];
    d += e * e;
  }
  d = std::sqrt(d);
  const double scale = std::max(norm2(want), floor);
  EXPECT_LE(d, kTol * scale) << what << ": relative L2 difference " << (scale > 0 ? d / scale : d) << " (|want| "
                             << norm2(want) << ", floor " << floor << ")";
}

std::vector<float> sum_of(const std::vector<std::vector<float>>& parts) {
  std::vector<float> s(parts.at(0).size(), 0.0f);
  for (const auto& p : parts)
    for (std::size_t i = 0; i < s.size(); ++i) s[i] += p[i];
  return s;
}

struct Shape {
  std::size_t rows, cols;
};
const std::vector<Shape> kShapes = {{1, 7},   {7, 1},  {10, 10}, {0, 5},      {33, 17},
                                    {64, 48}, {5, 97}, {128, 3}, {1024, 4096}};

// (rank, ef, simulated ranks)
class DevicePowerSgdMatchesCpu : public ::testing::TestWithParam<std::tuple<int, bool, int>> {};

TEST_P(DevicePowerSgdMatchesCpu, StepByStep) {
  HOPWISE_NEEDS_GPU();
  const auto [rank, ef, world] = GetParam();
  const hc::PowerSgd cpu(rank, ef);
  const hc::DevicePowerSgd dev(cpu);
  const std::size_t steps = 3;
  for (std::size_t si = 0; si < kShapes.size(); ++si) {
    const std::size_t rows = kShapes[si].rows, cols = kShapes[si].cols, n = rows * cols;
    const std::size_t np = cpu.p_count(rows, cols), nq = cpu.q_count(rows, cols);
    const std::uint64_t state_seed = kSeed + 1000 * si;
    SCOPED_TRACE(cpu.name() + " " + std::to_string(rows) + " x " + std::to_string(cols) + ", " + std::to_string(world) +
                 " ranks, state seed " + std::to_string(state_seed));
    std::vector<hc::PowerSgdState> cs;
    std::vector<hc::DevicePowerSgdState> ds;
    for (int w = 0; w < world; ++w) {
      cs.emplace_back(state_seed);
      ds.emplace_back(state_seed);
    }
    std::vector<DeviceBuffer> dg(world), dp(world), dq(world), dout(world);
    for (int w = 0; w < world; ++w) {
      dp[w].reserve(np * sizeof(float));
      dq[w].reserve(nq * sizeof(float));
      dout[w].reserve(n * sizeof(float));
    }
    DeviceBuffer dpsum(np * sizeof(float)), dqsum(nq * sizeof(float));
    std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
    double scale = 0;
    std::vector<double> prev_res(world, 0.0);  // |residual| of each rank after the last step (ef=1)
    for (std::size_t t = 0; t < steps; ++t) {
      const std::string at = "step " + std::to_string(t);
      std::vector<std::vector<float>> g(world), cp(world), cq(world), gp(world), gq(world);
      std::vector<double> mnorm(world);  // a bound on |M| of each rank: its gradient plus what feedback carried
      double mnorm_sum = 0;
      for (int w = 0; w < world; ++w) {
        const std::uint64_t data_seed = kSeed + 7919 * (si * 100 + t * 10 + static_cast<std::uint64_t>(w)) + rank;
        g[w] = gaussian(n, data_seed);
        mnorm[w] = norm2(g[w]) + prev_res[w];
        mnorm_sum += mnorm[w];
        dg[w] = upload(g[w]);  // stays unchanged until compute_q (ef=0 reads it in place)
        cp[w].resize(np);
        cpu.compute_p(g[w].data(), rows, cols, cp[w].data(), cs[w]);
        dev.compute_p(dg[w].as<float>(), rows, cols, dp[w].as<float>(), ds[w], nullptr);
        gp[w] = download(dp[w], np);
        // Floor: |M| |Q| / sqrt(cols), the size of P for random data, as a few entries of a small P can cancel.
        const double pfloor = cols > 0 ? mnorm[w] * norm2(cs[w].q) / std::sqrt(static_cast<double>(cols)) : 0;
        expect_close(gp[w], cp[w], pfloor,
                     at + " P of rank " + std::to_string(w) + " (data seed " + std::to_string(data_seed) + ")");
        for (std::size_t i = 0; i < n; ++i) sum_in[i] += g[w][i];
      }
      const auto cpsum = sum_of(cp), gpsum = sum_of(gp);
      if (np > 0) hopwise::cuda::copy_to_device(dpsum.data(), gpsum.data(), np * sizeof(float));
      for (int w = 0; w < world; ++w) {
        cq[w].resize(nq);
        cpu.compute_q(cpsum.data(), rows, cols, cq[w].data(), cs[w]);
        dev.compute_q(dpsum.as<float>(), rows, cols, dq[w].as<float>(), ds[w], nullptr);
        gq[w] = download(dq[w], nq);
        expect_close(gq[w], cq[w], mnorm[w], at + " Q of rank " + std::to_string(w));
      }
      const auto cqsum = sum_of(cq), gqsum = sum_of(gq);
      if (nq > 0) hopwise::cuda::copy_to_device(dqsum.data(), gqsum.data(), nq * sizeof(float));
      std::vector<float> cpu_out(n), gout0;
      for (int w = 0; w < world; ++w) {
        std::vector<float> co(n);
        cpu.decompress(cqsum.data(), rows, cols, w == 0 ? cpu_out.data() : co.data(), cs[w]);
        dev.decompress(dqsum.as<float>(), rows, cols, dout[w].as<float>(), ds[w], nullptr);
        const auto go = download(dout[w], n);
        if (w == 0) {
          gout0 = go;
          expect_close(go, cpu_out, mnorm_sum, at + " output");
        } else {
          EXPECT_EQ(go, gout0) << at << ": ranks decompressed different results on the device";
        }
      }
      for (std::size_t i = 0; i < n; ++i) {
        sum_out[i] += gout0[i];
        scale = std::max(scale, static_cast<double>(std::fabs(gout0[i])));
      }
      for (int w = 0; w < world; ++w) {
        const auto cr = cpu.residual(cs[w]), gr = dev.residual(ds[w], nullptr);
        ASSERT_EQ(gr.size(), cr.size()) << at << " residual of rank " << w;
        expect_close(gr, cr, mnorm[w], at + " residual of rank " + std::to_string(w));
        for (float x : gr) scale = std::max(scale, static_cast<double>(std::fabs(x)));
        prev_res[w] = norm2(cr);
      }
      EXPECT_EQ(ds[0].step, t + 1);
      if (::testing::Test::HasFailure()) return;  // one broken step is enough to read
    }
    // Error feedback conserves on the device: sum(outputs) + sum(residuals) == sum(inputs).
    if (ef && n > 0) {
      std::vector<double> res(n, 0.0);
      for (int w = 0; w < world; ++w) {
        const auto r = dev.residual(ds[w], nullptr);
        for (std::size_t i = 0; i < n; ++i) res[i] += r[i];
      }
      for (std::size_t i = 0; i < n; ++i)
        ASSERT_NEAR(sum_out[i] + res[i], sum_in[i], 1e-5 * steps * world * std::max(scale, 1.0)) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, DevicePowerSgdMatchesCpu,
                         ::testing::Combine(::testing::Values(1, 4), ::testing::Bool(), ::testing::Values(1, 3)),
                         [](const auto& info) {
                           return "rank" + std::to_string(std::get<0>(info.param)) + "_ef" +
                                  std::to_string(std::get<1>(info.param) ? 1 : 0) + "_world" +
                                  std::to_string(std::get<2>(info.param));
                         });

// The first P of a fresh state is M Q0 with Q0 the CPU's draw from the seed: a matrix whose rows are unit vectors
// e_c reads Q0's columns back, so Q0 itself is compared (tightly: each entry of P is one product with 1).
TEST(DevicePowerSgd, InitialQIsTheCpuDraw) {
  HOPWISE_NEEDS_GPU();
  const std::size_t rows = 40, cols = 40;
  const hc::PowerSgd cpu(4, false);
  const hc::DevicePowerSgd dev(cpu);
  std::vector<float> eye(rows * cols, 0.0f);
  for (std::size_t i = 0; i < rows; ++i) eye[i * cols + i] = 1.0f;
  hc::PowerSgdState cs(99);
  hc::DevicePowerSgdState ds(99);
  std::vector<float> cp(cpu.p_count(rows, cols));
  cpu.compute_p(eye.data(), rows, cols, cp.data(), cs);
  const auto dg = upload(eye);
  DeviceBuffer dp(cp.size() * sizeof(float));
  dev.compute_p(dg.as<float>(), rows, cols, dp.as<float>(), ds, nullptr);
  EXPECT_EQ(download(dp, cp.size()), cp);
  EXPECT_EQ(download(ds.q, ds.q_count), cs.q);
}

TEST(DevicePowerSgd, CallOrderAndShapeAreChecked) {
  HOPWISE_NEEDS_GPU();
  const auto dev = hc::DevicePowerSgd::from_spec("powersgd:rank=2");
  EXPECT_EQ(dev.host().name(), "powersgd:ef=1,rank=2");
  const std::size_t rows = 8, cols = 6;
  const auto g = upload(gaussian(rows * cols, kSeed));
  DeviceBuffer p(rows * 2 * sizeof(float)), q(cols * 2 * sizeof(float)), out(rows * cols * sizeof(float));
  hc::DevicePowerSgdState st(3);
  EXPECT_THROW(dev.compute_q(p.as<float>(), rows, cols, q.as<float>(), st, nullptr), hopwise::InvalidArgument);
  EXPECT_THROW(dev.decompress(q.as<float>(), rows, cols, out.as<float>(), st, nullptr), hopwise::InvalidArgument);
  EXPECT_THROW(dev.compute_p(nullptr, rows, cols, p.as<float>(), st, nullptr), hopwise::InvalidArgument);
  dev.compute_p(g.as<float>(), rows, cols, p.as<float>(), st, nullptr);
  EXPECT_THROW(dev.compute_p(g.as<float>(), rows, cols, p.as<float>(), st, nullptr), hopwise::InvalidArgument);
  EXPECT_THROW(dev.decompress(q.as<float>(), rows, cols, out.as<float>(), st, nullptr), hopwise::InvalidArgument);
  EXPECT_THROW(dev.compute_q(p.as<float>(), rows, cols + 1, q.as<float>(), st, nullptr), hopwise::InvalidArgument);
  dev.compute_q(p.as<float>(), rows, cols, q.as<float>(), st, nullptr);
  EXPECT_THROW(dev.compute_q(p.as<float>(), rows, cols, q.as<float>(), st, nullptr), hopwise::InvalidArgument);
  dev.decompress(q.as<float>(), rows, cols, out.as<float>(), st, nullptr);
  EXPECT_EQ(st.step, 1u);
  // A state keeps its tensor's shape.
  EXPECT_THROW(dev.compute_p(g.as<float>(), cols, rows, p.as<float>(), st, nullptr), hopwise::InvalidArgument);
  EXPECT_TRUE(dev.residual(st, nullptr).size() == rows * cols);
  EXPECT_THROW(hc::DevicePowerSgd::from_spec("powersgd:rank=0"), hopwise::InvalidArgument);
  EXPECT_THROW(hc::DevicePowerSgd::from_spec("topk"), hopwise::InvalidArgument);
}

}  // namespace
