// hopwise::common: dtypes and ops, env knobs, float16/bfloat16 conversions and the reduction kernels.
// ctest runs this binary once per HOPWISE_ISA (generic, avx2, avx512): the kernel set is picked once per process.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "collective_reference.h"

#include <fmt/core.h>

#include "hopwise/common/dtype.h"
#include "hopwise/common/env.h"
#include "hopwise/common/error.h"
#include "hopwise/common/half.h"
#include "hopwise/common/log.h"
#include "hopwise/common/reduce.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace {

using hopwise::DataType;
using hopwise::ReduceOp;

std::uint64_t test_seed() { return hwtest::base_seed(); }
std::string seed_note() { return hwtest::seed_note(test_seed()); }

using hwtest::message_of;

#if defined(__x86_64__)
// F16C from CPUID leaf 1 (ECX bit 29): clang before 15 does not know "f16c" as a __builtin_cpu_supports feature.
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

// ======================================================================================== dtype and ops
// A warning while a progress bar's line is open (on stdout, no newline yet) ends that line first, once, and goes
// on stdout after it: on stderr, a launcher forwarding the two streams apart (mpirun) put it inside the bar.
TEST(Log, AWarningStartsALineOfItsOwnAfterAnOpenProgressBar) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  std::fputs("\repoch 1/1 [####......] 40%", stdout);
  hopwise::log::set_console_line_open(true);
  hopwise::log::write(hopwise::log::Level::kWarn, "first");
  hopwise::log::write(hopwise::log::Level::kWarn, "second");
  hopwise::log::end_console_line();  // nothing open any more: a no-op
  std::fflush(stdout);
  const std::string out = testing::internal::GetCapturedStdout();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(out, "\repoch 1/1 [####......] 40%\nhopwise WARN: first\nhopwise WARN: second\n");
  EXPECT_EQ(err, "");
  EXPECT_FALSE(hopwise::log::console_line_open());
}

TEST(DType, SizesAndFloating) {
  EXPECT_EQ(hopwise::dtype_size(DataType::kFloat32), 4u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kFloat64), 8u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kFloat16), 2u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kBFloat16), 2u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kInt32), 4u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kInt64), 8u);
  EXPECT_EQ(hopwise::dtype_size(DataType::kUInt8), 1u);
  EXPECT_TRUE(hopwise::is_floating(DataType::kFloat32));
  EXPECT_TRUE(hopwise::is_floating(DataType::kFloat64));
  EXPECT_TRUE(hopwise::is_floating(DataType::kFloat16));
  EXPECT_TRUE(hopwise::is_floating(DataType::kBFloat16));
  EXPECT_FALSE(hopwise::is_floating(DataType::kInt32));
  EXPECT_FALSE(hopwise::is_floating(DataType::kInt64));
  EXPECT_FALSE(hopwise::is_floating(DataType::kUInt8));
  EXPECT_THROW(hopwise::dtype_size(static_cast<DataType>(99)), hopwise::InvalidArgument);
}

TEST(DType, NamesRoundTrip) {
  EXPECT_EQ(hopwise::to_string(DataType::kFloat32), "float32");
  EXPECT_EQ(hopwise::to_string(DataType::kFloat64), "float64");
  EXPECT_EQ(hopwise::to_string(DataType::kFloat16), "float16");
  EXPECT_EQ(hopwise::to_string(DataType::kBFloat16), "bfloat16");
  EXPECT_EQ(hopwise::to_string(DataType::kInt32), "int32");
  EXPECT_EQ(hopwise::to_string(DataType::kInt64), "int64");
  EXPECT_EQ(hopwise::to_string(DataType::kUInt8), "uint8");
  for (DataType dt : hopwise::kAllDataTypes) EXPECT_EQ(hopwise::parse_dtype(hopwise::to_string(dt)), dt);
  EXPECT_EQ(hopwise::to_string(ReduceOp::kSum), "sum");
  EXPECT_EQ(hopwise::to_string(ReduceOp::kAvg), "avg");
  EXPECT_EQ(hopwise::to_string(ReduceOp::kMin), "min");
  EXPECT_EQ(hopwise::to_string(ReduceOp::kMax), "max");
  EXPECT_EQ(hopwise::to_string(ReduceOp::kProd), "prod");
  for (ReduceOp op : hopwise::kAllReduceOps) EXPECT_EQ(hopwise::parse_reduce_op(hopwise::to_string(op)), op);
}

TEST(DType, ParseAliases) {
  EXPECT_EQ(hopwise::parse_dtype("float"), DataType::kFloat32);
  EXPECT_EQ(hopwise::parse_dtype("f32"), DataType::kFloat32);
  EXPECT_EQ(hopwise::parse_dtype("double"), DataType::kFloat64);
  EXPECT_EQ(hopwise::parse_dtype("half"), DataType::kFloat16);
  EXPECT_EQ(hopwise::parse_dtype("fp16"), DataType::kFloat16);
  EXPECT_EQ(hopwise::parse_dtype("bf16"), DataType::kBFloat16);
  EXPECT_EQ(hopwise::parse_dtype("i32"), DataType::kInt32);
  EXPECT_EQ(hopwise::parse_dtype("int64"), DataType::kInt64);
  EXPECT_EQ(hopwise::parse_dtype("u8"), DataType::kUInt8);
  EXPECT_EQ(hopwise::parse_reduce_op("mean"), ReduceOp::kAvg);
}

