// Compressed allreduce over in-process ranks (1..16) for every codec, against a reference that runs the same
// codec serially: agreed scales (max over ranks), each rank's encode, then the sum of the decoded payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "inproc_group.h"
#include "powersgd_reference.h"
#include "spec_test_name.h"

namespace {

using hwtest::Group;
using hwtest::test_options;
namespace hc = hopwise::comm;
namespace cz = hopwise::compression;

std::vector<float> input(std::uint64_t seed, int rank, std::size_t n) {
  std::mt19937_64 g(seed * 31 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// The serial reference: what p ranks' payloads decode to, summed in rank order.
std::vector<float> reference(const cz::Codec& c, std::uint64_t seed, int p, std::size_t n, int steps) {
  std::vector<cz::CodecState> st;
  for (int r = 0; r < p; ++r) st.emplace_back(seed, r, p);
  std::vector<float> out(n);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < p; ++r) x.push_back(input(seed + static_cast<std::uint64_t>(step), r, n));
    std::vector<float> scales(c.scale_count(n), 0.0f), local(scales.size());
    for (int r = 0; r < p; ++r) {
      c.local_scales(x[static_cast<std::size_t>(r)].data(), n, local.data(), st[static_cast<std::size_t>(r)]);
      for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = std::max(scales[i], local[i]);
    }
    std::fill(out.begin(), out.end(), 0.0f);
    std::vector<std::byte> payload(c.payload_bytes(n));
    for (int r = 0; r < p; ++r) {
      c.encode(x[static_cast<std::size_t>(r)].data(), n, payload.data(), st[static_cast<std::size_t>(r)],
               scales.empty() ? nullptr : scales.data());
      c.decode_add(payload.data(), n, out.data(), st[static_cast<std::size_t>(r)],
                   scales.empty() ? nullptr : scales.data());
    }
  }
  return out;
}

// Aggregatable payloads are summed in their own dtype (fp16/bf16 round at every addition); the reference sums
// decoded floats. Allow p roundings of the payload type on values of a few units.
double tolerance(const std::string& name, int p) {
  if (name.rfind("fp16", 0) == 0) return 8.0 * p * std::ldexp(1.0, -11) * p;
  if (name.rfind("bf16", 0) == 0) return 8.0 * p * std::ldexp(1.0, -8) * p;
  return 1e-4 * p;
}

class Compressed : public ::testing::TestWithParam<const char*> {};

TEST_P(Compressed, MatchesSerialCodecReference) {
  const auto codec = cz::make_codec(GetParam());
  const std::uint64_t seed = std::random_device{}();
  for (int p : {1, 2, 3, 4, 7, 16}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
      SCOPED_TRACE(::testing::Message() << codec->name() << ", " << p << " ranks, n=" << n << ", seed " << seed);
      const int steps = 2;  // the second step exercises error feedback's residual and the step counter
      const auto ref = reference(*codec, seed, p, n, steps);
      Group g(p, test_options());
      std::vector<std::vector<float>> outs(static_cast<std::size_t>(p));
      const std::string err = g.run([&](int r, hc::Communicator& c) {
        cz::CodecState st(seed, r, p);
        auto& out = outs[static_cast<std::size_t>(r)];
        out.assign(n, 0.0f);
        for (int step = 0; step < steps; ++step) {
          const auto x = input(seed + static_cast<std::uint64_t>(step), r, n);
          c.allreduce_compressed(x.data(), out.data(), n, *codec, st);
        }
      });
      ASSERT_EQ(err, "");
      const double tol = tolerance(codec->name(), p);
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_NEAR(outs[static_cast<std::size_t>(r)][i], ref[i], tol) << "rank " << r << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, Compressed,
                         ::testing::Values("none", "fp16", "bf16", "int8", "int8:round=stochastic", "int4",
                                           "int4:round=stochastic,ef=1,block=7", "fp8", "fp8:ef=1,block=5", "qsgd",
                                           "terngrad", "sign", "topk:ratio=0.05", "randomk:ratio=0.1"),
                         hwtest::SpecTestName());

TEST(CompressedAllreduce, CountsWireBytesAndAverages) {
  Group g(2, test_options());
  const auto codec = cz::make_codec("fp16");
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    cz::CodecState st(1, r, 2);
    std::vector<float> x(1000, r == 0 ? 1.0f : 3.0f), out(1000);
    c.allreduce_compressed(x.data(), out.data(), x.size(), *codec, st, hopwise::ReduceOp::kAvg);
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(c.stats().wire_bytes, 2000u);
    EXPECT_THROW(c.allreduce_compressed(x.data(), out.data(), x.size(), *codec, st, hopwise::ReduceOp::kMax),
                 hopwise::InvalidArgument);
  });
  EXPECT_EQ(err, "");
}

}  // namespace

