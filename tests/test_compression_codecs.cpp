// hopwise::compression codecs: factory and parameter errors, payload sizes, round-trip error bounds, unbiasedness
// of the stochastic codecs, error-feedback conservation, summing aggregatable payloads, determinism, odd sizes.
// Random inputs use a fresh seed per run, printed on failure; HOPWISE_TEST_SEED=<seed> replays one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collective_reference.h"
#include "hopwise/common/error.h"
#include "hopwise/common/half.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/powersgd.h"
#include "powersgd_reference.h"

namespace {

namespace hc = hopwise::compression;
using hc::Codec;
using hc::CodecState;
using hc::Pattern;
using hopwise::InvalidArgument;

const std::size_t kOddSizes[] = {0, 1, 7, 1000003};

std::vector<float> gaussian(std::size_t n, std::uint64_t seed, float sigma = 1.0f) {
  hwtest::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    // Box-Muller; u1 in (0, 1].
    const double u1 = 1.0 - rng.unit(), u2 = rng.unit();
    x = static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

std::uint64_t seed_for(std::initializer_list<std::uint64_t> parts) {
  return hwtest::mix_seed(hwtest::base_seed(), parts);
}

std::string note() { return hwtest::seed_note(hwtest::base_seed()); }

// Encodes with this rank's own scales (single-rank use) and decodes into a fresh vector.
struct RoundTrip {
  std::vector<std::byte> payload;
  std::vector<float> scales;
  std::vector<float> out;
};
RoundTrip round_trip(const Codec& c, const std::vector<float>& x, CodecState& st) {
  RoundTrip r;
  const std::size_t n = x.size();
  r.payload.resize(c.payload_bytes(n));
  r.scales.resize(c.scale_count(n));
  if (!r.scales.empty()) c.local_scales(x.data(), n, r.scales.data(), st);
  c.encode(x.data(), n, r.payload.data(), st, r.scales.data());
  r.out.assign(n, -12345.0f);
  c.decode(r.payload.data(), n, r.out.data(), st, r.scales.data());
  return r;
}

std::vector<std::string> all_default_specs() {
  return {"none",
          "fp16",
          "bf16",
          "int8",
          "int8:round=stochastic,block=7",
          "int4",
          "int4:round=stochastic,block=7",
          "fp8",
          "fp8:block=5,ef=1",
          "qsgd",
          "terngrad",
          "sign",
          "topk",
          "randomk",
          "topk:ef=0,ratio=0.3",
          "randomk:ef=0,ratio=0.5",
          "sign:ef=0",
          "qsgd:ef=1,levels=3"};
}

// ---------------- factory, spec errors ----------------

std::string error_of(const std::string& spec) {
  try {
    hc::make_codec(spec);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CodecFactory, BuildsEveryKnownCodecWithCanonicalName) {
  // Every documented codec is in the table (a codec added later joins the loop below), each name once.
  const auto& known = hc::known_codecs();
  for (const char* documented :
       {"none", "fp16", "bf16", "int8", "int4", "fp8", "qsgd", "terngrad", "sign", "topk", "randomk"})
    EXPECT_NE(std::find(known.begin(), known.end(), documented), known.end()) << documented;
  EXPECT_EQ(std::set<std::string>(known.begin(), known.end()).size(), known.size()) << "a name twice";
  for (const auto& name : hc::known_codecs()) {
    auto c = hc::make_codec(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_EQ(c->name().substr(0, name.size()), name);
    // The canonical name lists every parameter and rebuilds the same codec.
    EXPECT_EQ(hc::make_codec(c->name())->name(), c->name());
  }
  EXPECT_EQ(hc::make_codec("topk")->name(), "topk:ef=1,ratio=0.01");
  EXPECT_EQ(hc::make_codec("sign")->name(), "sign:ef=1");
  EXPECT_EQ(hc::make_codec("int8:round=stochastic")->name(), "int8:block=256,ef=0,round=stochastic");
  EXPECT_EQ(hc::make_codec("qsgd:levels=4")->name(), "qsgd:ef=0,levels=4");
  EXPECT_EQ(hc::make_codec(" none ")->name(), "none");
}

TEST(CodecFactory, ErrorsNameTheProblemAndTheChoices) {
  const std::string unknown = error_of("zstd");
  EXPECT_NE(unknown.find("unknown codec 'zstd'"), std::string::npos) << unknown;
  for (const auto& name : hc::known_codecs()) EXPECT_NE(unknown.find(name), std::string::npos) << unknown;

  const std::string param = error_of("topk:ratio=0.1,bogus=3");
  EXPECT_NE(param.find("no parameter 'bogus'"), std::string::npos) << param;
  EXPECT_NE(param.find("ratio, ef"), std::string::npos) << param;
  EXPECT_NE(error_of("none:ef=1").find("takes no parameters"), std::string::npos);
  EXPECT_NE(error_of("fp16:block=4").find("it takes: ef"), std::string::npos);

  EXPECT_NE(error_of("int8:block=0").find("not an integer in [1, 16777216]"), std::string::npos);
  EXPECT_NE(error_of("int8:block=12x").find("not an integer in [1, 16777216]"), std::string::npos);
  EXPECT_NE(error_of("int8:round=up").find("not one of nearest|stochastic"), std::string::npos);
  EXPECT_NE(error_of("qsgd:levels=128").find("[1, 127]"), std::string::npos);
  EXPECT_NE(error_of("topk:ratio=0").find("not a number in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of("randomk:ratio=1.5").find("not a number in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of("randomk:ratio=nan").find("not a number in (0, 1]"), std::string::npos);
  EXPECT_NE(error_of("sign:ef=2").find("not one of 0|1"), std::string::npos);
  EXPECT_NE(error_of(":ef=1").find("no codec name"), std::string::npos);  // the parser's own error
  EXPECT_EQ(error_of("topk:ratio=1"), "<no error>");
  EXPECT_EQ(error_of("int8:block=1"), "<no error>");
}

TEST(CodecFactory, DefaultSpecReadsTheEnvironment) {
  ::unsetenv("HOPWISE_COMPRESSION");
  EXPECT_EQ(hc::default_codec_spec().to_string(), "none");
  ::setenv("HOPWISE_COMPRESSION", "topk:ratio=0.05", 1);
  EXPECT_EQ(hc::default_codec_spec().to_string(), "topk:ratio=0.05");
  ::setenv("HOPWISE_COMPRESSION", "int8:blok=3", 1);
  try {
    hc::default_codec_spec();
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("HOPWISE_COMPRESSION=int8:blok=3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no parameter 'blok'"), std::string::npos) << e.what();
  }
  ::unsetenv("HOPWISE_COMPRESSION");
}

TEST(CodecState, RejectsBadRanks) {
  EXPECT_THROW(CodecState(1, 2, 2), InvalidArgument);
  EXPECT_THROW(CodecState(1, -1, 2), InvalidArgument);
  EXPECT_THROW(CodecState(1, 0, 0), InvalidArgument);
  EXPECT_NO_THROW(CodecState(1, 1, 2));
}

TEST(CodecState, NullBuffersAreErrorsOnlyWhereBytesAreNeeded) {
  CodecState st(1, 0, 1);
  std::vector<float> x(4, 1.0f);
  std::vector<std::byte> p(64);
  auto none = hc::make_codec("none");
  EXPECT_NO_THROW(none->encode(nullptr, 0, nullptr, st));
  EXPECT_NO_THROW(none->decode(nullptr, 0, nullptr, st));
  EXPECT_THROW(none->encode(nullptr, 4, p.data(), st), InvalidArgument);
  EXPECT_THROW(none->encode(x.data(), 4, nullptr, st), InvalidArgument);
  EXPECT_THROW(none->decode(p.data(), 4, nullptr, st), InvalidArgument);
  auto qsgd = hc::make_codec("qsgd");  // a 4-byte header even for no elements
  EXPECT_THROW(qsgd->encode(nullptr, 0, nullptr, st), InvalidArgument);
  EXPECT_NO_THROW(qsgd->encode(nullptr, 0, p.data(), st));
  EXPECT_THROW(qsgd->decode_add(nullptr, 0, nullptr, st), InvalidArgument);
}

// ---------------- sizes and patterns ----------------

TEST(CodecPayload, SizesPatternsAndDtypes) {
  struct Want {
    const char* spec;
    Pattern pattern;
    hopwise::DataType dt;
    std::size_t (*bytes)(std::size_t);
  };
  const auto k1 = [](std::size_t n) -> std::size_t { return n == 0 ? 0 : std::max<std::size_t>(1, (n + 99) / 100); };
  static decltype(k1) K = k1;
  const Want wants[] = {
      {"none", Pattern::kAggregatable, hopwise::DataType::kFloat32, [](std::size_t n) { return 4 * n; }},
      {"fp16", Pattern::kAggregatable, hopwise::DataType::kFloat16, [](std::size_t n) { return 2 * n; }},
      {"bf16", Pattern::kAggregatable, hopwise::DataType::kBFloat16, [](std::size_t n) { return 2 * n; }},
      {"int8", Pattern::kAggregatable, hopwise::DataType::kUInt8, [](std::size_t n) { return n; }},
      // int4: per block of 64 a float32 scale and ceil(m / 2) bytes; fp8: per block of 128 a scale and m bytes.
      {"int4", Pattern::kGather, hopwise::DataType::kUInt8,
       [](std::size_t n) { return 4 * ((n + 63) / 64) + 32 * (n / 64) + (n % 64 + 1) / 2; }},
      {"fp8", Pattern::kGather, hopwise::DataType::kUInt8, [](std::size_t n) { return 4 * ((n + 127) / 128) + n; }},
      {"qsgd", Pattern::kGather, hopwise::DataType::kUInt8, [](std::size_t n) { return 4 + n; }},
      {"terngrad", Pattern::kGather, hopwise::DataType::kUInt8, [](std::size_t n) { return 4 + (n + 3) / 4; }},
      {"sign", Pattern::kGather, hopwise::DataType::kUInt8, [](std::size_t n) { return 4 + (n + 7) / 8; }},
      {"topk", Pattern::kGather, hopwise::DataType::kUInt8, [](std::size_t n) { return 8 * K(n); }},
      {"randomk", Pattern::kAggregatable, hopwise::DataType::kFloat32, [](std::size_t n) { return 4 * K(n); }},
  };
  for (const auto& w : wants) {
    auto c = hc::make_codec(w.spec);
    EXPECT_EQ(c->pattern(), w.pattern) << w.spec;
    EXPECT_EQ(c->payload_dtype(), w.dt) << w.spec;
    for (std::size_t n : {0, 1, 7, 100, 101, 1000003}) {
      EXPECT_EQ(c->payload_bytes(n), w.bytes(n)) << w.spec << " n=" << n;
      EXPECT_EQ(c->payload_bytes(n), c->payload_count(n) * hopwise::dtype_size(c->payload_dtype()));
    }
  }
  EXPECT_EQ(hc::make_codec("int8:block=256")->scale_count(1000003), 3907u);
  EXPECT_EQ(hc::make_codec("int8:block=7")->scale_count(7), 1u);
  EXPECT_EQ(hc::make_codec("fp16")->scale_count(1000), 0u);
  EXPECT_EQ(hc::make_codec("topk:ratio=0.3")->payload_bytes(10), 8u * 3);  // 0.3 * 10 rounds to 3, not 4
}

// The address alignment a payload needs where it is read in words (DeviceCodec checks it): the payload dtype's
// size, but 4 for topk, whose byte payload holds uint32 indices and float32 values; error feedback keeps it.
TEST(CodecSizes, PayloadAlignment) {
  const std::pair<const char*, std::size_t> want[] = {{"none", 4},      {"fp16", 2},
                                                      {"bf16:ef=1", 2}, {"int8", 1},
                                                      {"qsgd", 1},      {"terngrad", 1},
                                                      {"sign", 1},      {"topk", 4},
                                                      {"topk:ef=0", 4}, {"sign:ef=0", 1},
                                                      {"randomk", 4},   {"randomk:ef=0", 4},
                                                      {"int4", 1},      {"int4:ef=1,block=7", 1},
                                                      {"fp8", 1},       {"fp8:ef=1", 1}};
  for (const auto& [spec, align] : want) EXPECT_EQ(hc::make_codec(spec)->payload_alignment(), align) << spec;
}

// ---------------- round-trip error bounds ----------------

TEST(CodecRoundTrip, NoneIsExact) {
  auto c = hc::make_codec("none");
  const auto x = gaussian(1000, seed_for({1}));
  CodecState st(1, 0, 1);
  EXPECT_EQ(round_trip(*c, x, st).out, x);
}

TEST(CodecRoundTrip, HalfPrecisionRelativeError) {
  struct Case {
    const char* spec;
    double u;
  };
  for (const Case cs : {Case{"fp16", 0x1p-11}, Case{"bf16", 0x1p-8}}) {
    auto c = hc::make_codec(cs.spec);
    auto x = gaussian(100000, seed_for({2}), 10.0f);
    x.push_back(0.0f);
    x.push_back(1.0f + 0x1p-11f + 0x1p-20f);  // must round up in fp16
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    // Bit for bit the conversions of half.h (round to nearest even), whichever kernel ran (HOPWISE_ISA).
    for (std::size_t i = 0; i < x.size(); ++i) {
      std::uint16_t bits;
      std::memcpy(&bits, r.payload.data() + 2 * i, 2);
      ASSERT_EQ(bits, std::string(cs.spec) == "fp16" ? hopwise::float_to_fp16(x[i]) : hopwise::float_to_bf16(x[i]))
          << cs.spec << " i=" << i << " x=" << x[i];
    }
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      // values below the fp16 normal range (2^-14) are subnormal: absolute error <= 2^-25
      const double err = std::fabs(static_cast<double>(r.out[i]) - x[i]);
      ASSERT_LE(err, cs.u * std::fabs(x[i]) + 0x1p-25) << cs.spec << " i=" << i << " x=" << x[i] << " " << note();
      if (std::fabs(x[i]) > 1e-3) worst = std::max(worst, err / std::fabs(x[i]));
    }
    EXPECT_GT(worst, cs.u / 4) << cs.spec << ": the codec looks lossless, is it encoding at all?";
  }
}

TEST(CodecRoundTrip, Int8ErrorPerBlockIsHalfAStep) {
  for (std::size_t block : {1, 7, 256}) {
    auto c = hc::make_codec("int8:block=" + std::to_string(block));
    auto x = gaussian(10007, seed_for({3, block}), 3.0f);
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    ASSERT_EQ(r.scales.size(), (x.size() + block - 1) / block);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const float s = r.scales[i / block];
      EXPECT_GE(s, std::fabs(x[i]));
      // Half a step, plus the float rounding of x * q / s and of l * s / q.
      ASSERT_LE(std::fabs(r.out[i] - x[i]), s / 254.0f + 4e-7f * s) << "block " << block << " i " << i;
    }
    // The block maximum itself decodes exactly (to float rounding).
    const std::size_t imax = static_cast<std::size_t>(
        std::max_element(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(std::min(block, x.size())),
                         [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
        x.begin());
    EXPECT_NEAR(r.out[imax], x[imax], 1e-6 * std::fabs(x[imax]));
  }
}

// Blocks whose largest value is tiny (below about 1e-36, denormals included): the scaled codecs send zeros or the
// values themselves, never NaN or a value larger than the block's scale.
TEST(CodecRoundTrip, TinyBlocksDecodeToNoMoreThanTheirScale) {
  const std::vector<float> x = {0.0f, 1e-45f, -3e-39f, 1e-38f, -2e-37f, 5e-37f, 0.0f, -1e-36f, 7e-36f};
  for (const std::string spec :
       {"int8:block=4", "int8:block=4,round=stochastic", "int4:block=4", "fp8:block=4", "terngrad", "qsgd:levels=16"}) {
    auto c = hc::make_codec(spec);
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    float largest = 0.0f;
    for (float v : x) largest = std::max(largest, std::fabs(v));
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(r.out[i])) << spec << " i " << i;
      ASSERT_LE(std::fabs(r.out[i]), 2.0f * largest) << spec << " i " << i;
      if (x[i] == 0.0f && spec.rfind("int", 0) == 0) {
        EXPECT_EQ(r.out[i], 0.0f) << spec << " i " << i;
      }
    }
  }
}

TEST(CodecRoundTrip, Int8NeedsAgreedScalesAndAtMost127Ranks) {
  auto c = hc::make_codec("int8");
  std::vector<float> x(10, 1.0f);
  std::vector<std::byte> p(c->payload_bytes(10));
  CodecState st(1, 0, 1);
  EXPECT_THROW(c->encode(x.data(), 10, p.data(), st, nullptr), InvalidArgument);
  std::vector<float> s(1, 1.0f);
  CodecState big(1, 0, 128);
  EXPECT_THROW(c->encode(x.data(), 10, p.data(), big, s.data()), InvalidArgument);
  CodecState ok(1, 0, 127);
  c->encode(x.data(), 10, p.data(), ok, s.data());
  EXPECT_EQ(static_cast<int>(static_cast<std::int8_t>(p[0])), 1);  // q = floor(127 / 127)
}

TEST(CodecRoundTrip, SignTernGradQsgdShapes) {
  const auto x = gaussian(4099, seed_for({4}));
  {
    auto c = hc::make_codec("sign:ef=0");
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    double mean = 0;
    for (float v : x) mean += std::fabs(v);
    mean /= static_cast<double>(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_NEAR(std::fabs(r.out[i]), mean, 1e-5 * mean) << i;
      ASSERT_EQ(r.out[i] < 0, x[i] < 0) << i;
    }
  }
  {
    auto c = hc::make_codec("terngrad");
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    float s = 0;
    for (float v : x) s = std::max(s, std::fabs(v));
    std::size_t nonzero = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(r.out[i] == 0.0f || std::fabs(r.out[i]) == s) << i << " " << r.out[i];
      if (r.out[i] != 0.0f) {
        ++nonzero;
        ASSERT_EQ(r.out[i] < 0, x[i] < 0) << i;
      }
    }
    EXPECT_GT(nonzero, 0u);
    EXPECT_LT(nonzero, x.size());
  }
  for (int levels : {1, 3, 16, 127}) {
    auto c = hc::make_codec("qsgd:levels=" + std::to_string(levels));
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    double norm = 0;
    for (float v : x) norm += static_cast<double>(v) * v;
    norm = std::sqrt(norm);
    const double step = norm / levels;
    for (std::size_t i = 0; i < x.size(); ++i) {
      ASSERT_LT(std::fabs(r.out[i] - x[i]), step * (1 + 1e-5)) << levels << " " << i;
      const double l = r.out[i] / step;
      ASSERT_NEAR(l, std::round(l), 1e-3) << "decoded value is not on the level grid";
      if (r.out[i] != 0.0f) {
        ASSERT_EQ(r.out[i] < 0, x[i] < 0);
      }
    }
  }
}

TEST(CodecRoundTrip, TopKKeepsExactlyTheKLargest) {
  for (double ratio : {0.01, 0.1, 0.5, 1.0}) {
    auto c = hc::make_codec("topk:ef=0,ratio=" + std::to_string(ratio));
    auto x = gaussian(20011, seed_for({5}));
    for (std::size_t i = 0; i < 50; ++i) x[i * 7] = 2.5f;  // ties
    CodecState st(1, 0, 1);
    const auto r = round_trip(*c, x, st);
    const std::size_t k = c->payload_bytes(x.size()) / 8;
    EXPECT_EQ(k, static_cast<std::size_t>(std::ceil(ratio * x.size() - 1e-6)));
    std::size_t kept = 0;
    float min_kept = INFINITY, max_dropped = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (r.out[i] != 0.0f) {
        ++kept;
        ASSERT_EQ(r.out[i], x[i]);
        min_kept = std::min(min_kept, std::fabs(x[i]));
      } else {
        max_dropped = std::max(max_dropped, std::fabs(x[i]));
      }
    }
    EXPECT_EQ(kept, k) << ratio;
    EXPECT_GE(min_kept, max_dropped) << ratio;
    // Indices ascend in the payload.
    std::vector<std::uint32_t> idx(k);
    std::memcpy(idx.data(), r.payload.data(), 4 * k);
    EXPECT_TRUE(std::is_sorted(idx.begin(), idx.end()));
  }
}

