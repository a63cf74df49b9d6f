// The low-bit gather codecs int4 and fp8 (e4m3) against plain scalar references written here: payload bytes and
// decoded bits on awkward sizes and blocks, with zeros, negative zero, huge, tiny and subnormal magnitudes and blocks
// of equal values; the documented error bounds; stochastic int4's unbiasedness; error feedback; and the compressed
// allreduce over in-process ranks against the reference sum. Random inputs use a fresh seed per run, printed on
// failure; HOPWISE_TEST_SEED=<seed> replays one.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collective_reference.h"
#include "hopwise/common/error.h"
#include "hopwise/compression/codec.h"
#include "inproc_group.h"

namespace {

namespace cz = hopwise::compression;
using cz::Codec;
using cz::CodecState;
using hwtest::Group;
using hwtest::test_options;

std::uint64_t seed_for(std::initializer_list<std::uint64_t> parts) {
  return hwtest::mix_seed(hwtest::base_seed(), parts);
}
std::string note() { return hwtest::seed_note(hwtest::base_seed()); }

std::uint32_t bits_of(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// ---------------- the references: one block at a time, scalar, no tricks ----------------

void put_f32(std::vector<std::byte>& p, float f) {
  const auto* b = reinterpret_cast<const std::byte*>(&f);
  p.insert(p.end(), b, b + 4);
}
float get_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

float block_max(const float* x, std::size_t m) {
  float s = 0.0f;
  for (std::size_t i = 0; i < m; ++i) s = std::max(s, std::fabs(x[i]));
  return s;
}

bool usable(float s) { return s > 0.0f && std::isfinite(s); }

// int4: s = max |x|; level = x / s * 7 rounded to nearest (ties to even); two levels a byte, low nibble first.
std::vector<std::byte> ref_int4_encode(const std::vector<float>& x, std::size_t block) {
  std::vector<std::byte> p;
  for (std::size_t i0 = 0; i0 < x.size(); i0 += block) {
    const std::size_t m = std::min(block, x.size() - i0);
    const float s = block_max(&x[i0], m);
    put_f32(p, s);
    std::vector<int> level(m + 1, 0);
    for (std::size_t i = 0; i < m; ++i) {
      const float y = usable(s) ? x[i0 + i] / s * 7.0f : 0.0f;
      level[i] = std::clamp(static_cast<int>(std::nearbyint(y)), -7, 7);
    }
    for (std::size_t j = 0; j < (m + 1) / 2; ++j)
      p.push_back(static_cast<std::byte>((level[2 * j] & 15) | ((level[2 * j + 1] & 15) << 4)));
  }
  return p;
}

std::vector<float> ref_int4_decode(const std::vector<std::byte>& p, std::size_t n, std::size_t block) {
  std::vector<float> out(n);
  std::size_t at = 0;
  for (std::size_t i0 = 0; i0 < n; i0 += block) {
    const std::size_t m = std::min(block, n - i0);
    const float s = get_f32(&p[at]);
    for (std::size_t i = 0; i < m; ++i) {
      int nib = (static_cast<int>(p[at + 4 + i / 2]) >> (4 * (i % 2))) & 15;
      if (nib >= 8) nib -= 16;
      out[i0 + i] = static_cast<float>(nib) / 7.0f * s;
    }
    at += 4 + (m + 1) / 2;
  }
  return out;
}

// e4m3 (OCP FN): the 127 non-negative finite values, code order = value order.
const std::array<double, 127>& e4m3_values() {
  static const std::array<double, 127> v = [] {
    std::array<double, 127> t{};
    for (int c = 0; c < 127; ++c) {
      const int e = c >> 3, m = c & 7;
      t[static_cast<std::size_t>(c)] = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
    }
    return t;
  }();
  return v;
}

float ref_fp8_scale(float mx) {
  float s = mx / 448.0f;
  const double prod = static_cast<double>(s) * 448.0;
  if (s < FLT_MIN) {
    if (prod < mx) s = std::nextafter(s, INFINITY);
  } else if (prod > mx) {
    s = std::nextafter(s, 0.0f);
  }
  return s;
}

std::uint8_t ref_e4m3(float y) {
  const double a = std::min(std::fabs(static_cast<double>(y)), 448.0);
  const auto& v = e4m3_values();
  std::size_t hi = static_cast<std::size_t>(std::lower_bound(v.begin(), v.end(), a) - v.begin());  // v[hi] >= a
  std::size_t c = hi;
  if (hi > 0 && (hi == v.size() || a - v[hi - 1] < v[hi] - a || (a - v[hi - 1] == v[hi] - a && (hi - 1) % 2 == 0)))
    c = hi - 1;
  return static_cast<std::uint8_t>(c | (std::signbit(y) ? 0x80u : 0u));
}

float ref_e4m3_value(std::uint8_t c) {
  if ((c & 0x7f) == 0x7f) return NAN;
  const float v = static_cast<float>(e4m3_values()[c & 0x7fu]);
  return (c & 0x80) ? -v : v;
}

std::vector<std::byte> ref_fp8_encode(const std::vector<float>& x, std::size_t block) {
  std::vector<std::byte> p;
  for (std::size_t i0 = 0; i0 < x.size(); i0 += block) {
    const std::size_t m = std::min(block, x.size() - i0);
    const float s = ref_fp8_scale(block_max(&x[i0], m));
    put_f32(p, s);
    for (std::size_t i = 0; i < m; ++i) p.push_back(static_cast<std::byte>(ref_e4m3(usable(s) ? x[i0 + i] / s : 0.0f)));
  }
  return p;
}

std::vector<float> ref_fp8_decode(const std::vector<std::byte>& p, std::size_t n, std::size_t block) {
  std::vector<float> out(n);
  std::size_t at = 0;
  for (std::size_t i0 = 0; i0 < n; i0 += block) {
    const std::size_t m = std::min(block, n - i0);
    const float s = get_f32(&p[at]);
    for (std::size_t i = 0; i < m; ++i) out[i0 + i] = ref_e4m3_value(static_cast<std::uint8_t>(p[at + 4 + i])) * s;
    at += 4 + m;
  }
  return out;
}

struct Kind {
  const char* name;  // "int4" or "fp8"
  std::vector<std::byte> (*encode)(const std::vector<float>&, std::size_t);
  std::vector<float> (*decode)(const std::vector<std::byte>&, std::size_t, std::size_t);
  std::size_t header_stride(std::size_t m) const { return 4 + (is_int4() ? (m + 1) / 2 : m); }
  bool is_int4() const { return std::string(name) == "int4"; }
  // The documented bound of one element's error, from its block's scale s (as in the payload).
  double bound(float x, float s) const {
    const double tiny = 0x1p-148;  // float's own subnormal rounding of the decoded value
    if (is_int4()) return s / 14.0 + 0x1p-21 * s + tiny;
    return 0x1p-4 * std::fabs(static_cast<double>(x)) + 0x1p-9 * s + tiny;
  }
};
const Kind kInt4{"int4", ref_int4_encode, ref_int4_decode};
const Kind kFp8{"fp8", ref_fp8_encode, ref_fp8_decode};

// Each element's block scale, read from a payload.
std::vector<float> scales_of(const Kind& k, const std::vector<std::byte>& p, std::size_t n, std::size_t block) {
  std::vector<float> s(n);
  std::size_t at = 0;
  for (std::size_t i0 = 0; i0 < n; i0 += block) {
    const std::size_t m = std::min(block, n - i0);
    std::fill(s.begin() + static_cast<std::ptrdiff_t>(i0), s.begin() + static_cast<std::ptrdiff_t>(i0 + m),
              get_f32(&p[at]));
    at += k.header_stride(m);
  }
  return s;
}

// Magnitudes from float's subnormals to its largest (regimes change every 37 elements, so blocks mix them), with
// zeros, negative zeros, FLT_MAX, the smallest subnormal, a run of equal values and a run of zeros.
std::vector<float> awkward_data(std::size_t n, std::uint64_t seed) {
  hwtest::Rng rng(seed);
  static const int kExp[] = {-149, -145, -130, -126, -118, -60, -10, 0, 0, 0, 5, 60, 100, 126, 127};
  std::vector<float> x(n);
  int e = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (i % 37 == 0) e = kExp[rng() % std::size(kExp)];
    x[i] = static_cast<float>(std::ldexp((2.0 * rng.unit() - 1.0) * 1.99, e));
    switch (rng() % 64) {
      case 0: x[i] = 0.0f; break;
      case 1: x[i] = -0.0f; break;
      case 2: x[i] = (rng() & 1) ? FLT_MAX : -FLT_MAX; break;
      case 3: x[i] = std::numeric_limits<float>::denorm_min(); break;
      case 4: x[i] = -FLT_MIN; break;
      default: break;
    }
  }
  if (n > 700) {
    std::fill(x.begin() + static_cast<std::ptrdiff_t>(n / 2), x.begin() + static_cast<std::ptrdiff_t>(n / 2 + 300),
              -3.25f);
    std::fill(x.begin() + static_cast<std::ptrdiff_t>(n / 4), x.begin() + static_cast<std::ptrdiff_t>(n / 4 + 300),
              -0.0f);
  }
  return x;
}

std::vector<float> gaussian(std::size_t n, std::uint64_t seed) {
  hwtest::Rng rng(seed);
  std::vector<float> v(n);
  for (auto& x : v) {
    const double u1 = 1.0 - rng.unit(), u2 = rng.unit();
    x = static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  return v;
}

std::string spec_of(const Kind& k, std::size_t block) {
  return std::string(k.name) + ":block=" + std::to_string(block);
}

// ---------------- the rows ----------------

TEST(LowBitCodecs, RowsParametersAndShapes) {
  const auto known = cz::known_codecs();
  const auto at = [&](const char* name) { return std::find(known.begin(), known.end(), name) - known.begin(); };
  EXPECT_EQ(at("int4"), at("int8") + 1);
  EXPECT_EQ(at("fp8"), at("int8") + 2);
  const auto models = cz::codecs_for_models();
  for (const char* name : {"int4", "fp8"})
    EXPECT_NE(std::find(models.begin(), models.end(), name), models.end()) << name;
  EXPECT_EQ(cz::make_codec("int4")->name(), "int4:block=64,ef=0,round=nearest");
  EXPECT_EQ(cz::make_codec("fp8")->name(), "fp8:block=128,ef=0");
  EXPECT_EQ(cz::make_codec("int4:round=stochastic,ef=1,block=5")->name(), "int4:block=5,ef=1,round=stochastic");
  for (const char* spec : {"int4", "fp8", "int4:ef=1,block=7", "fp8:ef=1"}) {
    const auto c = cz::make_codec(spec);
    EXPECT_EQ(c->pattern(), cz::Pattern::kGather) << spec;
    EXPECT_EQ(c->payload_dtype(), hopwise::DataType::kUInt8) << spec;
    EXPECT_EQ(c->payload_alignment(), 1u) << spec;  // scales are read as bytes at any offset
    EXPECT_EQ(c->scale_count(1000), 0u) << spec;    // nothing agreed across ranks
  }
  for (const char* bad : {"int4:block=0", "int4:block=16777217", "int4:round=up", "fp8:block=0", "fp8:round=nearest",
                          "fp8:ef=2", "int4:levels=3"})
    EXPECT_THROW(cz::make_codec(bad), hopwise::InvalidArgument) << bad;
  // Bytes per element: int4 0.5 + 4 / 64, fp8 1 + 4 / 128.
  EXPECT_EQ(cz::make_codec("int4")->payload_bytes(64 * 1000), 36u * 1000);
  EXPECT_EQ(cz::make_codec("fp8")->payload_bytes(128 * 1000), 132u * 1000);
}

TEST(LowBitCodecs, PayloadSizes) {
  for (const Kind* k : {&kInt4, &kFp8})
    for (std::size_t block : {1, 2, 3, 7, 63, 64, 65, 128, 129}) {
      const auto c = cz::make_codec(spec_of(*k, block));
      for (std::size_t n : {0, 1, 2, 3, 7, 63, 64, 65, 127, 128, 129, 1000003}) {
        std::size_t want = 0;
        for (std::size_t i0 = 0; i0 < n; i0 += block) want += k->header_stride(std::min(block, n - i0));
        ASSERT_EQ(c->payload_bytes(n), want) << k->name << " block " << block << " n " << n;
      }
    }
}

// ---------------- bit for bit against the references, and the error bounds ----------------

void check_against_reference(const Kind& k, std::size_t block, const std::vector<float>& x, const char* what) {
  SCOPED_TRACE(::testing::Message() << k.name << " block " << block << " n " << x.size() << " " << what << " "
                                    << note());
  const std::size_t n = x.size();
  const auto c = cz::make_codec(spec_of(k, block));
  CodecState st(5, 0, 1);
  std::vector<std::byte> payload(c->payload_bytes(n) + 1, std::byte{0xab});
  c->encode(x.data(), n, payload.data(), st);
  ASSERT_EQ(payload.back(), std::byte{0xab}) << "wrote past payload_bytes(n)";
  payload.pop_back();
  const auto want = k.encode(x, block);
  ASSERT_EQ(payload.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_EQ(payload[i], want[i]) << "payload byte " << i;

  std::vector<float> out(n, -7.0f);
  c->decode(payload.data(), n, out.data(), st);
  const auto ref = k.decode(want, n, block);
  const auto s = scales_of(k, want, n, block);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(bits_of(out[i]), bits_of(ref[i])) << "decoded element " << i << " x=" << x[i];
    ASSERT_TRUE(std::isfinite(out[i])) << i << " x=" << x[i];
    const double err = std::fabs(static_cast<double>(out[i]) - x[i]);
    ASSERT_LE(err, k.bound(x[i], s[i])) << "element " << i << " x=" << x[i] << " s=" << s[i] << " got " << out[i];
  }
  // decode_add adds onto what is there.
  std::vector<float> acc(n);
  for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<float>(i % 5) - 2.0f;
  const std::vector<float> before = acc;
  c->decode_add(payload.data(), n, acc.data(), st);
  for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(acc[i], before[i] + out[i]) << "decode_add " << i;
}

TEST(LowBitCodecs, MatchTheReferenceOnAwkwardSizesBlocksAndValues) {
  for (const Kind* k : {&kInt4, &kFp8}) {
    for (std::size_t block : {1, 2, 3, 7, 63, 64, 65, 128, 129, 1000}) {
      for (std::size_t n : {0, 1, 2, 3, 7, 63, 64, 65, 127, 128, 129, 1000003}) {
        if (n > 1000 && block != 1 && block != 7 && block != 64 && block != 128) continue;
        check_against_reference(*k, block, awkward_data(n, seed_for({1, n, block})), "awkward");
        check_against_reference(*k, block, gaussian(n, seed_for({2, n, block})), "gaussian");
        if (HasFatalFailure()) return;
      }
    }
    // Large, with the default block.
    const std::size_t large = (std::size_t{1} << 22) + 5;
    check_against_reference(*k, k->is_int4() ? 64 : 128, awkward_data(large, seed_for({3})), "large");
  }
}

TEST(LowBitCodecs, SpecialBlocks) {
  // All equal, all zero (negative zeros too), one huge value among tiny ones, the float extremes.
  const std::vector<std::vector<float>> blocks = {
      std::vector<float>(64, 2.75f),
      std::vector<float>(64, -1e-30f),
      std::vector<float>(64, 0.0f),
      std::vector<float>(64, -0.0f),
      {FLT_MAX, -FLT_MAX, FLT_MAX, 1.0f, -0.0f, 0.0f, 1e-45f, -1e-45f},
      {1e-45f, -1e-45f, 3e-45f, 0.0f, -0.0f, 1e-44f, 2e-38f, -1.1e-38f},
      {1e30f, 1e-30f, -1e-30f, 1.0f, 1e-20f, 0.0f, 7e20f, -3e29f},
  };
  for (const Kind* k : {&kInt4, &kFp8})
    for (const auto& x : blocks) {
      check_against_reference(*k, x.size(), x, "special");
      const auto c = cz::make_codec(spec_of(*k, x.size()));
      CodecState st(1, 0, 1);
      std::vector<std::byte> p(c->payload_bytes(x.size()));
      c->encode(x.data(), x.size(), p.data(), st);
      std::vector<float> out(x.size());
      c->decode(p.data(), x.size(), out.data(), st);
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (x[i] == 0.0f) {
          EXPECT_EQ(out[i], 0.0f) << k->name << " a zero decodes to zero";
        }
        if (block_max(x.data(), x.size()) == 0.0f) {
          EXPECT_EQ(bits_of(out[i]) & 0x7fffffffu, 0u) << k->name << " a zero block decodes to zeros";
        }
      }
      // The block's largest magnitude is kept closely: int4 exactly (7 / 7 * s), fp8 to 2^-23 (the clamp to 448)
      // where its scale is a normal float (a subnormal one is coarser: rounded up, it leaves max / s below 448).
      const std::size_t imax = static_cast<std::size_t>(
          std::max_element(x.begin(), x.end(), [](float a, float b) { return std::fabs(a) < std::fabs(b); }) -
          x.begin());
      if (k->is_int4()) {
        EXPECT_EQ(out[imax], x[imax]) << k->name;
      } else if (std::fabs(x[imax]) / 448.0f >= FLT_MIN) {
        EXPECT_LE(std::fabs(static_cast<double>(out[imax]) - x[imax]), 0x1p-23 * std::fabs(x[imax])) << x[imax];
      }
    }
}

// Every e4m3 code decodes to its value (s = 1), and every code but the NaNs is what encoding that value gives.
TEST(LowBitCodecs, Fp8CodesRoundTrip) {
  const auto c = cz::make_codec("fp8:block=1");
  CodecState st(1, 0, 1);
  for (int code = 0; code < 256; ++code) {
    std::vector<std::byte> p(5);
    const float one = 1.0f;
    std::memcpy(p.data(), &one, 4);
    p[4] = static_cast<std::byte>(code);
    float out = 0;
    c->decode(p.data(), 1, &out, st);
    if ((code & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(out)) << code;
      continue;
    }
    EXPECT_EQ(bits_of(out), bits_of(ref_e4m3_value(static_cast<std::uint8_t>(code)))) << code;
    EXPECT_EQ(ref_e4m3(out), code) << code;
  }
  // Ties go to the even code: halfway between 1 (0x38) and 1.125 (0x39), between 1.125 and 1.25 (0x3a), between
  // the subnormals 2^-9 (0x01) and 2^-8 (0x02), between 7 * 2^-9 (0x07) and 2^-6 (0x08).
  EXPECT_EQ(ref_e4m3(1.0625f), 0x38);
  EXPECT_EQ(ref_e4m3(1.1875f), 0x3a);
  EXPECT_EQ(ref_e4m3(1.5f * 0x1p-9f), 0x02);
  EXPECT_EQ(ref_e4m3(7.5f * 0x1p-9f), 0x08);
  // Through the codec: a block [448 s, v * s] with s = 1 puts v / s = v into e4m3.
  for (const auto& [v, code] : std::vector<std::pair<float, int>>{{1.0625f, 0x38},
                                                                  {1.1875f, 0x3a},
                                                                  {1.5f * 0x1p-9f, 0x02},
                                                                  {7.5f * 0x1p-9f, 0x08},
                                                                  {-0.0f, 0x80},
                                                                  {0x1p-11f, 0x00},
                                                                  {0x1.8p-10f, 0x01},
                                                                  {448.0f, 0x7e},
                                                                  {-448.0f, 0xfe}}) {
    const auto c2 = cz::make_codec("fp8:block=2");
    const float x[2] = {448.0f, v};
    std::vector<std::byte> p(c2->payload_bytes(2));
    c2->encode(x, 2, p.data(), st);
    EXPECT_EQ(get_f32(p.data()), 1.0f);
    EXPECT_EQ(static_cast<int>(p[5]), code) << v;
  }
}

// ---------------- stochastic int4 ----------------

TEST(LowBitCodecs, Int4StochasticIsUnbiasedWithinAStep) {
  const auto sto = cz::make_codec("int4:round=stochastic,block=64");
  const auto near = cz::make_codec("int4:block=64");
  const std::size_t n = 64;
  auto x = gaussian(n, seed_for({4}));
  x[0] = 0.0f;
  x[1] = -0.0f;
  const double s = block_max(x.data(), n);
  const int trials = 4000;
  std::vector<double> mean(n, 0.0), mean_near(n, 0.0);
  for (int t = 0; t < trials; ++t) {
    CodecState st(seed_for({5, static_cast<std::uint64_t>(t)}), t % 3, 3);
    std::vector<std::byte> p(sto->payload_bytes(n));
    std::vector<float> out(n);
    sto->encode(x.data(), n, p.data(), st);
    sto->decode(p.data(), n, out.data(), st);
    for (std::size_t i = 0; i < n; ++i) {
      ASSERT_LT(std::fabs(static_cast<double>(out[i]) - x[i]), s / 7 * (1 + 1e-6)) << i;
      mean[i] += out[i];
    }
    near->encode(x.data(), n, p.data(), st);
    near->decode(p.data(), n, out.data(), st);
    for (std::size_t i = 0; i < n; ++i) mean_near[i] += out[i];
  }
  bool near_passes = true;
  for (std::size_t i = 0; i < n; ++i) {
    const double tol = 5.0 * std::sqrt(std::pow(s / 7, 2) / 4 / trials) + 1e-6 * s;
    EXPECT_NEAR(mean[i] / trials, x[i], tol) << i << " " << note();
    near_passes = near_passes && std::fabs(mean_near[i] / trials - x[i]) <= tol;
  }
  EXPECT_FALSE(near_passes) << "nearest rounding passed the unbiasedness check: is the check able to fail?";
  // The rank and the seed reach the rounding noise.
  auto payload = [&](std::uint64_t seed, int rank) {
    CodecState st(seed, rank, 2);
    std::vector<std::byte> p(sto->payload_bytes(n));
    sto->encode(x.data(), n, p.data(), st);
    return p;
  };
  EXPECT_EQ(payload(7, 0), payload(7, 0));
  EXPECT_NE(payload(7, 0), payload(7, 1));
  EXPECT_NE(payload(7, 0), payload(8, 0));
}

// ---------------- error feedback ----------------

// ef=1: the decoded values of T steps add up to the inputs but for the residual, which is one step's error.
TEST(LowBitCodecs, ErrorFeedbackTracksTheSumOfInputs) {
  const int steps = 40;
  const std::size_t n = 1003;
  for (const char* spec :
       {"int4:ef=1", "int4:ef=1,block=7", "int4:ef=1,round=stochastic", "fp8:ef=1", "fp8:ef=1,block=5"}) {
    SCOPED_TRACE(std::string(spec) + " " + note());
    const Kind& k = std::string(spec).rfind("int4", 0) == 0 ? kInt4 : kFp8;
    const auto c = cz::make_codec(spec);
    const std::size_t block = std::string(spec).find("block=7") != std::string::npos   ? 7
                              : std::string(spec).find("block=5") != std::string::npos ? 5
                              : k.is_int4()                                            ? 64
                                                                                       : 128;
    CodecState st(11, 0, 1);
    std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
    double scale = 0;
    std::vector<std::byte> p(c->payload_bytes(n));
    std::vector<float> out(n);
    for (int t = 0; t < steps; ++t) {
      const auto g = gaussian(n, seed_for({6, static_cast<std::uint64_t>(t)}));
      c->encode(g.data(), n, p.data(), st);
      c->decode(p.data(), n, out.data(), st);
      for (std::size_t i = 0; i < n; ++i) {
        sum_in[i] += g[i];
        sum_out[i] += out[i];
        scale = std::max({scale, std::fabs(static_cast<double>(g[i])), std::fabs(static_cast<double>(out[i]))});
      }
    }
    ASSERT_EQ(st.residual.size(), n);
    const auto s = scales_of(k, p, n, block);
    const bool stochastic = std::string(spec).find("stochastic") != std::string::npos;
    const double slack = 2.0 * steps * 0x1p-23 * scale;
    for (std::size_t i = 0; i < n; ++i) {
      // The residual is the last step's error on residual + gradient = decoded + residual.
      const double r = st.residual[i];
      const double step_error = stochastic ? s[i] / 7.0 + 0x1p-22 * s[i] : k.bound(out[i] + st.residual[i], s[i]);
      ASSERT_LE(std::fabs(r), step_error + slack) << "residual " << i;
      ASSERT_LE(std::fabs(sum_out[i] - sum_in[i]), step_error + slack) << "element " << i;
    }
  }
  // Without feedback the errors pile up instead.
  for (const char* spec : {"int4:ef=0", "fp8:ef=0"}) {
    const auto c = cz::make_codec(spec);
    CodecState st(11, 0, 1);
    std::vector<float> g(n, 0.01f), out(n);
    g[0] = 1.0f;  // 0.01 is below half an int4 step of s = 1 in every step
    std::vector<std::byte> p(c->payload_bytes(n));
    double lost = 0;
    for (int t = 0; t < steps; ++t) {
      c->encode(g.data(), n, p.data(), st);
      c->decode(p.data(), n, out.data(), st);
      lost += g[1] - out[1];
    }
    if (std::string(spec).rfind("int4", 0) == 0) {
      EXPECT_NEAR(lost, steps * 0.01, 1e-6) << spec;
    }
    EXPECT_TRUE(st.residual.empty()) << spec;
  }
}

// ---------------- through the communicator ----------------

// 1..8 in-process ranks all-gather their payloads and add up every rank's decode in rank order: with round=nearest
// that is bit for bit the sum, in rank order, of the references' decodes; and within the sum of the ranks' error
// bounds of the true sum. Two steps, so error feedback's residual plays a part where it is on.
TEST(LowBitCodecs, CompressedAllreduceMatchesTheReferenceSum) {
  for (const char* spec : {"int4", "int4:block=7", "fp8", "fp8:block=1", "fp8:block=129"}) {
    const std::string sp = spec;
    const Kind& k = sp.rfind("int4", 0) == 0 ? kInt4 : kFp8;
    const std::size_t block = sp.find("block=7") != std::string::npos     ? 7
                              : sp.find("block=129") != std::string::npos ? 129
                              : sp.find("block=1") != std::string::npos   ? 1
                              : k.is_int4()                               ? 64
                                                                          : 128;
    const auto codec = cz::make_codec(spec);
    for (int p = 1; p <= 8; ++p) {
      for (std::size_t n : {0, 1, 2, 63, 129, 4099, 100003}) {
        SCOPED_TRACE(::testing::Message() << spec << ", " << p << " ranks, n=" << n << ", " << note());
        std::vector<std::vector<float>> x(static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r)
          x[static_cast<std::size_t>(r)] = r % 2 ? gaussian(n, seed_for({7, n, static_cast<std::uint64_t>(r)}))
                                                 : awkward_data(n, seed_for({8, n, static_cast<std::uint64_t>(r)}));
        // The reference: each rank's reference payload decoded, summed in rank order in float.
        std::vector<float> want(n, 0.0f);
        std::vector<double> truth(n, 0.0), mag(n, 0.0), bound(n, 0.0);
        for (int r = 0; r < p; ++r) {
          const auto& xr = x[static_cast<std::size_t>(r)];
          const auto pay = k.encode(xr, block);
          const auto d = k.decode(pay, n, block);
          const auto s = scales_of(k, pay, n, block);
          for (std::size_t i = 0; i < n; ++i) {
            want[i] = r == 0 ? d[i] : want[i] + d[i];
            truth[i] += xr[i];
            mag[i] += std::fabs(static_cast<double>(xr[i]));
            bound[i] += k.bound(xr[i], s[i]);
          }
        }
        Group g(p, test_options());
        std::vector<std::vector<float>> outs(static_cast<std::size_t>(p), std::vector<float>(n));
        std::vector<std::uint64_t> wire(static_cast<std::size_t>(p));
        const std::string err = g.run([&](int r, hopwise::comm::Communicator& c) {
          CodecState st(99, r, p);
          c.allreduce_compressed(x[static_cast<std::size_t>(r)].data(), outs[static_cast<std::size_t>(r)].data(), n,
                                 *codec, st);
          wire[static_cast<std::size_t>(r)] = c.stats().wire_bytes;
        });
        ASSERT_EQ(err, "");
        for (int r = 0; r < p; ++r)
          for (std::size_t i = 0; i < n; ++i) {
            const float got = outs[static_cast<std::size_t>(r)][i];
            if (std::isnan(got) && std::isnan(want[i])) continue;  // inf - inf: NaN bits are not the point
            ASSERT_EQ(bits_of(got), bits_of(want[i])) << "rank " << r << " element " << i;
          }
        for (std::size_t i = 0; i < n; ++i) {
          // The float sum of p decoded values adds p roundings of partial sums; huge ones may overflow to inf.
          if (!std::isfinite(want[i]) || mag[i] > 1e38) continue;
          ASSERT_LE(std::fabs(want[i] - truth[i]), bound[i] + p * 0x1p-23 * mag[i] + 1e-37) << i;
        }
        if (n > 0) {
          EXPECT_EQ(wire[0], codec->payload_bytes(n)) << "the payload's bytes on the wire";
        }
      }
    }
  }
}

// Stochastic rounding and error feedback through the communicator: every rank ends with the same bits, and those are
// the serial run of the same codec states (each rank's encode, every payload's decode added in rank order).
TEST(LowBitCodecs, CompressedAllreduceStochasticAndFeedbackMatchTheSerialRun) {
  for (const char* spec : {"int4:round=stochastic", "int4:ef=1,round=stochastic,block=9", "fp8:ef=1,block=33"}) {
    const auto codec = cz::make_codec(spec);
    for (int p : {1, 2, 3, 5, 8}) {
      const std::size_t n = 4099;
      const int steps = 3;
      SCOPED_TRACE(::testing::Message() << spec << ", " << p << " ranks, " << note());
      auto input = [&](int step, int r) {
        return gaussian(n, seed_for({9, static_cast<std::uint64_t>(step), static_cast<std::uint64_t>(r)}));
      };
      std::vector<CodecState> st;
      for (int r = 0; r < p; ++r) st.emplace_back(1234, r, p);
      std::vector<float> want(n);
      for (int step = 0; step < steps; ++step) {
        std::vector<std::vector<std::byte>> pay(static_cast<std::size_t>(p));
        for (int r = 0; r < p; ++r) {
          const auto x = input(step, r);
          pay[static_cast<std::size_t>(r)].resize(codec->payload_bytes(n));
          codec->encode(x.data(), n, pay[static_cast<std::size_t>(r)].data(), st[static_cast<std::size_t>(r)]);
        }
        codec->decode(pay[0].data(), n, want.data(), st[0]);
        for (int r = 1; r < p; ++r)
          codec->decode_add(pay[static_cast<std::size_t>(r)].data(), n, want.data(), st[static_cast<std::size_t>(r)]);
      }
      Group g(p, test_options());
      std::vector<std::vector<float>> outs(static_cast<std::size_t>(p), std::vector<float>(n));
      const std::string err = g.run([&](int r, hopwise::comm::Communicator& c) {
        CodecState s(1234, r, p);
        for (int step = 0; step < steps; ++step) {
          const auto x = input(step, r);
          c.allreduce_compressed(x.data(), outs[static_cast<std::size_t>(r)].data(), n, *codec, s);
        }
      });
      ASSERT_EQ(err, "");
      for (int r = 0; r < p; ++r) ASSERT_EQ(outs[static_cast<std::size_t>(r)], want) << "rank " << r;
    }
  }
}

}  // namespace
