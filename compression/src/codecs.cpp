// The concrete codecs. Kernels are plain loops over contiguous arrays so that GCC auto-vectorizes them at -O3
// (conversions by truncation, branch-free selects, counter-based random numbers: no loop-carried RNG state).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec_internal.h"
#include "codec_math.h"
#include "hopwise/common/error.h"
#include "hopwise/common/half.h"
#include "hopwise/common/reduce.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HOPWISE_CODEC_F16C 1
#endif

namespace hopwise::compression::detail {

namespace {

// This rank's private stream for this step (stochastic rounding); `salt` separates the codecs' streams.
Stream state_stream(const CodecState& s, std::uint64_t salt) { return rank_stream(s.seed, s.rank, s.step - 1, salt); }

float max_abs(const float* x, std::size_t n) {
  float lanes[16] = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; ++l) lanes[l] = std::max(lanes[l], std::fabs(x[i + l]));
  float m = 0.0f;
  for (float v : lanes) m = std::max(m, v);
  for (; i < n; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}

// sum of f(x[i]) in double, 8 independent lanes.
template <class F>
double lane_sum(const float* x, std::size_t n, F f) {
  double lanes[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) lanes[l] += static_cast<double>(f(x[i + l]));
  double s = 0.0;
  for (double v : lanes) s += v;
  for (; i < n; ++i) s += static_cast<double>(f(x[i]));
  return s;
}

float load_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}
void store_f32(std::byte* p, float f) { std::memcpy(p, &f, sizeof f); }

template <bool Acc>
inline void put(float* out, std::size_t i, float v) {
  if constexpr (Acc)
    out[i] += v;
  else
    out[i] = v;
}

// The stochastic kernels spend their time in the counter-based hash (32-bit multiplies, which SSE2 lacks): GCC
// builds them twice, for AVX2 and for the baseline, and the loader picks one per CPU (ifunc).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define HOPWISE_CODEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HOPWISE_CODEC_CLONES
#endif

HOPWISE_CODEC_CLONES
void int8_stochastic_kernel(const float* x, std::size_t m, std::int8_t* o, float inv, int q, Stream rs,
                            std::size_t base) {
  for (std::size_t i = 0; i < m; ++i) o[i] = int8_stochastic(x[i], inv, q, rs.uniform(base + i));
}

HOPWISE_CODEC_CLONES
void qsgd_kernel(const float* g, std::size_t n, std::int8_t* out, float inv, int s, Stream rs) {
  for (std::size_t i = 0; i < n; ++i) out[i] = qsgd_level(g[i], inv, s, rs.uniform(i));
}

HOPWISE_CODEC_CLONES
void terngrad_kernel(const float* g, std::size_t n, std::uint8_t* out, float inv, Stream rs) {
  auto code = [&](std::size_t i) { return terngrad_code(g[i], inv, rs.uniform(i)); };
  const std::size_t full = n / 4;
  for (std::size_t j = 0; j < full; ++j)
    out[j] = static_cast<std::uint8_t>(code(4 * j) | code(4 * j + 1) << 2 | code(4 * j + 2) << 4 |
                                       code(4 * j + 3) << 6);
  if (n % 4) {
    std::uint32_t b = 0;
    for (std::size_t i = 4 * full; i < n; ++i) b |= code(i) << (2 * (i - 4 * full));
    out[full] = static_cast<std::uint8_t>(b);
  }
}

// float16 conversions: GCC does not vectorize the bit-twiddling ones in half.h, so where the reduction kernels
// run with AVX2+F16C (hopwise::active_isa(), which honours HOPWISE_ISA) use vcvtps2ph / vcvtph2ps, 8 at a time.
// Both round to nearest even; only NaN payload bits may differ.
bool use_f16c() {
#ifdef HOPWISE_CODEC_F16C
  static const bool yes = active_isa() != "generic";
  return yes;
#else
  return false;
#endif
}

#ifdef HOPWISE_CODEC_F16C
__attribute__((target("avx2,f16c"))) void fp16_encode_f16c(const float* g, std::size_t n, std::uint16_t* h) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(g + i), _MM_FROUND_TO_NEAREST_INT));
  for (; i < n; ++i) h[i] = float_to_fp16(g[i]);
}

