// The bucketed gradient reducer over in-process ranks: random gradient sizes and random (per-rank) ready
// orders against a plain average of each gradient; bucket layout and rebuild; every error it promises.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>

#include "../training/src/reducer/bucket_tuner.h"
#include "collective_reference.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/powersgd.h"
#include "hopwise/training/reducer.h"
#include "inproc_group.h"
#include "powersgd_reference.h"

namespace {

using hwtest::Group;
using hwtest::test_options;
namespace hc = hopwise::comm;

// "p" + std::to_string(k) trips GCC 12's false -Wrestrict (its bug 105329) once inlined: append instead.
std::string param_name(const char* prefix, std::size_t k) {
  std::string name(prefix);
  name += std::to_string(k);
  return name;
}

struct Model {
  std::vector<std::size_t> sizes;
  std::vector<std::vector<float>> grads;  // separate allocations: buckets go through their flat buffers
  std::vector<float> flat;                // or one contiguous buffer (reverse order), viewed in place
};

// A pseudo-random value in [-1, 1) that every rank can recompute for every other rank.
float value(std::uint64_t seed, int rank, std::size_t param, std::size_t i, int step) {
  const std::uint64_t z =
      hwtest::splitmix64(seed ^ (static_cast<std::uint64_t>(rank) << 56) ^ (static_cast<std::uint64_t>(param) << 40) ^
                         (static_cast<std::uint64_t>(step) << 32) ^ i);
  return static_cast<float>(z >> 40) / static_cast<float>(1 << 23) - 1.0f;
}

void run_case(int ranks, std::size_t params, bool contiguous, double bucket_mb, std::uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << ranks << " ranks, " << params << " params, contiguous " << contiguous
                                    << ", bucket " << bucket_mb << " MB, seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> sizes(params);
  for (auto& s : sizes) s = std::uniform_int_distribution<std::size_t>(0, 70000)(rng);
  Group g(ranks, test_options());
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    hc::ReducerOptions ro;
    ro.bucket_mb = bucket_mb;
    ro.first_bucket_mb = std::min(bucket_mb, 0.05);
    hc::GradientReducer red(c, ro);
    std::vector<std::vector<float>> own(params);
    std::vector<float> flat;
    std::vector<float*> ptr(params);
    if (contiguous) {
      flat.assign(std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}), 0.0f);
      std::size_t off = 0;
      for (std::size_t k = params; k-- > 0;) {  // reverse order: the order backward produces them
        ptr[k] = flat.data() + off;
        off += sizes[k];
      }
    } else {
      for (std::size_t k = 0; k < params; ++k) {
        own[k].assign(sizes[k] + 1, 0.0f);
        ptr[k] = own[k].data();
      }
    }
    for (std::size_t k = 0; k < params; ++k) red.add_parameter(param_name("p", k), ptr[k], sizes[k]);
    red.finalize();
    std::mt19937_64 order_rng(seed + static_cast<std::uint64_t>(r) * 77);  // a different ready order per rank
    for (int step = 0; step < 3; ++step) {
      for (std::size_t k = 0; k < params; ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) ptr[k][i] = value(seed, r, k, i, step);
      std::vector<int> order(params);
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), order_rng);
      for (int k : order) red.mark_ready(k);
      const hc::StepStats st = red.finish();
      EXPECT_EQ(st.bytes, 4 * std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}));
      for (std::size_t k = 0; k < params; ++k)
        for (std::size_t i = 0; i < sizes[k]; ++i) {
          double sum = 0;
          for (int q = 0; q < ranks; ++q) sum += value(seed, q, k, i, step);
          const float want = static_cast<float>(sum / ranks);
          if (std::abs(ptr[k][i] - want) > 1e-5f * ranks) {
            ADD_FAILURE() << "rank " << r << " step " << step << " param " << k << "[" << i << "] = " << ptr[k][i]
                          << ", expected " << want;
            return;
          }
        }
    }
  });
  EXPECT_EQ(err, "");
}

TEST(Reducer, MatchesPlainAverageContiguous) {
  const std::uint64_t seed = std::random_device{}();
  for (int ranks : {1, 2, 3, 5}) run_case(ranks, 9, true, 0.1, seed + static_cast<std::uint64_t>(ranks));
}