// The selected set equals a full sort by (|x| descending, index ascending), for data that crowds one histogram
// bin of the pre-selection, data with many ties and zeros, and plain gaussian data.
TEST(CodecRoundTrip, TopKMatchesAFullSort) {
  const std::size_t n = 30011;
  std::vector<std::vector<float>> inputs;
  inputs.push_back(gaussian(n, seed_for({14})));
  inputs.emplace_back(n, -1.0f);  // all ties: the lowest indices win
  std::vector<float> crowded = gaussian(n, seed_for({15}), 1e-3f);
  for (auto& v : crowded) v = 1.0f + std::fabs(v);  // all in [1, 1.125): one bin
  inputs.push_back(crowded);
  std::vector<float> sparse(n, 0.0f);
  for (std::size_t i = 0; i < n; i += 97) sparse[i] = static_cast<float>(i % 5) - 2.0f;
  inputs.push_back(sparse);
  for (double ratio : {0.001, 0.05, 0.9}) {
    auto c = hc::make_codec("topk:ef=0,ratio=" + std::to_string(ratio));
    for (std::size_t t = 0; t < inputs.size(); ++t) {
      const auto& x = inputs[t];
      CodecState st(1, 0, 1);
      const auto r = round_trip(*c, x, st);
      const std::size_t k = c->payload_bytes(n) / 8;
      std::vector<std::uint32_t> order(n);
      for (std::size_t i = 0; i < n; ++i) order[i] = static_cast<std::uint32_t>(i);
      std::stable_sort(order.begin(), order.end(),
                       [&](std::uint32_t a, std::uint32_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
      std::vector<std::uint32_t> want(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
      std::sort(want.begin(), want.end());
      std::vector<std::uint32_t> got(k);
      std::memcpy(got.data(), r.payload.data(), 4 * k);
      ASSERT_EQ(got, want) << "ratio " << ratio << " input " << t;
    }
  }
}

TEST(CodecRoundTrip, RandomKKeepsOneValuePerStratum) {
  auto c = hc::make_codec("randomk:ef=0,ratio=0.01");
  const auto x = gaussian(100000, seed_for({6}));
  CodecState st(7, 0, 1);
  const auto r = round_trip(*c, x, st);
  const std::size_t k = 1000;
  ASSERT_EQ(c->payload_bytes(x.size()), 4 * k);
  std::vector<int> per_stratum(k, 0);
  for (std::size_t i = 0; i < x.size(); ++i)
    if (r.out[i] != 0.0f) {
      ASSERT_EQ(r.out[i], x[i]);
      ++per_stratum[i / 100];
    }
  for (std::size_t j = 0; j < k; ++j) ASSERT_EQ(per_stratum[j], 1) << "stratum " << j;
  // The next step picks other indices.
  const auto r2 = round_trip(*c, x, st);
  EXPECT_NE(r2.out, r.out);
  EXPECT_THROW(
      {
        CodecState fresh(7, 0, 1);
        std::vector<float> out(x.size());
        c->decode(r.payload.data(), x.size(), out.data(), fresh);
      },
      InvalidArgument);
}

TEST(CodecRoundTrip, AwkwardSizes) {
  for (const auto& spec : all_default_specs()) {
    auto c = hc::make_codec(spec);
    for (std::size_t n : kOddSizes) {
      const auto x = gaussian(n, seed_for({7, n}));
      CodecState st(3, 0, 1);
      const auto r = round_trip(*c, x, st);
      ASSERT_EQ(r.out.size(), n);
      double err = 0, mag = 0;
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(r.out[i])) << spec << " n=" << n << " i=" << i;
        err += std::fabs(r.out[i] - x[i]);
        mag += std::fabs(x[i]);
      }
      // Sanity: no codec's L1 error exceeds twice that of sending zeros (the expectation for qsgd at few levels,
      // E|d - x| = 2|x| (1 - |x| / step)), plus room for its fluctuation.
      EXPECT_LE(err, 2.2 * mag + 1e-6) << spec << " n=" << n;
      // decode_add adds on top of what is there.
      std::vector<float> acc(n, 1.0f);
      c->decode_add(r.payload.data(), n, acc.data(), st, r.scales.data());
      for (std::size_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(acc[i], 1.0f + r.out[i]) << spec << " n=" << n;
    }
  }
}

// ---------------- unbiasedness of the stochastic codecs ----------------

// Mean over T seeded trials of decode(encode(x)) is within 5 standard errors of x (per element), where the
// variance bound follows from the codec: qsgd (norm/s)^2/4, terngrad s*|x| - x^2, int8 (scale/q)^2/4.
// Nearest rounding of the same values is biased by up to half a step: the check must reject it.
void expect_unbiased(const std::string& spec, int world_size, bool expect_pass) {
  auto c = hc::make_codec(spec);
  const std::size_t n = 48;
  auto x = gaussian(n, seed_for({8}));
  x[0] = 0.0f;
  const int trials = 4000;
  std::vector<double> mean(n, 0.0);
  std::vector<double> var_bound(n, 0.0);
  double norm = 0, mx = 0;
  for (float v : x) {
    norm += static_cast<double>(v) * v;
    mx = std::max(mx, static_cast<double>(std::fabs(v)));
  }
  norm = std::sqrt(norm);
  for (std::size_t i = 0; i < n; ++i) {
    if (spec.rfind("qsgd", 0) == 0) var_bound[i] = std::pow(norm / 16, 2) / 4;
    if (spec.rfind("terngrad", 0) == 0) var_bound[i] = mx * std::fabs(x[i]) - static_cast<double>(x[i]) * x[i];
    if (spec.rfind("int8", 0) == 0) var_bound[i] = std::pow(mx / (127 / world_size), 2) / 4;  // block >= n
  }
  for (int t = 0; t < trials; ++t) {
    CodecState st(seed_for({9, static_cast<std::uint64_t>(t)}), 0, world_size);
    std::vector<float> scales(c->scale_count(n), static_cast<float>(mx));
    std::vector<std::byte> p(c->payload_bytes(n));
    c->encode(x.data(), n, p.data(), st, scales.data());
    std::vector<float> out(n);
    c->decode(p.data(), n, out.data(), st, scales.data());
    for (std::size_t i = 0; i < n; ++i) mean[i] += out[i];
  }
  bool all_ok = true;
  for (std::size_t i = 0; i < n; ++i) {
    mean[i] /= trials;
    const double tol = 5.0 * std::sqrt(var_bound[i] / trials) + 1e-6 * mx;
    const bool ok = std::fabs(mean[i] - x[i]) <= tol;
    all_ok = all_ok && ok;
    if (expect_pass) {
      EXPECT_TRUE(ok) << spec << " i=" << i << " x=" << x[i] << " mean=" << mean[i] << " tol=" << tol << " " << note();
    }
  }
  if (!expect_pass) {
    EXPECT_FALSE(all_ok) << spec << ": a biased codec passed the unbiasedness check";
  }
}

TEST(CodecUnbiased, Qsgd) { expect_unbiased("qsgd:levels=16", 1, true); }
TEST(CodecUnbiased, TernGrad) { expect_unbiased("terngrad", 1, true); }
TEST(CodecUnbiased, Int8Stochastic) {
  expect_unbiased("int8:block=256,round=stochastic", 1, true);
  expect_unbiased("int8:block=256,round=stochastic", 8, true);
}
TEST(CodecUnbiased, Int8NearestIsCaughtAsBiased) { expect_unbiased("int8:block=256,round=nearest", 8, false); }

// ---------------- error feedback ----------------

// Over T steps: sum of decoded payloads + final residual == sum of inputs (up to float rounding of the residual
// updates: 2 roundings per step of values bounded by max|residual| + max|grad|).
double ef_discrepancy(const std::string& spec, int steps, double* scale_out) {
  auto c = hc::make_codec(spec);
  const std::size_t n = 1003;
  CodecState st(11, 0, 1);
  std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
  double scale = 0;
  for (int t = 0; t < steps; ++t) {
    const auto g = gaussian(n, seed_for({10, static_cast<std::uint64_t>(t)}));
    std::vector<float> scales(c->scale_count(n));
    if (!scales.empty()) c->local_scales(g.data(), n, scales.data(), st);
    std::vector<std::byte> p(c->payload_bytes(n));
    c->encode(g.data(), n, p.data(), st, scales.data());
    std::vector<float> out(n);
    c->decode(p.data(), n, out.data(), st, scales.data());
    for (std::size_t i = 0; i < n; ++i) {
      sum_in[i] += g[i];
      sum_out[i] += out[i];
      scale = std::max({scale, std::fabs(static_cast<double>(g[i])), std::fabs(static_cast<double>(out[i]))});
    }
    for (float r : st.residual) scale = std::max(scale, std::fabs(static_cast<double>(r)));
  }
  double worst = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double r = st.residual.empty() ? 0.0 : st.residual[i];
    worst = std::max(worst, std::fabs(sum_out[i] + r - sum_in[i]));
  }
  *scale_out = scale;
  return worst;
}

TEST(CodecErrorFeedback, ConservesTheSumOfInputs) {
  const int steps = 30;
  for (const char* spec : {"sign", "topk:ratio=0.05", "randomk:ratio=0.05", "int8:ef=1", "qsgd:ef=1", "terngrad:ef=1",
                           "fp16:ef=1", "bf16:ef=1", "int8:ef=1,round=stochastic,block=5", "int4:ef=1",
                           "int4:ef=1,round=stochastic,block=9", "fp8:ef=1", "fp8:ef=1,block=3"}) {
    double scale = 0;
    const double d = ef_discrepancy(spec, steps, &scale);
    EXPECT_LE(d, 2.0 * steps * 0x1p-23 * scale) << spec << " " << note();
  }
  // Without error feedback the dropped mass is lost: the same check must fail.
  for (const char* spec : {"sign:ef=0", "topk:ef=0,ratio=0.05"}) {
    double scale = 0;
    EXPECT_GT(ef_discrepancy(spec, steps, &scale), 0.1) << spec;
  }
}

TEST(CodecErrorFeedback, ResidualBelongsToOneTensorSize) {
  auto c = hc::make_codec("topk");
  CodecState st(1, 0, 1);
  std::vector<float> a(100, 1.0f), b(50, 1.0f);
  std::vector<std::byte> p(c->payload_bytes(100));
  c->encode(a.data(), a.size(), p.data(), st);
  EXPECT_EQ(st.residual.size(), 100u);
  EXPECT_EQ(st.step, 1u);
  EXPECT_THROW(c->encode(b.data(), b.size(), p.data(), st), InvalidArgument);
  EXPECT_EQ(st.step, 1u);  // the rejected call did not count
}

// ---------------- aggregatable: sum of payloads, decoded once ----------------

TEST(CodecAggregate, SumOfPayloadsDecodesToSumOfDecodes) {
  struct Case {
    const char* spec;
    double rel;  // tolerance relative to sum over ranks of |decoded| (rounding of the payload dtype in the sum)
  };
  const int p = 4;
  const std::size_t n = 10007;
  for (const Case cs :
       {Case{"none", p * 0x1p-24}, Case{"fp16", p * 0x1p-11}, Case{"bf16", p * 0x1p-8}, Case{"int8", 1e-6},
        Case{"int8:round=stochastic,block=100", 1e-6}, Case{"randomk:ef=0", p * 0x1p-24},
        Case{"randomk:ratio=0.2", p * 0x1p-24}, Case{"fp16:ef=1", p * 0x1p-11}}) {
    auto c = hc::make_codec(cs.spec);
    ASSERT_EQ(c->pattern(), Pattern::kAggregatable) << cs.spec;
    std::vector<std::vector<float>> x(p);
    std::vector<CodecState> st;
    for (int r = 0; r < p; ++r) {
      x[r] = gaussian(n, seed_for({12, static_cast<std::uint64_t>(r)}), 1.0f + r);
      st.emplace_back(99, r, p);
    }
    // Agree on scales: max over ranks.
    std::vector<float> agreed(c->scale_count(n), 0.0f);
    for (int r = 0; r < p; ++r) {
      std::vector<float> s(agreed.size());
      if (!s.empty()) c->local_scales(x[r].data(), n, s.data(), st[r]);
      for (std::size_t b = 0; b < s.size(); ++b) agreed[b] = std::max(agreed[b], s[b]);
    }
    std::vector<std::byte> sum(c->payload_bytes(n));
    std::vector<double> ref(n, 0.0), mag(n, 0.0), truth(n, 0.0);
    for (int r = 0; r < p; ++r) {
      std::vector<std::byte> pay(c->payload_bytes(n));
      c->encode(x[r].data(), n, pay.data(), st[r], agreed.data());
      std::vector<float> d(n);
      c->decode(pay.data(), n, d.data(), st[r], agreed.data());
      for (std::size_t i = 0; i < n; ++i) {
        ref[i] += d[i];
        mag[i] += std::fabs(d[i]);
        truth[i] += x[r][i];
      }
      if (r == 0)
        sum = pay;
      else
        c->sum_payloads(sum.data(), pay.data(), n);
    }
    std::vector<float> out(n);
    c->decode(sum.data(), n, out.data(), st[0], agreed.data());
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_LE(std::fabs(out[i] - ref[i]), cs.rel * mag[i] + 1e-30) << cs.spec << " i=" << i << " " << note();
    if (std::string(cs.spec).rfind("int8", 0) == 0) {
      // Documented bound of the summed int8 error: p * s / (2q) (nearest), p * s / q (stochastic), q = 127 / p.
      const bool stoch = std::string(cs.spec).find("stochastic") != std::string::npos;
      const std::size_t block = c->scale_count(n) == (n + 255) / 256 ? 256 : 100;
      for (std::size_t i = 0; i < n; ++i) {
        const double step = agreed[i / block] / (127 / p);
        ASSERT_LE(std::fabs(out[i] - truth[i]), p * step * (stoch ? 1.0 : 0.5) + 1e-6 * p * agreed[i / block])
            << cs.spec << " " << i;
      }
    }
  }
  auto gather = hc::make_codec("topk");
  std::vector<std::byte> a(8), b(8);
  EXPECT_THROW(gather->sum_payloads(a.data(), b.data(), 1), InvalidArgument);
}

TEST(CodecAggregate, RandomKIndicesAgreeAcrossRanksAndDifferAcrossSeeds) {
  auto c = hc::make_codec("randomk:ef=0,ratio=0.01");
  std::vector<float> x(50000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto payload_of = [&](std::uint64_t seed, int rank, int steps) {
    CodecState st(seed, rank, 4);
    std::vector<std::byte> p(c->payload_bytes(x.size()));
    for (int s = 0; s < steps; ++s) c->encode(x.data(), x.size(), p.data(), st);
    return p;
  };
  EXPECT_EQ(payload_of(5, 0, 1), payload_of(5, 3, 1));
  EXPECT_EQ(payload_of(5, 1, 3), payload_of(5, 2, 3));
  EXPECT_NE(payload_of(5, 0, 1), payload_of(6, 0, 1));
  EXPECT_NE(payload_of(5, 0, 1), payload_of(5, 0, 2));
}

// ---------------- determinism ----------------

TEST(CodecDeterminism, SameSeedSameBits) {
  const auto x = gaussian(4097, seed_for({13}));
  for (const auto& spec : all_default_specs()) {
    auto c = hc::make_codec(spec);
    auto run = [&](std::uint64_t seed, int rank) {
      CodecState st(seed, rank, 2);
      std::vector<std::byte> all;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> scales(c->scale_count(x.size()));
        if (!scales.empty()) c->local_scales(x.data(), x.size(), scales.data(), st);
        std::vector<std::byte> p(c->payload_bytes(x.size()));
        c->encode(x.data(), x.size(), p.data(), st, scales.data());
        all.insert(all.end(), p.begin(), p.end());
      }
      return all;
    };
    EXPECT_EQ(run(42, 0), run(42, 0)) << spec;
    const bool stochastic =
        spec.find("qsgd") == 0 || spec.find("terngrad") == 0 || spec.find("stochastic") != std::string::npos;
    if (stochastic) {
      EXPECT_NE(run(42, 0), run(43, 0)) << spec << ": the seed does not reach the stochastic rounding";
      EXPECT_NE(run(42, 0), run(42, 1)) << spec << ": ranks share their rounding noise";
    }
  }
}

// ---------------- PowerSGD ----------------

using hc::PowerSgd;
using hc::PowerSgdState;
using hwtest::powersgd_step;

// A rank-2 matrix A B^T is recovered exactly (to float rounding) by rank 4, in one step, without feedback.
TEST(PowerSgd, RecoversALowRankMatrix) {
  const std::size_t rows = 37, cols = 53;
  const auto a = gaussian(rows * 2, seed_for({20})), b = gaussian(cols * 2, seed_for({21}));
  std::vector<float> m(rows * cols);
  double mag = 0;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t c = 0; c < cols; ++c) {
      m[i * cols + c] = a[2 * i] * b[2 * c] + a[2 * i + 1] * b[2 * c + 1];
      mag = std::max(mag, static_cast<double>(std::fabs(m[i * cols + c])));
    }
  const PowerSgd ps = PowerSgd::from_spec("powersgd:rank=4,ef=0");
  std::vector<PowerSgdState> st(1, PowerSgdState(5));
  const auto out = powersgd_step(ps, {m}, rows, cols, st);
  for (std::size_t i = 0; i < m.size(); ++i) ASSERT_NEAR(out[i], m[i], 1e-4 * mag) << i << " " << note();
  // ... while rank 1 cannot.
  const PowerSgd ps1(1, false);
  std::vector<PowerSgdState> st1(1, PowerSgdState(5));
  const auto out1 = powersgd_step(ps1, {m}, rows, cols, st1);
  double err = 0;
  for (std::size_t i = 0; i < m.size(); ++i) err = std::max(err, static_cast<double>(std::fabs(out1[i] - m[i])));
  EXPECT_GT(err, 1e-2 * mag);
}