template <bool Acc>
__attribute__((target("avx2,f16c"))) void fp16_decode_f16c(const std::uint16_t* h, std::size_t n, float* out) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i)));
    if constexpr (Acc) v = _mm256_add_ps(v, _mm256_loadu_ps(out + i));
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; ++i) put<Acc>(out, i, fp16_to_float(h[i]));
}
#endif

// Bit-unpacking decoders: one byte of codes per iteration, the element's value selected without branches.
template <bool Acc>
void sign_decode(const std::uint8_t* in, std::size_t n, float* out, float s) {
  const std::size_t full = n / 8;
  for (std::size_t j = 0; j < full; ++j) {
    const std::uint32_t b = in[j];
    for (std::uint32_t k = 0; k < 8; ++k) put<Acc>(out, 8 * j + k, ((b >> k) & 1u) ? -s : s);
  }
  for (std::size_t i = 8 * full; i < n; ++i) put<Acc>(out, i, ((in[full] >> (i - 8 * full)) & 1u) ? -s : s);
}

template <bool Acc>
void tern_decode(const std::uint8_t* in, std::size_t n, float* out, float s) {
  auto val = [s](std::uint32_t c) { return c == 1u ? s : (c == 2u ? -s : 0.0f); };
  const std::size_t full = n / 4;
  for (std::size_t j = 0; j < full; ++j) {
    const std::uint32_t b = in[j];
    for (std::uint32_t k = 0; k < 4; ++k) put<Acc>(out, 4 * j + k, val((b >> (2 * k)) & 3u));
  }
  for (std::size_t i = 4 * full; i < n; ++i) put<Acc>(out, i, val((in[full] >> (2 * (i - 4 * full))) & 3u));
}

class NamedCodec : public Codec {
 public:
  explicit NamedCodec(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }

 private:
  std::string name_;
};

// ---- none ----

class NoneCodec final : public NamedCodec {
 public:
  using NamedCodec::NamedCodec;
  Pattern pattern() const override { return Pattern::kAggregatable; }
  DataType payload_dtype() const override { return DataType::kFloat32; }
  std::size_t payload_count(std::size_t n) const override { return n; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    if (n) std::memcpy(p, g, n * sizeof(float));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    if (!acc) {
      if (n) std::memcpy(out, p, n * sizeof(float));
      return;
    }
    const auto* src = reinterpret_cast<const float*>(p);
    for (std::size_t i = 0; i < n; ++i) out[i] += src[i];
  }
};

// ---- fp16 / bf16 ----

template <bool BF16>
class HalfCodec final : public NamedCodec {
 public:
  using NamedCodec::NamedCodec;
  Pattern pattern() const override { return Pattern::kAggregatable; }
  DataType payload_dtype() const override { return BF16 ? DataType::kBFloat16 : DataType::kFloat16; }
  std::size_t payload_count(std::size_t n) const override { return n; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    auto* h = reinterpret_cast<std::uint16_t*>(p);
#ifdef HOPWISE_CODEC_F16C
    if (!BF16 && use_f16c()) return fp16_encode_f16c(g, n, h);
#endif
    for (std::size_t i = 0; i < n; ++i) h[i] = BF16 ? float_to_bf16(g[i]) : float_to_fp16(g[i]);
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    if (acc)
      run<true>(p, n, out);
    else
      run<false>(p, n, out);
  }

 private:
  template <bool Acc>
  static void run(const std::byte* p, std::size_t n, float* out) {
    const auto* h = reinterpret_cast<const std::uint16_t*>(p);
#ifdef HOPWISE_CODEC_F16C
    if (!BF16 && use_f16c()) return fp16_decode_f16c<Acc>(h, n, out);
#endif
    for (std::size_t i = 0; i < n; ++i) put<Acc>(out, i, BF16 ? bf16_to_float(h[i]) : fp16_to_float(h[i]));
  }
};

// ---- int8 with agreed per-block scales and headroom for p ranks ----