TEST(DType, ParseRejectsUnknownNamesAndListsChoices) {
  for (const char* bad : {"", "float8", "Float32", "int16", " float32"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW(hopwise::parse_dtype(bad), hopwise::InvalidArgument);
  }
  const std::string m = message_of([] { hopwise::parse_dtype("float8"); });
  EXPECT_NE(m.find("float8"), std::string::npos) << m;
  EXPECT_NE(m.find("bfloat16"), std::string::npos) << m;  // lists the choices
  EXPECT_THROW(hopwise::parse_reduce_op("average"), hopwise::InvalidArgument);
  const std::string m2 = message_of([] { hopwise::parse_reduce_op("median"); });
  EXPECT_NE(m2.find("median"), std::string::npos) << m2;
  EXPECT_NE(m2.find("prod"), std::string::npos) << m2;
}

TEST(DType, CheckOpSupported) {
  for (DataType dt : hopwise::kAllDataTypes)
    for (ReduceOp op : hopwise::kAllReduceOps) {
      SCOPED_TRACE(std::string(hopwise::to_string(dt)) + " " + std::string(hopwise::to_string(op)));
      if (op == ReduceOp::kAvg && !hopwise::is_floating(dt))
        EXPECT_THROW(hopwise::check_op_supported(dt, op), hopwise::InvalidArgument);
      else
        EXPECT_NO_THROW(hopwise::check_op_supported(dt, op));
    }
  const std::string m = message_of([] { hopwise::check_op_supported(DataType::kInt32, ReduceOp::kAvg); });
  EXPECT_NE(m.find("avg"), std::string::npos) << m;
  EXPECT_NE(m.find("int32"), std::string::npos) << m;
  EXPECT_THROW(hopwise::check_op_supported(static_cast<DataType>(42), ReduceOp::kSum), hopwise::InvalidArgument);
  EXPECT_THROW(hopwise::check_op_supported(DataType::kFloat32, static_cast<ReduceOp>(42)), hopwise::InvalidArgument);
}

TEST(DType, CheckedBytes) {
  EXPECT_EQ(hopwise::checked_bytes(0, DataType::kFloat64, "t"), 0u);
  EXPECT_EQ(hopwise::checked_bytes(1000, DataType::kFloat64, "t"), 8000u);
  EXPECT_EQ(hopwise::checked_bytes(1000003, DataType::kFloat16, "t"), 2000006u);
  EXPECT_EQ(hopwise::checked_bytes(std::size_t{1} << 40, DataType::kInt64, "t"), std::size_t{1} << 43);
  constexpr std::size_t kMax = std::numeric_limits<std::size_t>::max();
  for (DataType dt : hopwise::kAllDataTypes) {
    SCOPED_TRACE(hopwise::to_string(dt));
    EXPECT_THROW(hopwise::checked_bytes(kMax, dt, "t"), hopwise::InvalidArgument);
  }
  // Counts whose byte size wraps around size_t.
  EXPECT_THROW(hopwise::checked_bytes(kMax / 4 + 1, DataType::kFloat32, "t"), hopwise::InvalidArgument);
  EXPECT_THROW(hopwise::checked_bytes(kMax / 8 + 1, DataType::kFloat64, "t"), hopwise::InvalidArgument);
  EXPECT_THROW(hopwise::checked_bytes(kMax / 2 + 1, DataType::kFloat16, "t"), hopwise::InvalidArgument);
  const std::string m = message_of([] { hopwise::checked_bytes(~std::size_t{0}, DataType::kFloat32, "my_call"); });
  EXPECT_NE(m.find("my_call"), std::string::npos) << m;
}

// ======================================================================================== env
TEST(Env, ListContainsAWordInAnyCaseAndSeparator) {
  ::setenv("HOPWISE_TEST_ENV_LIST", "info; Check,trace", 1);
  EXPECT_TRUE(hopwise::env::list_contains("HOPWISE_TEST_ENV_LIST", "CHECK"));
  EXPECT_TRUE(hopwise::env::list_contains("HOPWISE_TEST_ENV_LIST", "INFO"));
  EXPECT_TRUE(hopwise::env::list_contains("HOPWISE_TEST_ENV_LIST", "trace"));
  EXPECT_FALSE(hopwise::env::list_contains("HOPWISE_TEST_ENV_LIST", "CHE"));
  EXPECT_FALSE(hopwise::env::list_contains("HOPWISE_TEST_ENV_UNSET_LIST", "CHECK"));
  ::unsetenv("HOPWISE_TEST_ENV_LIST");
}

TEST(Env, ParseSize) {
  EXPECT_EQ(hopwise::env::parse_size("0", "X"), 0u);
  EXPECT_EQ(hopwise::env::parse_size("123", "X"), 123u);
  EXPECT_EQ(hopwise::env::parse_size("4K", "X"), 4096u);
  EXPECT_EQ(hopwise::env::parse_size("4k", "X"), 4096u);
  EXPECT_EQ(hopwise::env::parse_size("64M", "X"), 64u << 20);
  EXPECT_EQ(hopwise::env::parse_size("1G", "X"), std::size_t{1} << 30);
  EXPECT_EQ(hopwise::env::parse_size("3g", "X"), std::size_t{3} << 30);
  EXPECT_EQ(hopwise::env::parse_size("4KB", "X"), 4096u);
  EXPECT_EQ(hopwise::env::parse_size("4KiB", "X"), 4096u);
}

TEST(Env, ParseSizeRejectsMalformed) {
  for (const char* bad :
       {"", "K", "abc", "-1", "4X", "4KQ", "4 K", "4K ", "1.5M", "0x10", "4MBB", "99999999999999999999"}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    EXPECT_THROW(hopwise::env::parse_size(bad, "HOPWISE_SOMETHING"), hopwise::InvalidArgument);
    EXPECT_NE(message_of([&] { hopwise::env::parse_size(bad, "HOPWISE_SOMETHING"); }).find("HOPWISE_SOMETHING"),
              std::string::npos);
  }
}

// A size whose byte count does not fit size_t must be rejected, not wrapped around (2^34 G = 2^64 bytes).
TEST(Env, ParseSizeRejectsOverflow) {
  for (const char* big : {"17179869184G", "17179869185G", "18446744073709551615K", "18014398509481984M"}) {
    SCOPED_TRACE(big);
    std::size_t got = 0;
    EXPECT_THROW(got = hopwise::env::parse_size(big, "HOPWISE_CHUNK_BYTES"), hopwise::InvalidArgument)
        << "parsed as " << got;
  }
}

TEST(Env, GetAndNumbers) {
  ::setenv("HOPWISE_TEST_ENV_A", "2.5", 1);
  ::setenv("HOPWISE_TEST_ENV_B", "-17", 1);
  ::setenv("HOPWISE_TEST_ENV_C", "12abc", 1);
  ::setenv("HOPWISE_TEST_ENV_EMPTY", "", 1);
  ::unsetenv("HOPWISE_TEST_ENV_UNSET");
  EXPECT_EQ(hopwise::env::get("HOPWISE_TEST_ENV_A").value_or("?"), "2.5");
  EXPECT_FALSE(hopwise::env::get("HOPWISE_TEST_ENV_UNSET").has_value());
  EXPECT_FALSE(hopwise::env::get("HOPWISE_TEST_ENV_EMPTY").has_value());
  EXPECT_EQ(hopwise::env::get_or("HOPWISE_TEST_ENV_UNSET", "dflt"), "dflt");
  EXPECT_EQ(hopwise::env::get_or("HOPWISE_TEST_ENV_B", "dflt"), "-17");
  EXPECT_DOUBLE_EQ(hopwise::env::get_double("HOPWISE_TEST_ENV_A", 1.0), 2.5);
  EXPECT_DOUBLE_EQ(hopwise::env::get_double("HOPWISE_TEST_ENV_UNSET", 1.25), 1.25);
  EXPECT_EQ(hopwise::env::get_int("HOPWISE_TEST_ENV_B", 3), -17);
  EXPECT_EQ(hopwise::env::get_int("HOPWISE_TEST_ENV_UNSET", 3), 3);
  EXPECT_THROW(hopwise::env::get_int("HOPWISE_TEST_ENV_A", 3), hopwise::InvalidArgument);
  EXPECT_THROW(hopwise::env::get_int("HOPWISE_TEST_ENV_C", 3), hopwise::InvalidArgument);
  EXPECT_THROW(hopwise::env::get_double("HOPWISE_TEST_ENV_C", 3), hopwise::InvalidArgument);
  const std::string m = message_of([] { hopwise::env::get_int("HOPWISE_TEST_ENV_C", 3); });
  EXPECT_NE(m.find("HOPWISE_TEST_ENV_C"), std::string::npos) << m;
}

// ======================================================================================== float16 / bfloat16
float f32(std::uint32_t bits) { return hopwise::bits_to_float(bits); }

TEST(Half, Fp16KnownValues) {
  using hopwise::float_to_fp16;
  using hopwise::fp16_to_float;
  EXPECT_EQ(float_to_fp16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_fp16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(0.5f), 0x3800);
  EXPECT_EQ(float_to_fp16(0.1f), 0x2e66);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);  // largest finite
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);  // below the midpoint to 2^16
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);  // the midpoint rounds to even: infinity
  EXPECT_EQ(float_to_fp16(1.0e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16(-1.0e6f), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);     // tie between 0 and 2^-24: even (0)
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);     // tie between 1 and 2 quanta: even (2)
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(-std::ldexp(1.0f, -26)), 0x8000);        // underflow keeps the sign
  EXPECT_EQ(float_to_fp16(std::ldexp(2047.0f, -25)), 0x0400);      // rounds up from subnormal into the normals
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: even
  EXPECT_EQ(float_to_fp16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: even (up)
  EXPECT_EQ(float_to_fp16(2049.0f), 0x6800);                       // 2048 (tie, even)
  EXPECT_EQ(float_to_fp16(2051.0f), 0x6802);                       // 2052 (tie, even)
  const std::uint16_t n = float_to_fp16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(n & 0x7c00, 0x7c00);
  EXPECT_NE(n & 0x03ff, 0);
  const std::uint16_t sn = float_to_fp16(f32(0x7f800001u));  // NaN whose payload lies below fp16's mantissa
  EXPECT_EQ(sn & 0x7c00, 0x7c00);
  EXPECT_NE(sn & 0x03ff, 0) << "a NaN must not turn into infinity";

  EXPECT_EQ(fp16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_float(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(fp16_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(fp16_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(fp16_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isinf(fp16_to_float(0x7c00)) && fp16_to_float(0x7c00) > 0);
  EXPECT_TRUE(std::isinf(fp16_to_float(0xfc00)) && fp16_to_float(0xfc00) < 0);
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7e00)));
  EXPECT_TRUE(std::isnan(fp16_to_float(0x7c01)));
  EXPECT_TRUE(std::signbit(fp16_to_float(0x8000)));
  EXPECT_EQ(fp16_to_float(0x8000), 0.0f);
}

TEST(Half, Bf16KnownValues) {
  using hopwise::bf16_to_float;
  using hopwise::float_to_bf16;
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie: even
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // tie: even (up)
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to infinity
  EXPECT_EQ(float_to_bf16(f32(0x7f7f7fffu)), 0x7f7f);                   // just below the midpoint
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(float_to_bf16(f32(0x00010000u)), 0x0001);  // subnormals are kept
  const std::uint16_t sn = float_to_bf16(f32(0x7f800001u));
  EXPECT_EQ(sn & 0x7f80, 0x7f80);
  EXPECT_NE(sn & 0x007f, 0) << "a NaN must not turn into infinity";
  const std::uint16_t nn = float_to_bf16(f32(0xffffffffu));
  EXPECT_EQ(nn & 0x7f80, 0x7f80);
  EXPECT_NE(nn & 0x007f, 0);
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isinf(bf16_to_float(0x7f80)));
  EXPECT_TRUE(std::isnan(bf16_to_float(0x7fc0)));
}