TEST(Reducer, MatchesPlainAverageScattered) {
  const std::uint64_t seed = std::random_device{}();
  for (int ranks : {2, 4}) run_case(ranks, 13, false, 0.2, seed + static_cast<std::uint64_t>(ranks));
}

TEST(Reducer, BucketsFollowReverseOrderAndCap) {
  Group g(1, test_options());
  std::vector<float> a(100000), b(100000), c(10);
  hc::ReducerOptions ro;
  ro.bucket_mb = 0.5;
  ro.first_bucket_mb = 0.001;
  hc::GradientReducer red(g.comm(0), ro);
  red.add_parameter("a", a.data(), a.size());
  red.add_parameter("b", b.data(), b.size());
  red.add_parameter("c", c.data(), c.size());
  red.finalize();
  const auto names = red.bucket_names();
  ASSERT_EQ(names.size(), 3u);  // c alone (first bucket tiny), then b, then a (0.4 MB each, cap 0.5 MB)
  EXPECT_EQ(names[0], std::vector<std::string>{"c"});
  EXPECT_EQ(names[1], std::vector<std::string>{"b"});
  EXPECT_EQ(names[2], std::vector<std::string>{"a"});
}

TEST(Reducer, RebuildsFromRankZerosReadyOrder) {
  Group g(2, test_options());
  const std::string err = g.run([&](int, hc::Communicator& c) {
    std::vector<float> x(1000, 1.0f), y(1000, 2.0f), z(1000, 3.0f);
    hc::ReducerOptions ro;
    ro.bucket_mb = 0.005;  // ~1300 floats: one parameter a bucket
    ro.first_bucket_mb = 0.005;
    hc::GradientReducer red(c, ro);
    red.add_parameter("x", x.data(), x.size());
    red.add_parameter("y", y.data(), y.size());
    red.add_parameter("z", z.data(), z.size());
    red.finalize();
    EXPECT_EQ(red.bucket_names()[0], std::vector<std::string>{"z"});
    for (int k : {0, 2, 1}) red.mark_ready(k);  // x first: not the registration's reverse
    red.finish();
    const auto names = red.bucket_names();
    EXPECT_EQ(names[0], std::vector<std::string>{"x"});
    EXPECT_EQ(names[1], std::vector<std::string>{"z"});
    EXPECT_EQ(names[2], std::vector<std::string>{"y"});
    for (int k : {0, 2, 1}) red.mark_ready(k);
    red.finish();
    EXPECT_EQ(x[0], 1.0f);
    EXPECT_EQ(z[999], 3.0f);
  });
  EXPECT_EQ(err, "");
}

TEST(BucketTuner, EachCapItsStepsThenTheFastestAgreed) {
  hopwise::comm::detail::BucketTuner t(3);
  // This rank finds 4 MB fastest, the other rank (its figures arrive through the max) 2 MB slow: 4 MB stays.
  const std::vector<double> mine{5, 4, 2, 3, 6}, others{5, 9, 3, 3.5, 6};
  std::vector<double> caps_run;
  bool agreed = false;
  for (int step = 0; t.active(); ++step) {
    caps_run.push_back(t.cap());
    const auto k = static_cast<std::size_t>(step / 3);
    t.record(mine[k] + 0.1 * (step % 3), [&](std::vector<double>& v) {
      agreed = true;
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::max(v[i], others[i]);
    });
    ASSERT_LT(step, 20);
  }
  EXPECT_TRUE(agreed);
  EXPECT_EQ(caps_run.size(), 15u) << "five caps, three steps each";
  EXPECT_EQ(caps_run.front(), 1);
  EXPECT_EQ(caps_run.back(), 25);
  EXPECT_EQ(t.cap(), 4) << "the slowest rank's median per cap decides";
}