class Int8Codec final : public NamedCodec {
 public:
  Int8Codec(std::string name, std::size_t block, bool stochastic)
      : NamedCodec(std::move(name)), block_(block), stochastic_(stochastic) {}
  Pattern pattern() const override { return Pattern::kAggregatable; }
  DataType payload_dtype() const override { return DataType::kUInt8; }  // two's-complement int8, summed wrapping
  std::size_t payload_count(std::size_t n) const override { return n; }
  std::size_t scale_count(std::size_t n) const override { return (n + block_ - 1) / block_; }

  void local_scales(const float* g, std::size_t n, float* scales, const CodecState&) const override {
    for (std::size_t b = 0, i = 0; i < n; ++b, i += block_) scales[b] = max_abs(g + i, std::min(block_, n - i));
  }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float* scales) const override {
    const int q = levels(state.world_size);
    auto* out = reinterpret_cast<std::int8_t*>(p);
    const Stream rs = state_stream(state, 0x1e78);
    for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float s = scales[b];
      const float inv = safe_ratio(static_cast<float>(q), s);
      const float* x = g + i0;
      std::int8_t* o = out + i0;
      if (stochastic_) {
        int8_stochastic_kernel(x, m, o, inv, q, rs, i0);
      } else {
        for (std::size_t i = 0; i < m; ++i) o[i] = int8_nearest(x[i], inv, q);
      }
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState& state, const float* scales,
                 bool acc) const override {
    if (acc)
      run<true>(p, n, out, levels(state.world_size), scales);
    else
      run<false>(p, n, out, levels(state.world_size), scales);
  }

 private:
  template <bool Acc>
  void run(const std::byte* p, std::size_t n, float* out, int q, const float* scales) const {
    const auto* in = reinterpret_cast<const std::int8_t*>(p);
    for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block_) {
      const std::size_t m = std::min(block_, n - i0);
      const float f = scales[b] / static_cast<float>(q);
      for (std::size_t i = 0; i < m; ++i) put<Acc>(out, i0 + i, static_cast<float>(in[i0 + i]) * f);
    }
  }
  int levels(int world_size) const {
    if (world_size > 127)
      throw InvalidArgument(fmt::format("codec '{}': the payloads of {} ranks cannot be summed in int8 (at most 127 "
                                        "ranks); use fp16, bf16 or a gather codec",
                                        name(), world_size));
    return 127 / std::max(1, world_size);
  }
  std::size_t block_;
  bool stochastic_;
};

// ---- qsgd: [float32 L2 norm][n x int8 level in [-s, s]] ----

class QsgdCodec final : public NamedCodec {
 public:
  QsgdCodec(std::string name, int levels) : NamedCodec(std::move(name)), s_(levels) {}
  Pattern pattern() const override { return Pattern::kGather; }
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + n; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const float norm = static_cast<float>(std::sqrt(lane_sum(g, n, [](float v) { return v * v; })));
    store_f32(p, norm);
    auto* out = reinterpret_cast<std::int8_t*>(p + 4);
    const float inv = safe_ratio(static_cast<float>(s_), norm);
    qsgd_kernel(g, n, out, inv, s_, state_stream(state, 0x95dd));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float f = load_f32(p) / static_cast<float>(s_);
    const auto* in = reinterpret_cast<const std::int8_t*>(p + 4);
    if (acc)
      for (std::size_t i = 0; i < n; ++i) out[i] += static_cast<float>(in[i]) * f;
    else
      for (std::size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * f;
  }

 private:
  int s_;
};

// ---- terngrad: [float32 max|x|][2 bits per element: 0 -> 0, 1 -> +s, 2 -> -s], 4 per byte, low bits first ----

class TernGradCodec final : public NamedCodec {
 public:
  using NamedCodec::NamedCodec;
  Pattern pattern() const override { return Pattern::kGather; }
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + (n + 3) / 4; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const float s = max_abs(g, n);
    store_f32(p, s);
    auto* out = reinterpret_cast<std::uint8_t*>(p + 4);
    const float inv = safe_ratio(1.0f, s);
    terngrad_kernel(g, n, out, inv, state_stream(state, 0x7e44));
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float s = load_f32(p);
    const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
    if (acc)
      tern_decode<true>(in, n, out, s);
    else
      tern_decode<false>(in, n, out, s);
  }
};