TEST(Half, EveryFp16AndBf16RoundTrips) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto b = static_cast<std::uint16_t>(h);
    const float f = hopwise::fp16_to_float(b);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(hopwise::fp16_to_float(hopwise::float_to_fp16(f)))) << std::hex << h;
    } else {
      ASSERT_EQ(hopwise::float_to_fp16(f), b) << "fp16 0x" << std::hex << h;
    }
    const float g = hopwise::bf16_to_float(b);
    if (std::isnan(g)) {
      EXPECT_TRUE(std::isnan(hopwise::bf16_to_float(hopwise::float_to_bf16(g)))) << std::hex << h;
    } else {
      ASSERT_EQ(hopwise::float_to_bf16(g), b) << "bf16 0x" << std::hex << h;
    }
  }
}

// Round to nearest, ties to even, by search among all finite values of the format: an independent reference.
class NearestTable {
 public:
  // finite_max_bits: the largest finite positive encoding; inf_bits/inf_value: the next (virtual) step.
  NearestTable(float (*decode)(std::uint16_t), std::uint16_t finite_max_bits, std::uint16_t inf_bits,
               double inf_value) {
    for (std::uint32_t b = 0; b <= finite_max_bits; ++b) {
      values_.push_back(decode(static_cast<std::uint16_t>(b)));
      bits_.push_back(static_cast<std::uint16_t>(b));
    }
    values_.push_back(inf_value);
    bits_.push_back(inf_bits);
    inf_bits_ = inf_bits;
  }
  std::uint16_t round(float f) const {
    const std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(f));
    if (std::isinf(f) || a >= values_.back()) return sign | inf_bits_;
    const auto it = std::upper_bound(values_.begin(), values_.end(), a);
    const std::size_t hi = static_cast<std::size_t>(it - values_.begin()), lo = hi - 1;
    if (a == values_[lo]) return sign | bits_[lo];
    const double dl = a - values_[lo], dh = values_[hi] - a;
    if (dl < dh) return sign | bits_[lo];
    if (dh < dl) return sign | bits_[hi];
    return sign | ((bits_[lo] & 1) == 0 ? bits_[lo] : bits_[hi]);
  }
  const std::vector<double>& values() const { return values_; }

 private:
  std::vector<double> values_;
  std::vector<std::uint16_t> bits_;
  std::uint16_t inf_bits_ = 0;
};