// ---- PowerSGD over the communicator: several matrices of awkward shapes per call, against a serial run ----
namespace {

struct Shape {
  std::size_t rows, cols;
};
// 1-D, too small to compress, empty, tall and wide, and ones that compress.
const std::vector<Shape> kShapes = {{1, 7}, {7, 1}, {10, 10}, {0, 5}, {33, 17}, {64, 48}, {5, 97}, {128, 3}};

// What p ranks' steps sum to, serially: plain sums for what is not compressed this step, else the PowerSGD math
// with P and Q summed in rank order.
std::vector<std::vector<float>> powersgd_reference(const cz::PowerSgd& ps, std::uint64_t seed, int p, int steps) {
  std::vector<std::vector<cz::PowerSgdState>> st(kShapes.size());
  for (std::size_t k = 0; k < kShapes.size(); ++k)
    for (int r = 0; r < p; ++r) st[k].emplace_back(900 + k);
  std::vector<std::vector<float>> out(kShapes.size());
  for (int step = 0; step < steps; ++step)
    for (std::size_t k = 0; k < kShapes.size(); ++k) {
      const auto [rows, cols] = kShapes[k];
      const std::size_t n = rows * cols;
      std::vector<std::vector<float>> x;
      for (int r = 0; r < p; ++r) x.push_back(input(seed + 97 * static_cast<std::uint64_t>(step) + k, r, n));
      out[k].assign(n, 0.0f);
      if (!ps.compressed_step(rows, cols, st[k][0])) {
        for (int r = 0; r < p; ++r) {
          for (std::size_t i = 0; i < n; ++i) out[k][i] += x[static_cast<std::size_t>(r)][i];
          if (ps.compresses(rows, cols)) ps.skip(st[k][static_cast<std::size_t>(r)]);
        }
        continue;
      }
      out[k] = hwtest::powersgd_step(ps, x, rows, cols, st[k]);
    }
  return out;
}

}  // namespace

class PowerSgdAllreduce : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

TEST_P(PowerSgdAllreduce, MatchesTheSerialRunStepByStep) {
  const auto [p, spec] = GetParam();
  const cz::PowerSgd ps = cz::PowerSgd::from_spec(spec);
  const std::uint64_t seed = 4242;
  const int steps = 3;
  Group g(p, test_options());
  std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(p));
  std::vector<std::uint64_t> wire(static_cast<std::size_t>(p));
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    std::vector<cz::PowerSgdState> st;
    for (std::size_t k = 0; k < kShapes.size(); ++k) st.emplace_back(900 + k);
    std::vector<std::vector<float>> bufs(kShapes.size());
    for (int step = 0; step < steps; ++step) {
      std::vector<hc::PowerSgdTensor> ts;
      for (std::size_t k = 0; k < kShapes.size(); ++k) {
        bufs[k] = input(seed + 97 * static_cast<std::uint64_t>(step) + k, r, kShapes[k].rows * kShapes[k].cols);
        ts.push_back({bufs[k].data(), bufs[k].data(), kShapes[k].rows, kShapes[k].cols, &st[k]});
      }
      // Alternate sync and async, so both paths run.
      if (step % 2)
        comm.allreduce_powersgd(ts, ps);
      else
        comm.allreduce_powersgd_async(ts, ps).wait();
    }
    got[static_cast<std::size_t>(r)] = bufs;
    wire[static_cast<std::size_t>(r)] = comm.stats().wire_bytes;
  });
  ASSERT_EQ(err, "");
  const auto ref = powersgd_reference(ps, seed, p, steps);
  for (std::size_t k = 0; k < kShapes.size(); ++k) {
    SCOPED_TRACE(::testing::Message() << kShapes[k].rows << "x" << kShapes[k].cols);
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(got[static_cast<std::size_t>(r)][k], got[0][k]) << "ranks disagree";
      EXPECT_LT(hwtest::relative_l2(got[static_cast<std::size_t>(r)][k], ref[k]), 1e-4);
    }
  }
  // The compressed matrices travel as their factors: fewer bytes than the floats themselves; all warm-up steps
  // send exactly the floats.
  std::size_t floats = 0;
  for (const auto& s : kShapes) floats += s.rows * s.cols;
  if (ps.warmup() < static_cast<std::uint64_t>(steps)) {
    EXPECT_LT(wire[0], steps * floats * sizeof(float));
  } else {
    EXPECT_EQ(wire[0], steps * floats * sizeof(float));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, PowerSgdAllreduce,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 16),
                                            ::testing::Values("powersgd:rank=4", "powersgd:rank=2,ef=0,warmup=1",
                                                              "powersgd:rank=8,warmup=5")));

