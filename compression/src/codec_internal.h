// Internal to hopwise_compression: what the codec files (codecs/*.cpp) share. Kernels are plain loops over
// contiguous arrays so that GCC auto-vectorizes them at -O3 (conversions by truncation, branch-free selects,
// counter-based random numbers: no loop-carried RNG state).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <utility>

#include "codec_math.h"
#include "hopwise/compression/codec.h"
#include "hopwise/compression/codec_table.h"

// The stochastic kernels spend their time in the counter-based hash (32-bit multiplies, which SSE2 lacks): GCC
// builds them twice, for AVX2 and for the baseline, and the loader picks one per CPU (ifunc).
#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define HOPWISE_CODEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HOPWISE_CODEC_CLONES
#endif

namespace hopwise::compression::detail {

// A codec of a registry row: name() is its canonical spec string, pattern() the row's.
class RowCodec : public Codec {
 public:
  RowCodec(const CodecRow& row, std::string name) : row_(row), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  Pattern pattern() const override { return row_.pattern; }

 protected:
  const CodecRow& row() const { return row_; }

 private:
  const CodecRow& row_;
  std::string name_;
};

// This rank's private stream for this step (stochastic rounding); the row's salt separates the codecs' streams.
inline Stream state_stream(const CodecState& s, std::uint64_t salt) {
  return rank_stream(s.seed, s.rank, s.step - 1, salt);
}

inline float max_abs(const float* x, std::size_t n) {
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

inline float load_f32(const std::byte* p) {
  float f;
  std::memcpy(&f, p, sizeof f);
  return f;
}
inline void store_f32(std::byte* p, float f) { std::memcpy(p, &f, sizeof f); }

template <bool Acc>
inline void put(float* out, std::size_t i, float v) {
  if constexpr (Acc)
    out[i] += v;
  else
    out[i] = v;
}

// k = ceil(ratio * n) (tolerating the rounding of ratio * n), at least 1 and at most n; 0 when n == 0.
std::size_t kept_count(double ratio, std::size_t n);

}  // namespace hopwise::compression::detail