float fp16_decode(std::uint16_t h) { return hopwise::fp16_to_float(h); }
float bf16_decode(std::uint16_t h) { return hopwise::bf16_to_float(h); }

// Floats worth converting: every midpoint between neighbours and one float ulp either side, plus random floats.
std::vector<float> conversion_probes(const std::vector<double>& values, std::mt19937_64& rng) {
  std::vector<float> probes;
  for (std::size_t i = 0; i + 1 < values.size(); ++i) {
    const auto mid = static_cast<float>((values[i] + values[i + 1]) / 2);  // exact: one more bit than the format
    probes.push_back(mid);
    probes.push_back(std::nextafter(mid, 0.0f));
    probes.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
    probes.push_back(std::nextafter(static_cast<float>(values[i]), std::numeric_limits<float>::infinity()));
  }
  for (int i = 0; i < 1000000; ++i) {
    probes.push_back(f32(static_cast<std::uint32_t>(rng())));  // any float
    probes.push_back(
        static_cast<float>(std::ldexp(static_cast<double>(rng() >> 11) * 0x1p-53, static_cast<int>(rng() % 60) - 40)));
  }
  std::vector<float> with_signs;
  for (float p : probes) {
    with_signs.push_back(p);
    with_signs.push_back(-p);
  }
  return with_signs;
}

