// The compressed reduce-scatter and allgather (sharded training) over in-process ranks, for every codec, against a
// serial reference that runs the same codec: each rank encodes each block with its own scales and that block's
// state, and the owner decodes the payloads in rank order; then the codec's own error bound against the exact sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "inproc_group.h"
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

std::vector<cz::CodecState> block_states(std::uint64_t seed, int rank, int p) {
  std::vector<cz::CodecState> s;
  for (int b = 0; b < p; ++b) s.emplace_back(seed + static_cast<std::uint64_t>(b), rank, p);
  return s;
}

// One block of one rank through the codec, as the communicator sends it: its own scales, world_size 1.
std::vector<std::byte> encode(const cz::Codec& c, const float* x, std::size_t n, cz::CodecState& st,
                              std::vector<float>& scales) {
  st.world_size = 1;
  scales.assign(c.scale_count(n), 0.0f);
  if (!scales.empty()) c.local_scales(x, n, scales.data(), st);
  std::vector<std::byte> payload(c.payload_bytes(n));
  c.encode(x, n, payload.data(), st, scales.empty() ? nullptr : scales.data());
  return payload;
}

// What every rank's block of the reduce-scatter holds after `steps` calls (inputs: input(seed + step, r, p * n)).
std::vector<std::vector<float>> reference(const cz::Codec& c, std::uint64_t seed, int p, std::size_t n, int steps) {
  std::vector<std::vector<cz::CodecState>> st;
  for (int r = 0; r < p; ++r) st.push_back(block_states(seed, r, p));
  std::vector<std::vector<float>> out(static_cast<std::size_t>(p), std::vector<float>(n));
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<float>> x;
    for (int r = 0; r < p; ++r) x.push_back(input(seed + static_cast<std::uint64_t>(step), r, n * p));
    for (int d = 0; d < p; ++d) {
      auto& o = out[static_cast<std::size_t>(d)];
      std::fill(o.begin(), o.end(), 0.0f);
      std::vector<std::vector<std::byte>> payloads;
      std::vector<std::vector<float>> scales(static_cast<std::size_t>(p));
      for (int r = 0; r < p; ++r)  // every rank encodes before the owner decodes (randomk reads the step)
        payloads.push_back(encode(c, x[static_cast<std::size_t>(r)].data() + static_cast<std::size_t>(d) * n, n,
                                  st[static_cast<std::size_t>(r)][static_cast<std::size_t>(d)],
                                  scales[static_cast<std::size_t>(r)]));
      for (int r = 0; r < p; ++r)
        c.decode_add(
            payloads[static_cast<std::size_t>(r)].data(), n, o.data(),
            st[static_cast<std::size_t>(d)][static_cast<std::size_t>(d)],
            scales[static_cast<std::size_t>(r)].empty() ? nullptr : scales[static_cast<std::size_t>(r)].data());
    }
  }
  return out;
}

class ShardedCompressed : public ::testing::TestWithParam<const char*> {};

TEST_P(ShardedCompressed, ReduceScatterMatchesSerialCodecReference) {
  const auto codec = cz::make_codec(GetParam());
  const std::uint64_t seed = std::random_device{}();
  for (int p : {1, 2, 3, 4, 7}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
      SCOPED_TRACE(::testing::Message() << codec->name() << ", " << p << " ranks, block " << n << ", seed " << seed);
      const int steps = 2;  // the second call carries error feedback's residuals and the steps
      const auto ref = reference(*codec, seed, p, n, steps);
      Group g(p, test_options());
      std::vector<std::vector<float>> outs(static_cast<std::size_t>(p));
      const std::string err = g.run([&](int r, hc::Communicator& c) {
        auto st = block_states(seed, r, p);
        auto& out = outs[static_cast<std::size_t>(r)];
        out.assign(n, 0.0f);
        for (int step = 0; step < steps; ++step) {
          const auto x = input(seed + static_cast<std::uint64_t>(step), r, n * static_cast<std::size_t>(p));
          c.reduce_scatter_compressed(x.data(), out.data(), n, *codec, st);
        }
      });
      ASSERT_EQ(err, "");
      for (int r = 0; r < p; ++r)
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_NEAR(outs[static_cast<std::size_t>(r)][i], ref[static_cast<std::size_t>(r)][i], 1e-5)
              << "rank " << r << " element " << i;
    }
  }
}

