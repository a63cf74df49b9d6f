// Compressed allreduce over in-process ranks (1..16) for every codec, against a reference that runs the same
// codec serially: agreed scales (max over ranks), each rank's encode, then the sum of the decoded payloads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "inproc_group.h"

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
      c.decode_add(payload.data(), n, out.data(), st[static_cast<std::size_t>(r)], scales.empty() ? nullptr : scales.data());
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
                         ::testing::Values("none", "fp16", "bf16", "int8", "int8:round=stochastic", "qsgd",
                                           "terngrad", "sign", "topk:ratio=0.05", "randomk:ratio=0.1"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& ch : s)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return s;
                         });

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