TEST(Reducer, TunedBucketCapIsTheSameOnEveryRankAndResultsStayExact) {
  Group g(2, test_options());
  std::vector<double> caps(2);
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    std::vector<std::vector<float>> grads;
    for (std::size_t n : {700000u, 600000u, 500000u, 400000u, 300000u}) grads.emplace_back(n);  // 10 MB in all
    hc::ReducerOptions ro;
    ro.tune_bucket = true;
    hc::GradientReducer red(c, ro);
    for (std::size_t i = 0; i < grads.size(); ++i)
      red.add_parameter(param_name("p", i), grads[i].data(), grads[i].size());
    red.finalize();
    std::set<std::size_t> bucket_counts;
    for (int step = 0; step < 30; ++step) {
      for (auto& gr : grads) std::fill(gr.begin(), gr.end(), static_cast<float>(r + step));
      for (int i = static_cast<int>(grads.size()) - 1; i >= 0; --i) red.mark_ready(i);
      red.finish();
      bucket_counts.insert(red.bucket_count());
      for (const auto& gr : grads)
        if (gr.front() != static_cast<float>(step) + 0.5f || gr.back() != static_cast<float>(step) + 0.5f)
          throw hopwise::Error(fmt::format("step {}: {} instead of the average {}", step, gr.front(), step + 0.5));
    }
    EXPECT_FALSE(red.tuning_bucket()) << "1 + 5 x 5 steps tune it";
    EXPECT_GE(bucket_counts.size(), 3u) << "the caps tried gave different buckets";
    caps[static_cast<std::size_t>(r)] = red.bucket_mb();
  });
  EXPECT_EQ(err, "");
  EXPECT_EQ(caps[0], caps[1]);
  EXPECT_NE(std::find(hopwise::comm::detail::BucketTuner::kCaps.begin(),
                      hopwise::comm::detail::BucketTuner::kCaps.end(), caps[0]),
            hopwise::comm::detail::BucketTuner::kCaps.end());
}

TEST(Reducer, MarkedTwiceIsAnError) {
  Group g(1, test_options());
  std::vector<float> a(10);
  hc::GradientReducer red(g.comm(0));
  red.add_parameter("layer1.weight", a.data(), a.size());
  red.finalize();
  red.mark_ready(0);
  try {
    red.mark_ready(0);
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'layer1.weight' was marked ready twice"), std::string::npos) << e.what();
  }
}

TEST(Reducer, ANameRegisteredTwiceIsAnError) {
  Group g(1, test_options());
  std::vector<float> a(10), b(10);
  hc::GradientReducer red(g.comm(0));
  red.add_parameter("fc1.weight", a.data(), a.size());
  try {
    red.add_parameter("fc1.weight", b.data(), b.size());
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0: add_parameter('fc1.weight'): a parameter of that name is already"),
              std::string::npos)
        << e.what();
  }
}

TEST(Reducer, FinishNamesGradientsNeverMarked) {
  Group g(1, test_options());
  std::vector<float> a(10), b(10), c(10);
  hc::GradientReducer red(g.comm(0));
  red.add_parameter("fc1", a.data(), a.size());
  red.add_parameter("fc2", b.data(), b.size());
  red.add_parameter("fc3", c.data(), c.size());
  red.finalize();
  red.mark_ready(1);
  try {
    red.finish();
    FAIL() << "no error";
  } catch (const hopwise::InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("fc1"), std::string::npos) << w;
    EXPECT_NE(w.find("fc3"), std::string::npos) << w;
    EXPECT_EQ(w.find("fc2"), std::string::npos) << w;
  }
}

TEST(Reducer, LayoutMismatchNamesTheRanks) {
  Group g(3, test_options());
  std::vector<std::string> errors(3);
  g.run([&](int r, hc::Communicator& c) {
    std::vector<float> a(r == 2 ? 11 : 10);
    hc::GradientReducer red(c);
    red.add_parameter("w", a.data(), a.size());
    try {
      red.finalize();
    } catch (const hopwise::InvalidArgument& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  });
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(errors[static_cast<std::size_t>(r)].find("on rank(s) 2"), std::string::npos)
        << "rank " << r << ": " << errors[static_cast<std::size_t>(r)];
}

TEST(Reducer, UseBeforeFinalizeIsAnError) {
  Group g(1, test_options());
  std::vector<float> a(10);
  hc::GradientReducer red(g.comm(0));
  red.add_parameter("w", a.data(), a.size());
  EXPECT_THROW(red.mark_ready(0), hopwise::InvalidArgument);
  EXPECT_THROW(red.finish(), hopwise::InvalidArgument);
  EXPECT_THROW(red.add_parameter("null", nullptr, 5), hopwise::InvalidArgument);
}

}  // namespace