// ---- sign: [float32 mean|x|][1 bit per element, set = negative, 8 per byte, low bit first] ----

class SignCodec final : public NamedCodec {
 public:
  using NamedCodec::NamedCodec;
  Pattern pattern() const override { return Pattern::kGather; }
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 4 + (n + 7) / 8; }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    const float mean = n ? static_cast<float>(lane_sum(g, n, [](float v) { return std::fabs(v); }) /
                                              static_cast<double>(n))
                         : 0.0f;
    store_f32(p, mean);
    auto* out = reinterpret_cast<std::uint8_t*>(p + 4);
    const std::size_t full = n / 8;
    for (std::size_t j = 0; j < full; ++j) {
      std::uint32_t b = 0;
      for (std::uint32_t k = 0; k < 8; ++k) b |= static_cast<std::uint32_t>(g[8 * j + k] < 0.0f) << k;
      out[j] = static_cast<std::uint8_t>(b);
    }
    if (n % 8) {
      std::uint32_t b = 0;
      for (std::size_t i = 8 * full; i < n; ++i) b |= static_cast<std::uint32_t>(g[i] < 0.0f) << (i - 8 * full);
      out[full] = static_cast<std::uint8_t>(b);
    }
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const float s = load_f32(p);
    const auto* in = reinterpret_cast<const std::uint8_t*>(p + 4);
    if (acc)
      sign_decode<true>(in, n, out, s);
    else
      sign_decode<false>(in, n, out, s);
  }
};

// ---- topk: [k x uint32 index, ascending][k x float32 value] ----

void check_index_range(const Codec& c, std::size_t n) {
  if (n > std::numeric_limits<std::uint32_t>::max())
    throw InvalidArgument(fmt::format("codec '{}': {} elements do not fit its uint32 indices; split the tensor below "
                                      "2^32 elements",
                                      c.name(), n));
}

class TopKCodec final : public NamedCodec {
 public:
  TopKCodec(std::string name, double ratio) : NamedCodec(std::move(name)), ratio_(ratio) {}
  Pattern pattern() const override { return Pattern::kGather; }
  DataType payload_dtype() const override { return DataType::kUInt8; }
  std::size_t payload_count(std::size_t n) const override { return 8 * kept_count(ratio_, n); }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState&, const float*) const override {
    check_index_range(*this, n);
    const std::size_t k = kept_count(ratio_, n);
    if (k == 0) return;
    // Key: |x| as ordered bits (NaN above inf, a total order) in the high half, ~index in the low half so that
    // ties keep the lower index; the k largest keys are the k largest magnitudes.
    auto mag = [g](std::size_t i) {
      std::uint32_t bits;
      std::memcpy(&bits, g + i, sizeof bits);
      return bits & 0x7fffffffu;
    };
    // Radix pre-selection: a histogram of the top 11 bits of |x| (sign-less exponent and 3 mantissa bits) finds
    // the bin that holds the k-th largest; only elements in it or above go to nth_element. Same result as
    // selecting among all n, in a fraction of the time unless the magnitudes crowd into one bin.
    std::vector<std::size_t> hist(2048, 0);
    for (std::size_t i = 0; i < n; ++i) ++hist[mag(i) >> 20];
    std::uint32_t bin = 2047;
    for (std::size_t above = 0;; --bin) {
      above += hist[bin];
      if (above >= k || bin == 0) break;
    }
    std::vector<std::uint64_t> keys;
    for (std::size_t i = 0; i < n; ++i)
      if ((mag(i) >> 20) >= bin)
        keys.push_back(static_cast<std::uint64_t>(mag(i)) << 32 | (~static_cast<std::uint32_t>(i)));
    if (k < keys.size())
      std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(k - 1), keys.end(), std::greater<>());
    std::vector<std::uint32_t> idx(k);
    for (std::size_t j = 0; j < k; ++j) idx[j] = ~static_cast<std::uint32_t>(keys[j]);
    std::sort(idx.begin(), idx.end());
    std::memcpy(p, idx.data(), k * 4);
    for (std::size_t j = 0; j < k; ++j) store_f32(p + 4 * k + 4 * j, g[idx[j]]);
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState&, const float*,
                 bool acc) const override {
    const std::size_t k = kept_count(ratio_, n);
    if (!acc) std::fill(out, out + n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) {
      std::uint32_t i;
      std::memcpy(&i, p + 4 * j, sizeof i);
      if (i >= n)
        throw InvalidArgument(fmt::format("codec '{}': payload index {} is out of range for {} elements (corrupt "
                                          "payload or a different n than at encode)",
                                          name(), i, n));
      out[i] += load_f32(p + 4 * k + 4 * j);
    }
  }

 private:
  double ratio_;
};