TEST(Half, Fp16RoundsToNearestEven) {
  SCOPED_TRACE(seed_note());
  std::mt19937_64 rng(test_seed());
  const NearestTable table(fp16_decode, 0x7bff, 0x7c00, 65536.0);
  std::size_t bad = 0;
  for (float f : conversion_probes(table.values(), rng)) {
    if (std::isnan(f)) continue;
    const std::uint16_t got = hopwise::float_to_fp16(f), want = table.round(f);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << "float_to_fp16(" << f << " = 0x" << std::hex << hopwise::float_to_bits(f) << ") = 0x" << got
                    << ", expected 0x" << want;
  }
  EXPECT_EQ(bad, 0u);
}

TEST(Half, Bf16RoundsToNearestEven) {
  SCOPED_TRACE(seed_note());
  std::mt19937_64 rng(test_seed() + 1);
  const NearestTable table(bf16_decode, 0x7f7f, 0x7f80, std::ldexp(1.0, 128));
  std::size_t bad = 0;
  for (float f : conversion_probes(table.values(), rng)) {
    if (std::isnan(f)) {
      const std::uint16_t got = hopwise::float_to_bf16(f);
      if (!std::isnan(hopwise::bf16_to_float(got)) && bad++ < 10) ADD_FAILURE() << "NaN became 0x" << std::hex << got;
      continue;
    }
    const std::uint16_t got = hopwise::float_to_bf16(f), want = table.round(f);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << "float_to_bf16(" << f << " = 0x" << std::hex << hopwise::float_to_bits(f) << ") = 0x" << got
                    << ", expected 0x" << want;
  }
  EXPECT_EQ(bad, 0u);
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) std::uint16_t hw_float_to_fp16(float f) {
  return static_cast<std::uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float hw_fp16_to_float(std::uint16_t h) { return _cvtsh_ss(h); }

// The software conversion agrees with the F16C instructions that the vector kernels use.
TEST(Half, Fp16MatchesF16C) {
  if (!cpu_has_f16c()) GTEST_SKIP() << "no F16C on this CPU";
  SCOPED_TRACE(seed_note());
  std::mt19937_64 rng(test_seed() + 2);
  std::size_t bad = 0;
  for (int i = 0; i < 4000000; ++i) {
    const float f = f32(static_cast<std::uint32_t>(rng()));
    if (std::isnan(f)) continue;
    if (hopwise::float_to_fp16(f) != hw_float_to_fp16(f) && bad++ < 10)
      ADD_FAILURE() << std::hex << "float 0x" << hopwise::float_to_bits(f) << ": software 0x"
                    << hopwise::float_to_fp16(f) << ", F16C 0x" << hw_float_to_fp16(f);
  }
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float s = hopwise::fp16_to_float(static_cast<std::uint16_t>(h)),
                w = hw_fp16_to_float(static_cast<std::uint16_t>(h));
    if (std::isnan(w)) {
      EXPECT_TRUE(std::isnan(s)) << std::hex << h;
    } else if (hopwise::float_to_bits(s) != hopwise::float_to_bits(w) && bad++ < 10) {
      ADD_FAILURE() << std::hex << "fp16 0x" << h << ": software " << s << ", F16C " << w;
    }
  }
  EXPECT_EQ(bad, 0u);
}
#endif

// ======================================================================================== reduction kernels
TEST(Reduce, ActiveIsaHonoursTheCap) {
  const std::string isa(hopwise::active_isa());
  const char* cap_env = std::getenv("HOPWISE_ISA");
  const std::string cap = cap_env != nullptr && *cap_env != '\0' ? cap_env : "avx512";
  std::printf("[ INFO     ] HOPWISE_ISA=%s, active kernel set: %s\n", cap.c_str(), isa.c_str());
  ASSERT_TRUE(isa == "generic" || isa == "avx2" || isa == "avx512") << isa;
  if (cap == "generic") {
    EXPECT_EQ(isa, "generic");
  }
  if (cap == "avx2") {
    EXPECT_NE(isa, "avx512");
  }
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool has_avx2 = __builtin_cpu_supports("avx2") && cpu_has_f16c() && __builtin_cpu_supports("fma");
  const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  if (cap == "avx512" && has_avx512) {
    EXPECT_EQ(isa, "avx512");
  }
  if (cap == "avx512" && !has_avx512 && has_avx2) {
    EXPECT_EQ(isa, "avx2");
  }
  if (cap == "avx2" && has_avx2) {
    EXPECT_EQ(isa, "avx2");
  }
  if (isa == "avx512") {
    EXPECT_TRUE(has_avx512);
  }
  if (isa == "avx2") {
    EXPECT_TRUE(has_avx2);
  }
#endif
}