// PowerSGD through the reducer: matrices registered with their shapes, a vector and a matrix too small to
// compress, random ready orders; each step's result against the same PowerSGD math run serially per matrix.
TEST(ReducerPowerSgd, MatchesTheSerialFactorsAndCountsTheirBytes) {
  namespace cz = hopwise::compression;
  const int ranks = 3, steps = 3;
  const std::uint64_t seed = 99;
  struct Shape {
    std::size_t rows, cols;
  };
  const std::vector<Shape> shapes = {{20, 30}, {1, 30}, {64, 17}, {6, 6}, {40, 1}};
  const cz::PowerSgd ps = cz::PowerSgd::from_spec("powersgd:rank=2,warmup=1");
  std::vector<std::vector<std::vector<float>>> got(ranks);  // rank -> param -> last step's result
  std::vector<std::size_t> bytes_step(steps);
  Group g(ranks, test_options());
  const std::string err = g.run([&](int r, hc::Communicator& c) {
    hc::ReducerOptions ro;
    ro.bucket_mb = 0.004;  // several buckets
    ro.first_bucket_mb = 0.002;
    ro.compression = ps.name();
    hc::GradientReducer red(c, ro);
    std::vector<std::vector<float>> grads(shapes.size());
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      grads[k].assign(shapes[k].rows * shapes[k].cols, 0.0f);
      red.add_parameter(param_name("m", k), grads[k].data(), shapes[k].rows, shapes[k].cols);
    }
    red.finalize();
    std::mt19937_64 order_rng(seed + static_cast<std::uint64_t>(r));
    for (int step = 0; step < steps; ++step) {
      for (std::size_t k = 0; k < shapes.size(); ++k)
        for (std::size_t i = 0; i < grads[k].size(); ++i) grads[k][i] = value(seed, r, k, i, step);
      std::vector<int> order(shapes.size());
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), order_rng);
      for (int k : order) red.mark_ready(k);
      const hc::StepStats st = red.finish();
      if (r == 0) bytes_step[static_cast<std::size_t>(step)] = st.bytes;
    }
    got[static_cast<std::size_t>(r)] = grads;
  });
  ASSERT_EQ(err, "");
  // Serial reference of the last step, each matrix with its own per-rank states (seeded as the reducer does).
  std::size_t plain_bytes = 0, compressed_bytes = 0;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    const auto [rows, cols] = shapes[k];
    const std::size_t n = rows * cols;
    plain_bytes += n * 4;
    compressed_bytes += ps.compresses(rows, cols) ? (ps.p_count(rows, cols) + ps.q_count(rows, cols)) * 4 : n * 4;
    std::vector<cz::PowerSgdState> st(ranks, cz::PowerSgdState(0x70736764ull + k));
    std::vector<float> out(n);
    for (int step = 0; step < steps; ++step) {
      std::vector<std::vector<float>> x(ranks, std::vector<float>(n));
      for (int q = 0; q < ranks; ++q)
        for (std::size_t i = 0; i < n; ++i) x[static_cast<std::size_t>(q)][i] = value(seed, q, k, i, step);
      if (!ps.compressed_step(rows, cols, st[0])) {
        for (std::size_t i = 0; i < n; ++i) {
          double sum = 0;
          for (int q = 0; q < ranks; ++q) sum += x[static_cast<std::size_t>(q)][i];
          out[i] = static_cast<float>(sum / ranks);
        }
        if (ps.compresses(rows, cols))
          for (auto& s : st) ps.skip(s);
        continue;
      }
      out = hwtest::powersgd_step(ps, x, rows, cols, st);
      for (auto& v : out) v /= ranks;
    }
    for (int q = 0; q < ranks; ++q) {
      const auto& mine = got[static_cast<std::size_t>(q)][k];
      double num = 0, den = 0;
      for (std::size_t i = 0; i < n; ++i) {
        num += (mine[i] - out[i]) * (mine[i] - out[i]);
        den += out[i] * out[i];
      }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-4) << "matrix " << k << " rank " << q;
    }
  }
  EXPECT_EQ(bytes_step[0], plain_bytes);  // the warm-up step sends every float
  EXPECT_EQ(bytes_step[1], compressed_bytes);
  EXPECT_LT(compressed_bytes, plain_bytes);
}