// ---- randomk: k float32 values at indices drawn from (seed, step): one uniform index in each of k strata ----

class RandomKCodec final : public NamedCodec {
 public:
  RandomKCodec(std::string name, double ratio) : NamedCodec(std::move(name)), ratio_(ratio) {}
  Pattern pattern() const override { return Pattern::kAggregatable; }
  DataType payload_dtype() const override { return DataType::kFloat32; }
  std::size_t payload_count(std::size_t n) const override { return kept_count(ratio_, n); }

 protected:
  void do_encode(const float* g, std::size_t n, std::byte* p, CodecState& state, const float*) const override {
    const std::size_t k = kept_count(ratio_, n);
    const std::uint64_t key = shared_key(state);
    auto* out = reinterpret_cast<float*>(p);
    for (std::size_t j = 0; j < k; ++j) out[j] = g[index(key, j, n, k)];
  }
  void do_decode(const std::byte* p, std::size_t n, float* out, const CodecState& state, const float*,
                 bool acc) const override {
    const std::size_t k = kept_count(ratio_, n);
    const std::uint64_t key = shared_key(state);
    const auto* in = reinterpret_cast<const float*>(p);
    if (!acc) std::fill(out, out + n, 0.0f);
    for (std::size_t j = 0; j < k; ++j) out[index(key, j, n, k)] += in[j];
  }

 private:
  std::uint64_t shared_key(const CodecState& s) const {
    if (s.step == 0)
      throw InvalidArgument(fmt::format("codec '{}': decode before any encode on this state; the indices come from "
                                        "the step of the latest encode",
                                        name()));
    return randomk_key(s.seed, s.step - 1);
  }
  static std::size_t index(std::uint64_t key, std::size_t j, std::size_t n, std::size_t k) {
    return randomk_index(key, j, n, k);
  }
  double ratio_;
};

}  // namespace

std::unique_ptr<Codec> make_none(std::string name) { return std::make_unique<NoneCodec>(std::move(name)); }
std::unique_ptr<Codec> make_fp16(std::string name) { return std::make_unique<HalfCodec<false>>(std::move(name)); }
std::unique_ptr<Codec> make_bf16(std::string name) { return std::make_unique<HalfCodec<true>>(std::move(name)); }
std::unique_ptr<Codec> make_int8(std::string name, std::size_t block, bool stochastic) {
  return std::make_unique<Int8Codec>(std::move(name), block, stochastic);
}
std::unique_ptr<Codec> make_qsgd(std::string name, int levels) {
  return std::make_unique<QsgdCodec>(std::move(name), levels);
}
std::unique_ptr<Codec> make_terngrad(std::string name) { return std::make_unique<TernGradCodec>(std::move(name)); }
std::unique_ptr<Codec> make_sign(std::string name) { return std::make_unique<SignCodec>(std::move(name)); }
std::unique_ptr<Codec> make_topk(std::string name, double ratio) {
  return std::make_unique<TopKCodec>(std::move(name), ratio);
}
std::unique_ptr<Codec> make_randomk(std::string name, double ratio) {
  return std::make_unique<RandomKCodec>(std::move(name), ratio);
}

}  // namespace hopwise::compression::detail