TEST(PowerSgdAllreduceErrors, AreNamed) {
  Group g(2, test_options());
  const cz::PowerSgd ps = cz::PowerSgd::from_spec("powersgd");
  std::vector<float> a(12);
  const std::vector<hc::PowerSgdTensor> no_state = {{a.data(), a.data(), 3, 4, nullptr}};
  try {
    g.comm(0).allreduce_powersgd_async(no_state, ps);
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("matrix 0 (3 x 4) on rank 0 has no state"), std::string::npos) << e.what();
  }
  cz::PowerSgdState st(1);
  const std::vector<hc::PowerSgdTensor> ok = {{a.data(), a.data(), 3, 4, &st}};
  EXPECT_THROW(g.comm(0).allreduce_powersgd_async(ok, ps, hopwise::ReduceOp::kMax), hopwise::InvalidArgument);
}

// Averaging and error feedback over the communicator: over T steps the outputs plus every rank's final residual
// add up to the inputs (the residual holds what PowerSGD has not sent yet).
TEST(PowerSgdAllreduce, ErrorFeedbackConservesAcrossSteps) {
  const int p = 3, steps = 6;
  const std::size_t rows = 40, cols = 24;
  const cz::PowerSgd ps = cz::PowerSgd::from_spec("powersgd:rank=2");
  Group g(p, test_options());
  std::vector<std::vector<double>> in_sum(p, std::vector<double>(rows * cols)), out_sum = in_sum;
  std::vector<std::vector<float>> residual(p);
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    cz::PowerSgdState st(77);
    std::vector<float> buf;
    for (int step = 0; step < steps; ++step) {
      buf = input(500 + static_cast<std::uint64_t>(step), r, rows * cols);
      for (std::size_t i = 0; i < buf.size(); ++i) in_sum[static_cast<std::size_t>(r)][i] += buf[i];
      const hc::PowerSgdTensor t{buf.data(), buf.data(), rows, cols, &st};
      comm.allreduce_powersgd(std::span<const hc::PowerSgdTensor>(&t, 1), ps, hopwise::ReduceOp::kAvg);
      for (std::size_t i = 0; i < buf.size(); ++i) out_sum[static_cast<std::size_t>(r)][i] += buf[i] * p;
    }
    residual[static_cast<std::size_t>(r)] = ps.residual(st);
  });
  ASSERT_EQ(err, "");
  double worst = 0;
  for (std::size_t i = 0; i < rows * cols; ++i) {
    double in = 0, res = 0;
    for (int r = 0; r < p; ++r) {
      in += in_sum[static_cast<std::size_t>(r)][i];
      res += residual[static_cast<std::size_t>(r)][i];
    }
    worst = std::max(worst, std::abs(out_sum[0][i] + res - in));
  }
  EXPECT_LT(worst, 1e-3);
}

// Matrices at different steps in one call: one on its last warm-up step goes plain this call (its state moves
// past the warm-up during the call, which must not pull it into this call's compressed buffers) while another,
// past its warm-up, goes compressed.
TEST(PowerSgdAllreduce, MatricesAtDifferentStepsInOneCall) {
  const int p = 2;
  const std::size_t rows = 32, cols = 16;
  const cz::PowerSgd ps = cz::PowerSgd::from_spec("powersgd:rank=2,warmup=1");
  Group g(p, test_options());
  std::vector<std::vector<float>> warm_out(p);
  std::vector<std::uint64_t> warm_steps(p);
  const std::string err = g.run([&](int r, hc::Communicator& comm) {
    cz::PowerSgdState warm(1), past(2);
    past.step = 1;  // past its warm-up: compressed
    std::vector<float> a = input(900, r, rows * cols), b = input(901, r, rows * cols);
    const std::vector<hc::PowerSgdTensor> ts = {{a.data(), a.data(), rows, cols, &warm},
                                                {b.data(), b.data(), rows, cols, &past}};
    comm.allreduce_powersgd(ts, ps);
    warm_out[static_cast<std::size_t>(r)] = a;
    warm_steps[static_cast<std::size_t>(r)] = warm.step;
  });
  ASSERT_EQ(err, "");
  const std::vector<float> a0 = input(900, 0, rows * cols), a1 = input(900, 1, rows * cols);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(warm_steps[static_cast<std::size_t>(r)], 1u) << "the warm-up step is counted";
    for (std::size_t i = 0; i < rows * cols; ++i)
      ASSERT_EQ(warm_out[static_cast<std::size_t>(r)][i], a0[i] + a1[i])
          << "the warm-up matrix is summed plainly, element " << i;
  }
}