// Random inputs for the kernels: every bit pattern for the 16-bit floats, and for float32/float64 a mix of
// specials (NaN, infinities, zeros, subnormals, extremes), values in [-4, 4] and arbitrary bit patterns.
void fill_kernel_input(DataType dt, void* p, std::size_t n, std::mt19937_64& rng) {
  auto* b = static_cast<unsigned char*>(p);
  switch (dt) {
    case DataType::kFloat32:
    case DataType::kFloat64: {
      const bool f = dt == DataType::kFloat32;
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint64_t r = rng();
        double v;
        switch (r & 7) {
          case 0: {
            static const double special[] = {
                std::numeric_limits<double>::quiet_NaN(),
                -std::numeric_limits<double>::quiet_NaN(),
                std::numeric_limits<double>::infinity(),
                -std::numeric_limits<double>::infinity(),
                0.0,
                -0.0,
                f ? std::numeric_limits<float>::max() : std::numeric_limits<double>::max(),
                f ? std::numeric_limits<float>::denorm_min() : std::numeric_limits<double>::denorm_min(),
                f ? -std::numeric_limits<float>::min() : -std::numeric_limits<double>::min(),
                1.0,
                -1.0};
            v = special[(r >> 3) % (sizeof special / sizeof special[0])];
            break;
          }
          case 1:
            if (f) {
              const float x = f32(static_cast<std::uint32_t>(r >> 8));
              std::memcpy(b + 4 * i, &x, 4);
            } else {
              const std::uint64_t x = rng();
              std::memcpy(b + 8 * i, &x, 8);
            }
            continue;
          default: v = std::ldexp(static_cast<double>(r >> 11) * 0x1p-53 - 0.5, 3); break;
        }
        if (f) {
          const float x = static_cast<float>(v);
          std::memcpy(b + 4 * i, &x, 4);
        } else {
          std::memcpy(b + 8 * i, &v, 8);
        }
      }
      return;
    }
    default: {
      const std::size_t bytes = n * hopwise::dtype_size(dt);
      for (std::size_t i = 0; i < bytes; ++i) b[i] = static_cast<unsigned char>(rng() >> 17);
      return;
    }
  }
}

template <class T>
T ref_combine(ReduceOp op, T x, T y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return x + y;
    case ReduceOp::kProd: return x * y;
    case ReduceOp::kMin: return y < x ? y : x;
    case ReduceOp::kMax: return x < y ? y : x;
  }
  return x;
}

std::string fmt_float(double x, double y, double got, double want) {
  return fmt::format("a={:.9g} b={:.9g} got={:.9g} expected={:.9g}", x, y, got, want);
}
std::string hex(std::uint16_t v) { return fmt::format("0x{:04x}", v); }