// Over p ranks: every rank gets P^ P^T (sum of M_r) with P^ orthonormal; with feedback the outputs plus the ranks'
// residuals add up to the inputs over many steps.
TEST(PowerSgd, SumOverRanksIsAProjectionAndFeedbackConserves) {
  const std::size_t rows = 64, cols = 48, p = 3, steps = 12;
  const PowerSgd ps = PowerSgd::from_spec("powersgd:rank=3");
  EXPECT_EQ(ps.name(), "powersgd:ef=1,rank=3");
  std::vector<PowerSgdState> st(p, PowerSgdState(77));
  std::vector<double> sum_in(rows * cols, 0.0), sum_out(rows * cols, 0.0);
  double scale = 0;
  for (std::size_t t = 0; t < steps; ++t) {
    std::vector<std::vector<float>> g(p);
    for (std::size_t r = 0; r < p; ++r) g[r] = gaussian(rows * cols, seed_for({22, t, r}));
    const auto out = powersgd_step(ps, g, rows, cols, st);
    // P^ has orthonormal columns.
    const auto& ph = st[0].p_hat;
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 3; ++k) {
        double d = 0;
        for (std::size_t i = 0; i < rows; ++i) d += static_cast<double>(ph[i * 3 + j]) * ph[i * 3 + k];
        ASSERT_NEAR(d, j == k ? 1.0 : 0.0, 1e-5) << j << "," << k;
      }
    // out == P^ P^T sum_r M_r (M_r = the grads plus last step's residuals, kept in state.m).
    for (std::size_t c = 0; c < cols; ++c) {
      double proj[3] = {0, 0, 0};
      for (std::size_t j = 0; j < 3; ++j)
        for (std::size_t i = 0; i < rows; ++i)
          for (std::size_t r = 0; r < p; ++r) proj[j] += static_cast<double>(ph[i * 3 + j]) * st[r].m[i * cols + c];
      for (std::size_t i = 0; i < rows; ++i) {
        const double want = ph[i * 3] * proj[0] + ph[i * 3 + 1] * proj[1] + ph[i * 3 + 2] * proj[2];
        ASSERT_NEAR(out[i * cols + c], want, 1e-4 * (1 + std::fabs(want))) << t << " " << i << " " << c;
      }
    }
    std::vector<std::vector<float>> res(p);
    for (std::size_t r = 0; r < p; ++r) res[r] = ps.residual(st[r]);
    for (std::size_t i = 0; i < rows * cols; ++i) {
      sum_out[i] += out[i];
      for (std::size_t r = 0; r < p; ++r) {
        sum_in[i] += g[r][i];
        scale = std::max(scale, static_cast<double>(std::fabs(res[r][i])));
      }
      scale = std::max(scale, static_cast<double>(std::fabs(out[i])));
    }
  }
  std::vector<std::vector<float>> last(p);
  for (std::size_t r = 0; r < p; ++r) last[r] = ps.residual(st[r]);
  for (std::size_t i = 0; i < rows * cols; ++i) {
    double res = 0;
    for (std::size_t r = 0; r < p; ++r) res += last[r][i];
    ASSERT_NEAR(sum_out[i] + res, sum_in[i], 1e-5 * steps * scale * p) << i << " " << note();
  }
}

