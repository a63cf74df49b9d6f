// Compression on the network stage only (CompressionScope::kNetwork, "network:CODEC"): in-process ranks planned
// over several hosts (HOPWISE_TOPO_FILE) sum within each host at full precision, the hosts' leaders all-reduce the
// sums through the codec (or PowerSGD), and every rank ends with the leaders' result. Compared with a serial
// reference: the exact host sums (inputs are multiples of 1/8, so any summing order gives the same floats), then
// the codec over the hosts as if each host were one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "hosts_file.h"
#include "inproc_group.h"
#include "powersgd_reference.h"
#include "spec_test_name.h"

namespace {

namespace hc = hopwise::comm;
namespace cz = hopwise::compression;

// Rank r's input at a step: small multiples of 1/8, exact in float and in every partial sum.
std::vector<float> input(std::uint64_t seed, int rank, std::size_t n) {
  std::mt19937_64 g(seed * 31 + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> d(0.0f, 8.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = std::round(d(g)) / 8.0f;
  return v;
}

struct Layout {
  int hosts, per_host, ranks;  // ranks fill hosts in order, per_host each (the last may hold fewer)
  int host_of(int r) const { return r / per_host; }
};
const Layout kLayouts[] = {{2, 2, 4}, {3, 2, 5}, {2, 4, 8}, {3, 1, 3}};

// Each host's sum of its ranks' inputs.
std::vector<std::vector<float>> host_sums(const Layout& l, std::uint64_t seed, std::size_t n) {
  std::vector<std::vector<float>> s(static_cast<std::size_t>(l.hosts), std::vector<float>(n, 0.0f));
  for (int r = 0; r < l.ranks; ++r) {
    const auto x = input(seed, r, n);
    for (std::size_t i = 0; i < n; ++i) s[static_cast<std::size_t>(l.host_of(r))][i] += x[i];
  }
  return s;
}

// Runs `body` on in-process ranks planned over the layout's hosts.
std::string run_on_hosts(const Layout& l, const std::function<void(int, hc::Communicator&)>& body) {
  const auto file = hwtest::hosts_file(l.hosts, l.per_host);
  ::setenv("HOPWISE_TOPO_FILE", file.c_str(), 1);
  hwtest::Group g(l.ranks, hwtest::test_options(hc::Algorithm::kAuto, 1024));  // small chunks: pipelined trees
  ::unsetenv("HOPWISE_TOPO_FILE");
  std::filesystem::remove(file);
  for (int r = 0; r < l.ranks; ++r) {
    const int host = l.host_of(r);
    const int members = std::min(l.per_host, l.ranks - host * l.per_host);
    if (g.comm(r).host_ranks() != members) return fmt::format("rank {}: the plan put it on another host", r);
  }
  return g.run(body);
}

// The reference: the codec run serially among the hosts, each host's sum its input (steps in a row, the last
// step's result), divided by the ranks (avg).
std::vector<float> codec_over_hosts(const cz::Codec& codec, const Layout& l, std::uint64_t seed, std::size_t n,
                                    int steps) {
  std::vector<cz::CodecState> st;
  for (int h = 0; h < l.hosts; ++h) st.emplace_back(seed, h, l.hosts);
  std::vector<float> want(n);
  for (int step = 0; step < steps; ++step) {
    const auto sums = host_sums(l, seed + static_cast<std::uint64_t>(step), n);
    std::vector<float> scales(codec.scale_count(n), 0.0f), local(scales.size());
    for (int h = 0; h < l.hosts; ++h) {
      codec.local_scales(sums[static_cast<std::size_t>(h)].data(), n, local.data(), st[static_cast<std::size_t>(h)]);
      for (std::size_t i = 0; i < scales.size(); ++i) scales[i] = std::max(scales[i], local[i]);
    }
    std::fill(want.begin(), want.end(), 0.0f);
    std::vector<std::byte> payload(codec.payload_bytes(n));
    for (int h = 0; h < l.hosts; ++h) {
      codec.encode(sums[static_cast<std::size_t>(h)].data(), n, payload.data(), st[static_cast<std::size_t>(h)],
                   scales.empty() ? nullptr : scales.data());
      codec.decode_add(payload.data(), n, want.data(), st[static_cast<std::size_t>(h)],
                       scales.empty() ? nullptr : scales.data());
    }
  }
  for (float& w : want) w /= static_cast<float>(l.ranks);
  return want;
}

class NetworkCodec : public ::testing::TestWithParam<const char*> {};

// Deterministic codecs (a stochastic one draws from the leader's rank, which follows the plan's ring).
TEST_P(NetworkCodec, EqualsTheCodecOverTheHostsSums) {
  const auto codec = cz::make_codec(GetParam());
  const std::uint64_t seed = 77;
  const int steps = 2;  // the second step runs on error feedback's residual
  for (const Layout& l : kLayouts)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{13}, std::size_t{4099}}) {
      SCOPED_TRACE(::testing::Message() << codec->name() << ", " << l.hosts << " hosts of " << l.per_host << ", "
                                        << l.ranks << " ranks, n=" << n);
      const std::vector<float> want = codec_over_hosts(*codec, l, seed, n, steps);
      std::vector<std::vector<float>> got(static_cast<std::size_t>(l.ranks));
      std::vector<std::uint64_t> wire(static_cast<std::size_t>(l.ranks));
      const std::string err = run_on_hosts(l, [&](int r, hc::Communicator& c) {
        cz::CodecState mine(seed, r, l.ranks);  // the call makes it the leader's among the hosts
        auto& out = got[static_cast<std::size_t>(r)];
        out.assign(n, 0.0f);
        for (int step = 0; step < steps; ++step) {
          const auto x = input(seed + static_cast<std::uint64_t>(step), r, n);
          if (step % 2)
            c.allreduce_compressed(x.data(), out.data(), n, *codec, mine, hopwise::ReduceOp::kAvg,
                                   hc::CompressionScope::kNetwork);
          else
            c.allreduce_compressed_async(x.data(), out.data(), n, *codec, mine, hopwise::ReduceOp::kAvg,
                                         hc::CompressionScope::kNetwork)
                .wait();
        }
        wire[static_cast<std::size_t>(r)] = c.stats().wire_bytes;
      });
      ASSERT_EQ(err, "");
      // fp16/bf16 payloads are summed in their own type along the leaders' ring: a rounding per host.
      const std::string name = codec->name();
      const double tol = name.rfind("fp16", 0) == 0   ? 64.0 * l.hosts * std::ldexp(1.0, -11)
                         : name.rfind("bf16", 0) == 0 ? 64.0 * l.hosts * std::ldexp(1.0, -8)
                                                      : 1e-4;
      for (int r = 0; r < l.ranks; ++r) {
        EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << "rank " << r << " ended with other bits than rank 0";
        for (std::size_t i = 0; i < n; ++i)
          ASSERT_NEAR(got[static_cast<std::size_t>(r)][i], want[i], tol * (1 + std::abs(want[i])))
              << "rank " << r << " element " << i;
      }
      // Only the leaders put the codec's payloads on the wire; the others send nothing through it.
      if (n > 0 && name != "none") {
        for (int r = 0; r < l.ranks; ++r) {
          if (r % l.per_host != 0) {
            EXPECT_EQ(wire[static_cast<std::size_t>(r)], 0u) << "rank " << r;
          }
        }
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Codecs, NetworkCodec,
                         ::testing::Values("none", "fp16", "bf16", "int8", "topk:ratio=0.05", "sign",
                                           "randomk:ratio=0.1"),
                         hwtest::SpecTestName());

// PowerSGD among the hosts' leaders: each host's summed matrices are its input, over several steps (warm-up, then
// compressed, with error feedback).
TEST(NetworkPowerSgd, EqualsPowerSgdOverTheHostsSums) {
  struct Shape {
    std::size_t rows, cols;
  };
  const std::vector<Shape> shapes = {{1, 7}, {0, 5}, {33, 17}, {64, 48}, {128, 3}};
  const cz::PowerSgd ps = cz::PowerSgd::from_spec("powersgd:rank=2,warmup=1");
  const std::uint64_t seed = 91;
  const int steps = 3;
  for (const Layout& l : kLayouts) {
    SCOPED_TRACE(::testing::Message() << l.hosts << " hosts of " << l.per_host << ", " << l.ranks << " ranks");
    std::vector<std::vector<cz::PowerSgdState>> st(shapes.size());
    for (std::size_t k = 0; k < shapes.size(); ++k)
      for (int h = 0; h < l.hosts; ++h) st[k].emplace_back(500 + k);
    std::vector<std::vector<float>> want(shapes.size());
    for (int step = 0; step < steps; ++step)
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        const auto [rows, cols] = shapes[k];
        const auto sums = host_sums(l, seed + 97 * static_cast<std::uint64_t>(step) + k, rows * cols);
        if (ps.compressed_step(rows, cols, st[k][0])) {
          want[k] = hwtest::powersgd_step(ps, sums, rows, cols, st[k]);
        } else {
          want[k].assign(rows * cols, 0.0f);
          for (const auto& s : sums)
            for (std::size_t i = 0; i < s.size(); ++i) want[k][i] += s[i];
          if (ps.compresses(rows, cols))
            for (auto& s : st[k]) ps.skip(s);
        }
      }
    for (auto& w : want)
      for (float& x : w) x /= static_cast<float>(l.ranks);
    std::vector<std::vector<std::vector<float>>> got(static_cast<std::size_t>(l.ranks));
    const std::string err = run_on_hosts(l, [&](int r, hc::Communicator& c) {
      std::vector<cz::PowerSgdState> mine;
      for (std::size_t k = 0; k < shapes.size(); ++k) mine.emplace_back(500 + k);
      std::vector<std::vector<float>> bufs(shapes.size());
      for (int step = 0; step < steps; ++step) {
        std::vector<hc::PowerSgdTensor> ts;
        for (std::size_t k = 0; k < shapes.size(); ++k) {
          bufs[k] = input(seed + 97 * static_cast<std::uint64_t>(step) + k, r, shapes[k].rows * shapes[k].cols);
          ts.push_back({bufs[k].data(), bufs[k].data(), shapes[k].rows, shapes[k].cols, &mine[k]});
        }
        c.allreduce_powersgd(ts, ps, hopwise::ReduceOp::kAvg, hc::CompressionScope::kNetwork);
      }
      got[static_cast<std::size_t>(r)] = bufs;
    });
    ASSERT_EQ(err, "");
    for (std::size_t k = 0; k < shapes.size(); ++k)
      for (int r = 0; r < l.ranks; ++r) {
        EXPECT_EQ(got[static_cast<std::size_t>(r)][k], got[0][k]) << "rank " << r << ", matrix " << k;
        EXPECT_LT(hwtest::relative_l2(got[static_cast<std::size_t>(r)][k], want[k]), 1e-4) << "matrix " << k;
      }
  }
}

// Stochastic codecs draw from the leader's place among the hosts: no serial reference, but every rank must end with
// the leaders' bits, and the result must be the hosts' mean within the codec's error.
TEST(NetworkCompression, StochasticCodecsGiveEveryRankTheSameBitsNearTheMean) {
  const Layout l{2, 2, 4};
  const std::size_t n = 4099;
  for (const char* spec : {"qsgd", "terngrad", "int8:round=stochastic"}) {
    SCOPED_TRACE(spec);
    const auto codec = cz::make_codec(spec);
    const auto sums = host_sums(l, 5, n);
    std::vector<float> mean(n);
    for (std::size_t i = 0; i < n; ++i) mean[i] = (sums[0][i] + sums[1][i]) / static_cast<float>(l.ranks);
    std::vector<std::vector<float>> got(static_cast<std::size_t>(l.ranks));
    const std::string err = run_on_hosts(l, [&](int r, hc::Communicator& c) {
      cz::CodecState st(5, r, l.ranks);
      const auto x = input(5, r, n);
      auto& out = got[static_cast<std::size_t>(r)];
      out.assign(n, 0.0f);
      c.allreduce_compressed(x.data(), out.data(), n, *codec, st, hopwise::ReduceOp::kAvg,
                             hc::CompressionScope::kNetwork);
    });
    ASSERT_EQ(err, "");
    for (int r = 1; r < l.ranks; ++r) EXPECT_EQ(got[static_cast<std::size_t>(r)], got[0]) << "rank " << r;
    // The serial run draws other random numbers (its hosts in host order, the leaders in ring order): its error
    // is the scale to expect, not the bits.
    const double expected = hwtest::relative_l2(codec_over_hosts(*codec, l, 5, n, 1), mean);
    EXPECT_LT(hwtest::relative_l2(got[0], mean), 1.5 * expected + 1e-3) << "the serial run's error: " << expected;
  }
}

TEST(NetworkCompression, OnOneHostNothingIsCompressed) {
  hwtest::Group g(3, hwtest::test_options());
  const auto codec = cz::make_codec("int8");
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    cz::CodecState st(1, r, 3);
    std::vector<float> x(1001), out(1001);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.001f * static_cast<float>(i) * static_cast<float>(r + 1);
    c.allreduce_compressed(x.data(), out.data(), x.size(), *codec, st, hopwise::ReduceOp::kSum,
                           hc::CompressionScope::kNetwork);
    for (std::size_t i = 0; i < x.size(); ++i)
      if (std::abs(out[i] - 0.006f * static_cast<float>(i)) > 1e-5f * static_cast<float>(i + 1))
        throw std::runtime_error(fmt::format("element {}: {} (int8 would not be this close)", i, out[i]));
    EXPECT_EQ(c.stats().wire_bytes, 0u);
  });
  EXPECT_EQ(err, "");
}

TEST(NetworkCompression, TheSpecIsSplitAndABareNetworkIsRefused) {
  EXPECT_EQ(hc::split_compression_scope("network:int8"),
            std::pair(hc::CompressionScope::kNetwork, std::string("int8")));
  EXPECT_EQ(hc::split_compression_scope("network:powersgd:rank=4").second, "powersgd:rank=4");
  EXPECT_EQ(hc::split_compression_scope("int8").first, hc::CompressionScope::kWorld);
  for (const char* bad : {"network:", "network:none"}) {
    try {
      hc::split_compression_scope(bad);
      ADD_FAILURE() << bad << " was taken";
    } catch (const hopwise::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("network:int8"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
