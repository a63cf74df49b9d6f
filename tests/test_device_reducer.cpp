// DeviceGradientReducer on one GPU per rank (mpirun -np N; -np 1 on a one-GPU machine): parameters of awkward
// sizes whose gradients a "backward" writes on its own compute stream (async copies from pinned host memory,
// parameter by parameter in reverse order, each followed by mark_ready on that stream), several steps with new
// values each step, finish() on the compute stream, and the result compared with the average over ranks that every
// rank computes locally (each rank regenerates every rank's gradients from a shared seed). Values are multiples of
// 1/64 in [-16, 16]: exact in float32 and float16, so with one rank the result must be exact.
// Without a visible GPU the program prints "[  SKIPPED ] needs a CUDA GPU: <why>" and exits 77.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "collective_reference.h"
#include "hopwise/comm/device_communicator.h"
#include "hopwise/common/cuda_reduce.h"
#include "hopwise/common/device_buffer.h"
#include "hopwise/common/error.h"
#include "hopwise/training/device_reducer.h"
#include "nccl_test_main.h"

namespace {

using namespace hwtest;
namespace hc = hopwise::comm;
using hopwise::DeviceBuffer;

// Pinned host memory, so that cudaMemcpyAsync really is asynchronous (the reducer must wait for it).
struct Pinned {
  float* p = nullptr;
  explicit Pinned(std::size_t n) {
    cuda_ok(cudaMallocHost(&p, std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMallocHost");
  }
  ~Pinned() { cudaFreeHost(p); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
};

// Rank r's gradient of parameter i at step s.
std::vector<float> grad_values(int rank, int step, std::size_t i, std::size_t count) {
  Rng rng(mix_seed(g_seed, {static_cast<std::uint64_t>(rank), static_cast<std::uint64_t>(step), i, 0x9a}));
  std::vector<float> v(count);
  for (float& x : v) x = static_cast<float>(static_cast<int>(rng() % 2049) - 1024) / 64.0f;
  return v;
}

// A model: parameters of awkward sizes (one empty), forward order.
struct Model {
  std::vector<std::size_t> sizes{1, 7, 1000, 65537, 0, 3, 250000, 13, 1u << 20, 2, 4099};
  std::vector<std::string> names;
  std::vector<DeviceBuffer> grads;
  std::vector<std::unique_ptr<Pinned>> host;  // this step's uploads
  Model() {
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      names.push_back(fmt::format("layer{}.{}", i, i % 2 ? "bias" : "weight"));
      grads.emplace_back(std::max<std::size_t>(sizes[i], 1) * sizeof(float));
      host.push_back(std::make_unique<Pinned>(sizes[i]));
    }
  }
  float* grad(std::size_t i) { return sizes[i] ? grads[i].as<float>() : nullptr; }
  void register_all(hc::DeviceGradientReducer& red) {
    for (std::size_t i = 0; i < sizes.size(); ++i)
      EXPECT_EQ(red.add_parameter(names[i], grad(i), sizes[i]), static_cast<int>(i));
  }
  // "Backward" of one parameter: its gradient written on `s`.
  void produce(std::size_t i, int step, cudaStream_t s) {
    const std::vector<float> v = grad_values(comm().rank(), step, i, sizes[i]);
    if (v.empty()) return;
    std::memcpy(host[i]->p, v.data(), v.size() * sizeof(float));
    cuda_ok(cudaMemcpyAsync(grad(i), host[i]->p, v.size() * sizeof(float), cudaMemcpyHostToDevice, s), "H2D");
  }
  // The gradients (after finish on `s`) against the average over ranks; "" when all match.
  std::string check(int step, cudaStream_t s, double rel_tol) {
    std::vector<std::vector<float>> got(sizes.size());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      got[i].resize(sizes[i]);
      if (sizes[i])
        cuda_ok(cudaMemcpyAsync(got[i].data(), grad(i), sizes[i] * sizeof(float), cudaMemcpyDeviceToHost, s), "D2H");
    }
    cuda_ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    const int n = comm().size();
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::vector<double> sum(sizes[i], 0.0), mag(sizes[i], 0.0);
      for (int r = 0; r < n; ++r) {
        const std::vector<float> v = grad_values(r, step, i, sizes[i]);
        for (std::size_t k = 0; k < v.size(); ++k) {
          sum[k] += v[k];
          mag[k] += std::fabs(v[k]);
        }
      }
      for (std::size_t k = 0; k < sizes[i]; ++k) {
        const double want = sum[k] / n, tol = n == 1 ? 0.0 : rel_tol * mag[k];
        if (!(std::fabs(got[i][k] - want) <= tol))
          return fmt::format("step {}: gradient '{}' element {} of {}: got {}, expected {} (+- {})", step, names[i], k,
                             sizes[i], got[i][k], want, tol);
      }
    }
    return {};
  }
};

hc::ReducerOptions small_buckets() {
  hc::ReducerOptions o;
  o.bucket_mb = 1;
  o.first_bucket_mb = 0.25;
  o.compression = "none";
  return o;
}

// Steps of backward: each parameter produced and marked on the compute stream, in reverse registration order
// (as backward runs) or, with `forward`, in registration order.
void run_steps(hc::DeviceGradientReducer& red, Model& m, int first_step, int steps, double rel_tol,
               bool forward = false) {
  Stream compute;
  const std::size_t count = m.sizes.size();
  for (int step = first_step; step < first_step + steps; ++step) {
    SCOPED_TRACE(fmt::format("step {}", step));
    for (std::size_t k = 0; k < count; ++k) {
      const std::size_t i = forward ? k : count - 1 - k;
      m.produce(i, step, compute.s);
      if (i % 3 == 0)
        red.mark_ready(m.names[i], compute.s);
      else
        red.mark_ready(static_cast<int>(i), compute.s);
    }
    const bool sync = step % 2 == 1;
    const int buckets = static_cast<int>(red.bucket_count());  // the step's (a rebuild in finish() may change them)
    const hopwise::comm::StepStats s = red.finish(compute.s, sync);
    EXPECT_EQ(s.buckets, buckets);
    EXPECT_GT(s.bytes, 0u);
    if (sync) {
      EXPECT_GE(s.comm_ms, 0.0);
      EXPECT_GE(s.overlap_pct, 0.0);
      EXPECT_LE(s.overlap_pct, 100.0);
    }
    EXPECT_EQ(m.check(step, compute.s, rel_tol), "");
  }
}

TEST(DeviceReducer, AveragesOverSeveralStepsInSmallBuckets) {
  Model m;
  hc::DeviceGradientReducer red(comm(), small_buckets());
  m.register_all(red);
  red.finalize();
  EXPECT_GE(red.bucket_count(), 3u);
  // Buckets in reverse registration order: the last parameter leads the first bucket.
  ASSERT_FALSE(red.bucket_names().empty());
  EXPECT_EQ(red.bucket_names()[0][0], m.names.back());
  std::size_t listed = 0;
  for (const auto& b : red.bucket_names()) listed += b.size();
  EXPECT_EQ(listed, m.sizes.size());
  run_steps(red, m, 0, 4, 1e-6);
}

// Gradients that arrive in another order than the reverse of registration: after the first step the buckets
// follow the observed order (rank 0's), and the averages stay right.
TEST(DeviceReducer, RebuildsBucketsFromTheObservedOrder) {
  Model m;
  hc::DeviceGradientReducer red(comm(), small_buckets());
  m.register_all(red);
  red.finalize();
  ASSERT_EQ(red.bucket_names()[0][0], m.names.back());
  run_steps(red, m, 40, 1, 1e-6, /*forward=*/true);
  ASSERT_FALSE(red.bucket_names().empty());
  EXPECT_EQ(red.bucket_names()[0][0], m.names.front()) << "the first gradient ready leads the first bucket";
  std::size_t listed = 0;
  for (const auto& b : red.bucket_names()) listed += b.size();
  EXPECT_EQ(listed, m.sizes.size());
  run_steps(red, m, 41, 3, 1e-6, /*forward=*/true);
}

TEST(DeviceReducer, DefaultBucketsAndNoOverlap) {
  Model m;
  hc::ReducerOptions o = small_buckets();
  o.bucket_mb = 25;
  o.first_bucket_mb = 1;
  o.overlap = false;  // every bucket launched in finish()
  hc::DeviceGradientReducer red(comm(), o);
  m.register_all(red);
  red.finalize();
  run_steps(red, m, 10, 2, 1e-6);
}

TEST(DeviceReducer, Fp16CompressionIsExactOnTheseValues) {
  Model m;
  hc::ReducerOptions o = small_buckets();
  o.compression = "fp16";
  hc::DeviceGradientReducer red(comm(), o);
  m.register_all(red);
  red.finalize();
  run_steps(red, m, 20, 2, comm().size() * std::ldexp(1.0, -10));
}

TEST(DeviceReducer, ErrorsNameTheGradient) {
  Model m;
  using hopwise::InvalidArgument;
  {
    hc::ReducerOptions o = small_buckets();
    o.compression = "powersgd:rank=2";
    EXPECT_THROW(hc::DeviceGradientReducer(comm(), o), InvalidArgument);
  }
  hc::DeviceGradientReducer red(comm(), small_buckets());
  std::vector<float> host(16);
  EXPECT_NE(message_of([&] { red.add_parameter("host.grad", host.data(), host.size()); }).find("host memory"),
            std::string::npos);
  EXPECT_THROW(red.add_parameter("null.grad", nullptr, 4), InvalidArgument);
  m.register_all(red);
  EXPECT_THROW(red.add_parameter(m.names[0], m.grad(0), m.sizes[0]), InvalidArgument) << "duplicate name";
  EXPECT_THROW(red.mark_ready(0, nullptr), InvalidArgument) << "before finalize";
  red.finalize();
  EXPECT_THROW(red.add_parameter("late", m.grad(0), 1), InvalidArgument) << "after finalize";
  EXPECT_THROW(red.mark_ready(static_cast<int>(m.sizes.size()), nullptr), InvalidArgument);
  EXPECT_THROW(red.mark_ready(-1, nullptr), InvalidArgument);
  EXPECT_THROW(red.mark_ready(std::string_view("no.such.layer"), nullptr), InvalidArgument);

  Stream compute;
  const int step = 30;
  const std::size_t last = m.sizes.size() - 1;
  m.produce(last, step, compute.s);
  red.mark_ready(static_cast<int>(last), compute.s);
  const std::string twice = message_of([&] { red.mark_ready(static_cast<int>(last), compute.s); });
  EXPECT_NE(twice.find("'" + m.names[last] + "' was marked ready twice"), std::string::npos) << twice;
  // Missing marks: finish names them (and not the one that was marked).
  const std::string missing = message_of([&] { red.finish(compute.s); });
  EXPECT_NE(missing.find(m.names[0]), std::string::npos) << missing;
  EXPECT_NE(missing.find(m.names[3]), std::string::npos) << missing;
  EXPECT_EQ(missing.find(m.names[last]), std::string::npos) << missing;
  // The step goes on: mark the rest, finish, the averages are right.
  for (std::size_t i = last; i-- > 0;) {
    m.produce(i, step, compute.s);
    red.mark_ready(static_cast<int>(i), compute.s);
  }
  red.finish(compute.s, true);
  EXPECT_EQ(m.check(step, compute.s, 1e-6), "");
  // And the next one.
  run_steps(red, m, step + 1, 1, 1e-6);
}

TEST(DeviceReducer, LayoutMismatchNamesTheRanks) {
  if (comm().size() < 2) GTEST_SKIP() << "needs two ranks";
  Model m;
  hc::DeviceGradientReducer red(comm(), small_buckets());
  // Rank 1 registers one parameter shorter.
  for (std::size_t i = 0; i < m.sizes.size(); ++i)
    red.add_parameter(m.names[i], m.grad(i), comm().rank() == 1 && i == 2 ? m.sizes[i] - 1 : m.sizes[i]);
  const std::string msg = message_of([&] { red.finalize(); });
  EXPECT_NE(msg.find("differs from rank 0's on rank(s) 1"), std::string::npos) << msg;
}
}  // namespace

int main(int argc, char** argv) { return hwtest::run_nccl_tests(argc, argv); }