// The summed Q is the next step's warm start: on a fixed gradient M = U S V^T (orthonormal U, V built here,
// singular values 1, 0.9, then 0.5 .. 0.39) subspace iteration converges to the best rank-2 error
// sqrt(sum_{k>=2} s_k^2); a single step from the random start does not.
TEST(PowerSgd, WarmStartConvergesToTheBestRankRError) {
  const std::size_t rows = 60, cols = 40, kk = 12;
  auto orthonormal = [](std::size_t len, std::uint64_t seed) {
    std::vector<std::vector<double>> basis;
    for (std::size_t k = 0; k < kk; ++k) {
      const auto g = gaussian(len, seed_for({seed, k}));
      std::vector<double> v(g.begin(), g.end());
      for (const auto& e : basis) {
        double d = 0;
        for (std::size_t i = 0; i < len; ++i) d += v[i] * e[i];
        for (std::size_t i = 0; i < len; ++i) v[i] -= d * e[i];
      }
      double nrm = 0;
      for (double x : v) nrm += x * x;
      for (double& x : v) x /= std::sqrt(nrm);
      basis.push_back(v);
    }
    return basis;
  };
  const auto u = orthonormal(rows, 23), v = orthonormal(cols, 24);
  std::vector<double> sv = {1.0, 0.9};
  for (std::size_t k = 2; k < kk; ++k) sv.push_back(0.5 - 0.01 * static_cast<double>(k - 2));
  std::vector<float> m(rows * cols, 0.0f);
  double opt = 0;
  for (std::size_t k = 0; k < kk; ++k) {
    if (k >= 2) opt += sv[k] * sv[k];
    for (std::size_t i = 0; i < rows; ++i)
      for (std::size_t c = 0; c < cols; ++c) m[i * cols + c] += static_cast<float>(sv[k] * u[k][i] * v[k][c]);
  }
  opt = std::sqrt(opt);
  const PowerSgd ps(2, false);
  std::vector<PowerSgdState> st(1, PowerSgdState(seed_for({25})));
  auto err_of = [&](const std::vector<float>& out) {
    double e = 0;
    for (std::size_t i = 0; i < m.size(); ++i) e += std::pow(static_cast<double>(out[i]) - m[i], 2);
    return std::sqrt(e);
  };
  const double first = err_of(powersgd_step(ps, {m}, rows, cols, st));
  double last = first;
  for (int t = 0; t < 30; ++t) last = err_of(powersgd_step(ps, {m}, rows, cols, st));
  EXPECT_LE(last, opt * (1 + 1e-3)) << "first " << first << " last " << last << " best " << opt << " " << note();
  EXPECT_LT(last, first) << "first " << first << " last " << last << " best " << opt << " " << note();
  EXPECT_GE(last, opt * (1 - 1e-4));  // no rank-2 matrix does better
  EXPECT_EQ(st[0].step, 31u);
}