// Checks one element: true when `got` is right for a op b.
bool check_element(DataType dt, ReduceOp op, const unsigned char* a, const unsigned char* b, const unsigned char* got,
                   std::size_t i, std::string* why) {
  const bool minmax = op == ReduceOp::kMin || op == ReduceOp::kMax;
  auto float_like = [&](double x, double y, double ref, double g, std::uint64_t ref_bits, std::uint64_t g_bits) {
    if (std::isnan(x) || std::isnan(y)) {
      // NaN in: sum/prod give NaN; min/max may return either operand (the order decides), or NaN.
      if (!minmax) return std::isnan(g);
      return std::isnan(g) || g == x || g == y;
    }
    if (std::isnan(ref)) return std::isnan(g);  // inf - inf, 0 * inf
    if (minmax) return g == ref;                // +0 and -0 compare equal either way round
    return g_bits == ref_bits;                  // one rounding, bit for bit
  };
  bool ok = true;
  std::string detail;
  switch (dt) {
    case DataType::kFloat32: {
      float x, y, g;
      std::memcpy(&x, a + 4 * i, 4);
      std::memcpy(&y, b + 4 * i, 4);
      std::memcpy(&g, got + 4 * i, 4);
      const float r = ref_combine(op, x, y);
      ok = float_like(x, y, r, g, hopwise::float_to_bits(r), hopwise::float_to_bits(g));
      if (!ok) detail = fmt_float(x, y, g, r);
      break;
    }
    case DataType::kFloat64: {
      double x, y, g;
      std::memcpy(&x, a + 8 * i, 8);
      std::memcpy(&y, b + 8 * i, 8);
      std::memcpy(&g, got + 8 * i, 8);
      const double r = ref_combine(op, x, y);
      std::uint64_t rb, gb;
      std::memcpy(&rb, &r, 8);
      std::memcpy(&gb, &g, 8);
      ok = float_like(x, y, r, g, rb, gb);
      if (!ok) detail = fmt_float(x, y, g, r);
      break;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const bool h = dt == DataType::kFloat16;
      std::uint16_t xa, yb, gg;
      std::memcpy(&xa, a + 2 * i, 2);
      std::memcpy(&yb, b + 2 * i, 2);
      std::memcpy(&gg, got + 2 * i, 2);
      const float x = h ? hopwise::fp16_to_float(xa) : hopwise::bf16_to_float(xa);
      const float y = h ? hopwise::fp16_to_float(yb) : hopwise::bf16_to_float(yb);
      const float rf = ref_combine(op, x, y);  // float32 per element, then rounded once
      const std::uint16_t rb = h ? hopwise::float_to_fp16(rf) : hopwise::float_to_bf16(rf);
      const float r = h ? hopwise::fp16_to_float(rb) : hopwise::bf16_to_float(rb);
      const float g = h ? hopwise::fp16_to_float(gg) : hopwise::bf16_to_float(gg);
      ok = float_like(x, y, std::isnan(rf) ? rf : r, g, rb, gg);
      if (!ok)
        detail =
            fmt_float(x, y, g, r) + " bits a=" + hex(xa) + " b=" + hex(yb) + " got=" + hex(gg) + " want=" + hex(rb);
      break;
    }
    case DataType::kInt32: {
      std::int32_t x, y, g;
      std::memcpy(&x, a + 4 * i, 4);
      std::memcpy(&y, b + 4 * i, 4);
      std::memcpy(&g, got + 4 * i, 4);
      std::int32_t r;
      if (minmax)
        r = ref_combine(op, x, y);
      else
        r = static_cast<std::int32_t>(ref_combine(op, static_cast<std::uint32_t>(x), static_cast<std::uint32_t>(y)));
      ok = g == r;
      if (!ok)
        detail = std::to_string(x) + " op " + std::to_string(y) + " = " + std::to_string(g) + ", expected " +
                 std::to_string(r);
      break;
    }
    case DataType::kInt64: {
      std::int64_t x, y, g;
      std::memcpy(&x, a + 8 * i, 8);
      std::memcpy(&y, b + 8 * i, 8);
      std::memcpy(&g, got + 8 * i, 8);
      std::int64_t r;
      if (minmax)
        r = ref_combine(op, x, y);
      else
        r = static_cast<std::int64_t>(ref_combine(op, static_cast<std::uint64_t>(x), static_cast<std::uint64_t>(y)));
      ok = g == r;
      if (!ok)
        detail = std::to_string(x) + " op " + std::to_string(y) + " = " + std::to_string(g) + ", expected " +
                 std::to_string(r);
      break;
    }
    case DataType::kUInt8: {
      const std::uint8_t x = a[i], y = b[i], g = got[i];
      const auto r = static_cast<std::uint8_t>(
          minmax ? ref_combine(op, x, y) : ref_combine(op, static_cast<unsigned>(x), static_cast<unsigned>(y)));
      ok = g == r;
      if (!ok)
        detail = std::to_string(x) + " op " + std::to_string(y) + " = " + std::to_string(g) + ", expected " +
                 std::to_string(r);
      break;
    }
  }
  if (!ok && why != nullptr) *why = "element " + std::to_string(i) + ": " + detail;
  return ok;
}

// Reduces a and b with every alias form (separate dst, dst == a, dst == b) at element offset `shift` (so that
// the vector loops see unaligned pointers) and checks every element.
void check_reduce(DataType dt, ReduceOp op, std::size_t n, std::size_t shift, std::mt19937_64& rng) {
  const std::size_t es = hopwise::dtype_size(dt), bytes = (n + shift) * es;
  std::vector<unsigned char> a(bytes + es), b(bytes + es), d(bytes + es, 0xcd);
  fill_kernel_input(dt, a.data(), n + shift + 1, rng);
  fill_kernel_input(dt, b.data(), n + shift + 1, rng);
  unsigned char* pa = a.data() + shift * es;
  unsigned char* pb = b.data() + shift * es;
  unsigned char* pd = d.data() + shift * es;
  const std::vector<unsigned char> a0(a), b0(b);
  const std::string what = std::string(hopwise::to_string(dt)) + " " + std::string(hopwise::to_string(op)) +
                           " n=" + std::to_string(n) + " shift=" + std::to_string(shift) +
                           " isa=" + std::string(hopwise::active_isa());
  auto verify = [&](const char* form, const unsigned char* got) {
    std::size_t bad = 0;
    std::string first;
    for (std::size_t i = 0; i < n; ++i) {
      std::string why;
      if (!check_element(dt, op, a0.data() + shift * es, b0.data() + shift * es, got, i, &why) && bad++ == 0)
        first = why;
    }
    EXPECT_EQ(bad, 0u) << what << " (" << form << "): " << bad << " wrong elements; first " << first;
  };
  hopwise::reduce_into(dt, op, pd, pa, pb, n);
  verify("dst separate", pd);
  // Nothing outside [0, n) is written.
  for (std::size_t i = 0; i < shift * es; ++i) ASSERT_EQ(d[i], 0xcd) << what << ": wrote before dst";
  for (std::size_t i = (n + shift) * es; i < d.size(); ++i) ASSERT_EQ(d[i], 0xcd) << what << ": wrote past dst + n";
  EXPECT_EQ(a, a0) << what << ": input a modified";
  EXPECT_EQ(b, b0) << what << ": input b modified";
  hopwise::reduce_into(dt, op, pa, pa, pb, n);
  verify("dst == a", pa);
  std::copy(a0.begin(), a0.end(), a.begin());
  hopwise::reduce_into(dt, op, pb, pa, pb, n);
  verify("dst == b", pb);
  EXPECT_EQ(0, std::memcmp(a.data(), a0.data(), a.size())) << what << ": a modified by dst == b";
}

