// Arithmetic the CPU codecs (codecs/*.cpp) and the CUDA codecs (cuda/*.cu) share, so that both round and draw
// alike: counter-based random streams (uniform(i) depends only on a key and i, no state carried between elements),
// the roundings, and randomk's index draw. Compiled as host code by g++ and as host and device code by nvcc.
#pragma once

#include <cstddef>
#include <cstdint>

#if !defined(__CUDA_ARCH__)
#include <algorithm>
#include <cmath>
#include <cstring>
#endif

#if defined(__CUDACC__)
#define HOPWISE_HD __host__ __device__ __forceinline__
#else
#define HOPWISE_HD inline
#endif

namespace hopwise::compression::detail {

HOPWISE_HD std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

HOPWISE_HD std::uint32_t lowbias32(std::uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

struct Stream {
  std::uint32_t k1, k2;
  // Uniform in [0, 1) with 24 random bits.
  HOPWISE_HD float uniform(std::size_t i) const {
    std::uint32_t h = lowbias32(static_cast<std::uint32_t>(i) ^ k1);
    h = lowbias32(h + k2 + static_cast<std::uint32_t>(static_cast<std::uint64_t>(i) >> 32) * 0x9e3779b9u);
    return static_cast<float>(h >> 8) * 0x1p-24f;
  }
};

// A rank's private stream for one step (stochastic rounding); `salt` separates the codecs' streams. `step` is
// the index of the step (CodecState::step - 1 after encode() counted it).
HOPWISE_HD Stream rank_stream(std::uint64_t seed, int rank, std::uint64_t step, std::uint64_t salt) {
  std::uint64_t k = splitmix64(seed ^ splitmix64(salt));
  k = splitmix64(k ^ splitmix64(static_cast<std::uint64_t>(rank) + 0x1234567ull));
  k = splitmix64(k ^ step);
  return {static_cast<std::uint32_t>(k), static_cast<std::uint32_t>(k >> 32)};
}

HOPWISE_HD int trunc_to_int(float v) { return static_cast<int>(v); }
// Nearest, ties away from zero (vectorizes with SSE2: no roundps needed).
HOPWISE_HD int round_nearest(float v) { return trunc_to_int(v + (v >= 0.0f ? 0.5f : -0.5f)); }
// floor(v + u) with u uniform in [0, 1): E = v.
HOPWISE_HD int round_stochastic(float v, float u) {
  const float w = v + u;
  const int t = trunc_to_int(w);
  return static_cast<float>(t) > w ? t - 1 : t;
}
// The host spellings are the ones GCC's auto-vectorizer turns into min/max/andps; the device ones mean the same.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float clamp_float(float v, float lo, float hi) { return v < lo ? lo : (hi < v ? hi : v); }
__device__ __forceinline__ int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (hi < v ? hi : v); }
__device__ __forceinline__ int min_int(int a, int b) { return b < a ? b : a; }
__device__ __forceinline__ float abs_float(float v) { return fabsf(v); }
#else
inline float clamp_float(float v, float lo, float hi) { return std::clamp(v, lo, hi); }
inline int clamp_int(int v, int lo, int hi) { return std::clamp(v, lo, hi); }
inline int min_int(int a, int b) { return std::min(a, b); }
inline float abs_float(float v) { return std::fabs(v); }
#endif

// 1 / scale-style factors: 0 when the scale is 0, infinite or NaN, or so small that the ratio overflows (a block
// whose largest value is below about 1e-36 for int8), so the codec sends zeros there: such values are far below any
// that matter, and error feedback keeps them. An infinite factor would turn zeros into NaN levels.
HOPWISE_HD float safe_ratio(float num, float scale) {
  if (!(scale > 0.0f && scale <= 3.402823466e38f)) return 0.0f;
  const float r = num / scale;
  return r >= -3.402823466e38f && r <= 3.402823466e38f ? r : 0.0f;
}

// int8: one value quantized to [-q, q] with inv = q / scale (nearest, or stochastic with u uniform in [0, 1)).
HOPWISE_HD std::int8_t int8_nearest(float x, float inv, int q) {
  const float fq = static_cast<float>(q);
  return static_cast<std::int8_t>(round_nearest(clamp_float(x * inv, -fq, fq)));
}
HOPWISE_HD std::int8_t int8_stochastic(float x, float inv, int q, float u) {
  const float fq = static_cast<float>(q);
  return static_cast<std::int8_t>(clamp_int(round_stochastic(clamp_float(x * inv, -fq, fq), u), -q, q));
}
// Nearest, ties to even, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits (exact, unlike v + 0.5 which
// rounds 0.5 - 2^-25 up).
HOPWISE_HD int round_even(float v) { return trunc_to_int((v + 12582912.0f) - 12582912.0f); }

// int4: x / s * 7 (s = the block's max |x|; 0 where s is 0, infinite or NaN), rounded to a level in [-7, 7]
// (nearest: ties to even; stochastic: floor(v + u), unbiased) and kept as its 4-bit two's complement.
HOPWISE_HD std::uint32_t int4_nearest(float x, float s) {
  return static_cast<std::uint32_t>(round_even(clamp_float(safe_ratio(x, s) * 7.0f, -7.0f, 7.0f))) & 15u;
}
HOPWISE_HD std::uint32_t int4_stochastic(float x, float s, float u) {
  // v + u may round up to 8 in float when v = 7: the clamp keeps the level in range.
  const int l = clamp_int(round_stochastic(clamp_float(safe_ratio(x, s) * 7.0f, -7.0f, 7.0f), u), -7, 7);
  return static_cast<std::uint32_t>(l) & 15u;
}
// The value of a nibble: its level (-8 only in a corrupt payload) / 7, times s (two roundings; l * s could overflow).
HOPWISE_HD float int4_value(std::uint32_t nibble, float s) {
  const int l = static_cast<int>(nibble & 15u) - static_cast<int>((nibble & 8u) << 1);
  return static_cast<float>(l) / 7.0f * s;
}

#if defined(__CUDA_ARCH__)
__device__ __forceinline__ std::uint32_t float_bits(float f) { return __float_as_uint(f); }
__device__ __forceinline__ float bits_float(std::uint32_t b) { return __uint_as_float(b); }
#else
inline std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
inline float bits_float(std::uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
#endif

// fp8 e4m3, OCP's "FN" variant: bias 7, no infinities, 0x7f / 0xff NaN, largest finite 448 (0x7e), smallest
// normal 2^-6 (0x08), subnormals m * 2^-9 (m = 1..7).
// The block scale s = max |x| / 448, rounded down to a float where the division rounded up (so that 448 s <= max |x|:
// the largest element's decoded value cannot overflow; it is clamped to 448 instead, a 2^-23 relative loss), but up
// where s is below the normal floats (2^-126) and the division rounded down (so that max |x| / s <= 448 and a
// nonzero block never gets s = 0; a max below 448 * 2^-150 gets the smallest subnormal float).
HOPWISE_HD float fp8_scale(float max_abs) {
  const float s = max_abs / 448.0f;
  const double exact = static_cast<double>(s) * 448.0, m = static_cast<double>(max_abs);  // exact products
  if (s < 0x1p-126f) return exact < m ? bits_float(float_bits(s) + 1u) : s;
  return exact > m ? bits_float(float_bits(s) - 1u) : s;
}
// y (clamped to [-448, 448]; finite) rounded to the nearest e4m3, ties to even; the sign of y kept (-0 too).
HOPWISE_HD std::uint8_t fp8_e4m3(float y) {
  const float a = abs_float(clamp_float(y, -448.0f, 448.0f));
  const std::uint32_t bits = float_bits(a);
  // Normal (a >= 2^-6): the 23-bit mantissa rounded to 3 bits, a carry moving into the exponent; rebiased 127 -> 7.
  const std::uint32_t normal = ((bits + 0x7ffffu + ((bits >> 20) & 1u)) >> 20) - (120u << 3);
  // Subnormal: a * 2^9 (exact) rounded to an integer in [0, 8] by the 2^23 trick (8 is 2^-6, the code of which is 8).
  const std::uint32_t sub = static_cast<std::uint32_t>(trunc_to_int((a * 512.0f + 8388608.0f) - 8388608.0f));
  const std::uint32_t code = a >= 0x1p-6f ? normal : sub;
  return static_cast<std::uint8_t>(code | ((float_bits(y) >> 24) & 0x80u));
}
HOPWISE_HD float fp8_e4m3_value(std::uint32_t code) {
  const std::uint32_t e = (code >> 3) & 15u, m = code & 7u;
  float v = e == 0 ? static_cast<float>(m) * 0x1p-9f : bits_float(((e + 120u) << 23) | (m << 20));
  if ((code & 0x7fu) == 0x7fu) v = bits_float(0x7fc00000u);
  return (code & 0x80u) ? -v : v;
}

// qsgd: |x| * inv (inv = levels / ||x||) rounded stochastically to a level in [0, levels], signed as x.
HOPWISE_HD std::int8_t qsgd_level(float x, float inv, int levels, float u) {
  const int l = min_int(round_stochastic(abs_float(x) * inv, u), levels);
  return static_cast<std::int8_t>(x < 0.0f ? -l : l);
}
// terngrad: 2-bit code of x (inv = 1 / max|x|): kept with probability |x| * inv as 1 (+) or 2 (-), else 0.
HOPWISE_HD std::uint32_t terngrad_code(float x, float inv, float u) {
  const bool keep = u < abs_float(x) * inv;
  return keep ? (x < 0.0f ? 2u : 1u) : 0u;
}

// randomk: the key of a step's shared indices (every rank draws the same ones).
HOPWISE_HD std::uint64_t randomk_key(std::uint64_t seed, std::uint64_t step) {
  return splitmix64(splitmix64(seed ^ 0x7a4d0c3bull) ^ step);
}

// randomk: the index kept from stratum j of k equal strata of [0, n): [j*n/k, (j+1)*n/k), uniformly inside it.
HOPWISE_HD std::size_t randomk_index(std::uint64_t key, std::size_t j, std::size_t n, std::size_t k) {
  using u128 = unsigned __int128;
  std::size_t start, end;
  if (n <= 0xffffffffu) {  // j < k <= n: the products fit in 64 bits (a 128-bit division is slow on a GPU)
    start = static_cast<std::uint64_t>(j) * n / k;
    end = static_cast<std::uint64_t>(j + 1) * n / k;
  } else {
    start = static_cast<std::size_t>(static_cast<u128>(j) * n / k);
    end = static_cast<std::size_t>(static_cast<u128>(j + 1) * n / k);
  }
  const std::uint64_t h = splitmix64(key ^ j);
#if defined(__CUDA_ARCH__)
  return start + static_cast<std::size_t>(__umul64hi(h, end - start));
#else
  return start + static_cast<std::size_t>((static_cast<u128>(h) * (end - start)) >> 64);
#endif
}

}  // namespace hopwise::compression::detail