TEST(PowerSgd, ShapesOrderAndSpecErrors) {
  const PowerSgd ps(4, true);
  EXPECT_EQ(ps.effective_rank(3, 100), 3u);
  EXPECT_EQ(ps.effective_rank(100, 1), 1u);
  EXPECT_EQ(ps.p_count(100, 50), 400u);
  EXPECT_EQ(ps.q_count(100, 50), 200u);
  // A single column, a zero gradient: no NaN, zero output.
  for (auto shape : {std::pair<std::size_t, std::size_t>{7, 1}, {1, 1}, {5, 5}}) {
    std::vector<PowerSgdState> st(1, PowerSgdState(1));
    const auto out =
        powersgd_step(ps, {std::vector<float>(shape.first * shape.second, 0.0f)}, shape.first, shape.second, st);
    for (float v : out) ASSERT_EQ(v, 0.0f);
  }
  PowerSgdState st(1);
  std::vector<float> g(20, 1.0f), buf(100);
  EXPECT_THROW(ps.compute_q(buf.data(), 4, 5, buf.data(), st), InvalidArgument);
  ps.compute_p(g.data(), 4, 5, buf.data(), st);
  EXPECT_THROW(ps.compute_p(g.data(), 4, 5, buf.data(), st), InvalidArgument);
  EXPECT_THROW(ps.decompress(buf.data(), 4, 5, buf.data(), st), InvalidArgument);
  EXPECT_THROW(ps.compute_q(buf.data(), 5, 4, buf.data(), st), InvalidArgument);
  ps.compute_q(buf.data(), 4, 5, buf.data(), st);
  ps.decompress(buf.data(), 4, 5, buf.data(), st);
  EXPECT_THROW(ps.compute_p(g.data(), 5, 4, buf.data(), st), InvalidArgument);  // another tensor's state
  for (const char* bad : {"powersgd:rank=0", "powersgd:rank=2000", "powersgd:ef=3", "powersgd:warmup=-1",
                          "powersgd:warmup=x", "powersgd:q=1", "topk"})
    EXPECT_THROW(PowerSgd::from_spec(bad), InvalidArgument) << bad;
  EXPECT_NE(error_of("powersgd:rank=4").find("PowerSgd::from_spec"), std::string::npos);
}

TEST(PowerSgdCodec, WarmupAndWhatIsWorthCompressing) {
  const PowerSgd ps = PowerSgd::from_spec("powersgd:rank=4,warmup=2");
  EXPECT_EQ(ps.name(), "powersgd:ef=1,rank=4,warmup=2");
  EXPECT_EQ(PowerSgd::from_spec(ps.name()).name(), ps.name());
  EXPECT_FALSE(ps.compresses(1, 1000));  // 1-D: a bias
  EXPECT_FALSE(ps.compresses(1000, 1));
  EXPECT_FALSE(ps.compresses(10, 10));  // (10+10)*4*2 = 160 > 100: not clearly smaller
  EXPECT_TRUE(ps.compresses(16, 16));   // (16+16)*4*2 = 256 <= 256
  EXPECT_TRUE(ps.compresses(1024, 784));
  PowerSgdState st(5);
  EXPECT_FALSE(ps.compressed_step(64, 64, st));
  ps.skip(st);
  ps.skip(st);
  EXPECT_TRUE(ps.compressed_step(64, 64, st));
}

}  // namespace