class ReduceKernel : public ::testing::TestWithParam<DataType> {};

TEST_P(ReduceKernel, EveryOpMatchesScalarReference) {
  const DataType dt = GetParam();
  SCOPED_TRACE(seed_note());
  SCOPED_TRACE(std::string("isa ") + std::string(hopwise::active_isa()));
  std::mt19937_64 rng(test_seed() ^ (static_cast<std::uint64_t>(dt) * 0x9e3779b97f4a7c15ull));
  for (ReduceOp op : hopwise::kAllReduceOps) {
    for (std::size_t n :
         {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{15}, std::size_t{16},
          std::size_t{17}, std::size_t{33}, std::size_t{255}, std::size_t{256}, std::size_t{257}, std::size_t{1000003}})
      for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
        if (n == 1000003 && shift == 1 && op != ReduceOp::kSum) continue;
        check_reduce(dt, op, n, shift, rng);
      }
  }
}

TEST_P(ReduceKernel, ZeroLengthTouchesNothing) {
  const DataType dt = GetParam();
  for (ReduceOp op : hopwise::kAllReduceOps)
    EXPECT_NO_THROW(hopwise::reduce_into(dt, op, nullptr, nullptr, nullptr, 0));
  EXPECT_NO_THROW(hopwise::scale_by(dt, nullptr, 0, 0.5));
}

TEST_P(ReduceKernel, ScaleBy) {
  const DataType dt = GetParam();
  SCOPED_TRACE(seed_note());
  std::mt19937_64 rng(test_seed() + 99 + static_cast<std::uint64_t>(dt));
  const std::size_t es = hopwise::dtype_size(dt);
  for (double factor : {0.25, 1.0 / 3.0, 1.0 / 7.0, 3.0}) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{13}, std::size_t{1000003}}) {
      std::vector<unsigned char> buf(n * es);
      fill_kernel_input(dt, buf.data(), n, rng);
      const std::vector<unsigned char> orig(buf);
      hopwise::scale_by(dt, buf.data(), n, factor);
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n && bad < 5; ++i) {
        bool ok = true;
        switch (dt) {
          case DataType::kFloat32: {
            float x, g;
            std::memcpy(&x, orig.data() + 4 * i, 4);
            std::memcpy(&g, buf.data() + 4 * i, 4);
            const float r = x * static_cast<float>(factor);
            ok = std::isnan(r) ? std::isnan(g) : hopwise::float_to_bits(r) == hopwise::float_to_bits(g);
            break;
          }
          case DataType::kFloat64: {
            double x, g;
            std::memcpy(&x, orig.data() + 8 * i, 8);
            std::memcpy(&g, buf.data() + 8 * i, 8);
            const double r = x * factor;
            ok = std::isnan(r) ? std::isnan(g) : std::memcmp(&r, &g, 8) == 0;
            break;
          }
          case DataType::kFloat16:
          case DataType::kBFloat16: {
            const bool h = dt == DataType::kFloat16;
            std::uint16_t x, g;
            std::memcpy(&x, orig.data() + 2 * i, 2);
            std::memcpy(&g, buf.data() + 2 * i, 2);
            const float xf = h ? hopwise::fp16_to_float(x) : hopwise::bf16_to_float(x);
            const float rf = xf * static_cast<float>(factor);
            const std::uint16_t r = h ? hopwise::float_to_fp16(rf) : hopwise::float_to_bf16(rf);
            const float gf = h ? hopwise::fp16_to_float(g) : hopwise::bf16_to_float(g);
            ok = std::isnan(rf) ? std::isnan(gf) : r == g;
            break;
          }
          default:  // integers: never scaled (avg on integers is rejected before it gets here)
            ok = std::memcmp(orig.data() + es * i, buf.data() + es * i, es) == 0;
            break;
        }
        if (!ok) {
          ++bad;
          ADD_FAILURE() << hopwise::to_string(dt) << " scale_by(" << factor << ") n=" << n << " wrong at element " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, ReduceKernel, ::testing::ValuesIn(hopwise::kAllDataTypes),
                         [](const ::testing::TestParamInfo<DataType>& info) {
                           return std::string(hopwise::to_string(info.param));
                         });

}  // namespace
