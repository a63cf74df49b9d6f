// IEEE binary16 and bfloat16 storage types with float conversions (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>

namespace hopwise {

struct float16 {
  std::uint16_t bits = 0;
};
struct bfloat16 {
  std::uint16_t bits = 0;
};

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(static_cast<std::uint32_t>(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    if (mant == 0) return bits_to_float(sign);
    // Subnormal: scale by 2^-24.
    const float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // overflow to inf
  if (abs < 0x38800000u) {                                                    // subnormal or zero
    // Add 0.5 (as float) so that the FPU performs the round-to-nearest-even at the 2^-24 position.
    const float shifted = bits_to_float(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (float_to_bits(shifted) - 0x3f000000u));
  }
  std::uint32_t m = abs + 0xc8000fffu + ((abs >> 13) & 1u);  // rebias exponent (-112 << 23) and round
  return static_cast<std::uint16_t>(sign | (m >> 13));
}

inline float to_float(float16 h) { return fp16_to_float(h.bits); }
inline float to_float(bfloat16 h) { return bf16_to_float(h.bits); }

}  // namespace hopwise