TEST_P(ShardedCompressed, AllgatherDecodesEveryBlockAlikeOnEveryRank) {
  const auto codec = cz::make_codec(GetParam());
  const std::uint64_t seed = std::random_device{}();
  for (int p : {1, 2, 3, 5}) {
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
      for (bool in_place : {false, true}) {
        SCOPED_TRACE(::testing::Message()
                     << codec->name() << ", " << p << " ranks, n=" << n << ", in place " << in_place);
        // Each rank's block as its own encode decodes it (the seed alike on every rank, as the caller keeps it).
        std::vector<float> expect(n * static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r) {
          cz::CodecState st(seed, r, p);
          std::vector<float> scales;
          const auto x = input(seed, r, n);
          const auto payload = encode(*codec, x.data(), n, st, scales);
          codec->decode(payload.data(), n, expect.data() + static_cast<std::size_t>(r) * n, st,
                        scales.empty() ? nullptr : scales.data());
        }
        Group g(p, test_options());
        std::vector<std::vector<float>> outs(static_cast<std::size_t>(p));
        const std::string err = g.run([&](int r, hc::Communicator& c) {
          cz::CodecState st(seed, r, p);
          auto& out = outs[static_cast<std::size_t>(r)];
          out.assign(n * static_cast<std::size_t>(p), -1.0f);
          const auto x = input(seed, r, n);
          float* mine = out.data() + static_cast<std::size_t>(r) * n;  // FSDP gathers from its own block
          if (in_place) std::copy(x.begin(), x.end(), mine);
          c.allgather_compressed(in_place ? mine : x.data(), out.data(), n, *codec, st);
        });
        ASSERT_EQ(err, "");
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < expect.size(); ++i)
            ASSERT_NEAR(outs[static_cast<std::size_t>(r)][i], expect[i], 1e-6) << "rank " << r << " element " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Codecs, ShardedCompressed,
                         ::testing::Values("none", "fp16", "bf16", "int8", "int8:ef=1", "int8:round=stochastic", "int4",
                                           "int4:round=stochastic,ef=1,block=7", "fp8", "fp8:ef=1,block=5", "qsgd",
                                           "terngrad", "sign", "topk:ratio=0.05,ef=1", "randomk:ratio=0.1"),
                         hwtest::SpecTestName());

// The owner decodes each rank's payload once: int8's error is one rounding per rank at the full 127 levels (the
// bound s / 254 a rank, s its block's largest |x|), not an allreduce's headroom-shrunk levels, and no error compounds.
TEST(ShardedCompressedBounds, Int8ErrorIsOneRoundingPerRank) {
  const auto codec = cz::make_codec("int8:block=64");
  const std::uint64_t seed = 7;
  for (int p : {2, 4, 7}) {
    const std::size_t n = 1031;
    Group g(p, test_options());
    std::vector<std::vector<float>> outs(static_cast<std::size_t>(p));
    const std::string err = g.run([&](int r, hc::Communicator& c) {
      auto st = block_states(seed, r, p);
      outs[static_cast<std::size_t>(r)].assign(n, 0.0f);
      const auto x = input(seed, r, n * static_cast<std::size_t>(p));
      c.reduce_scatter_compressed(x.data(), outs[static_cast<std::size_t>(r)].data(), n, *codec, st);
    });
    ASSERT_EQ(err, "");
    for (int d = 0; d < p; ++d)
      for (std::size_t i = 0; i < n; ++i) {
        double exact = 0, bound = 1e-5;
        for (int r = 0; r < p; ++r) {
          const auto x = input(seed, r, n * static_cast<std::size_t>(p));
          const std::size_t at = static_cast<std::size_t>(d) * n + i, b0 = at - i % 64;
          float s = 0;
          for (std::size_t j = b0; j < std::min(b0 + 64, static_cast<std::size_t>(d + 1) * n); ++j)
            s = std::max(s, std::fabs(x[j]));
          exact += x[at];
          bound += s / 254.0 * (1 + 1e-6);
        }
        ASSERT_LE(std::fabs(outs[static_cast<std::size_t>(d)][i] - exact), bound) << p << " ranks, block " << d;
      }
  }
}

TEST(ShardedCompressedBounds, AveragesCountsWireBytesAndRefusesBadCalls) {
  Group g(2, test_options());
  const auto codec = cz::make_codec("fp16");
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    auto st = block_states(1, r, 2);
    std::vector<float> x(2000, r == 0 ? 1.0f : 3.0f), out(1000);
    c.reduce_scatter_compressed(x.data(), out.data(), out.size(), *codec, st, hopwise::ReduceOp::kAvg);
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(c.stats().wire_bytes, 2000u);  // one block of 1000 fp16 values to the other rank
    EXPECT_THROW(c.reduce_scatter_compressed(x.data(), out.data(), out.size(), *codec, st, hopwise::ReduceOp::kMax),
                 hopwise::InvalidArgument);
    std::vector<cz::CodecState> one(1);
    EXPECT_THROW(c.reduce_scatter_compressed(x.data(), out.data(), out.size(), *codec, one), hopwise::InvalidArgument);
    EXPECT_THROW(c.allgather_compressed(nullptr, out.data(), 10, *codec, st[0]), hopwise::InvalidArgument);
  });
  EXPECT_EQ(err, "");
}

}  // namespace
