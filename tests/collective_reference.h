// Shared by the in-process and MPI collective tests: deterministic random inputs (any rank can regenerate any
// other rank's data from the seed), serial references, and comparisons whose tolerances follow from the dtype.
//
// Tolerances (floating sum/avg/prod): every pairwise combine rounds once to the dtype (float16/bfloat16 compute
// in float32 and round back, so twice, the second one dominating), and every partial result of any reduction
// order is bounded by S_i = sum over ranks of |x_r[i]|. With unit roundoff u (2^-24 float32, 2^-53 float64,
// 2^-11 float16, 2^-8 bfloat16) and n-1 combines, |error| <= (n-1) * u * S_i (first order); we allow n * u * S_i
// plus a few subnormal quanta. avg adds the rounding of 1/n and of the final scaling (2u relative). prod of
// values in [0.5, 2] has relative error <= (n-1) * u. Integers wrap (two's complement, like the library), so any
// order gives the exact same result; min/max are exact for every type.
#pragma once

#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hopwise/common/dtype.h"
#include "hopwise/common/half.h"

namespace hwtest {

using hopwise::DataType;
using hopwise::ReduceOp;
using Bytes = std::vector<unsigned char>;

inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A small fast generator (SplitMix64): test data for 16M-element buffers should not cost more than the collective.
struct Rng {
  using result_type = std::uint64_t;
  std::uint64_t state;
  explicit Rng(std::uint64_t seed) : state(seed) {}
  static constexpr result_type min() { return 0; }
  static constexpr result_type max() { return ~result_type{0}; }
  result_type operator()() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double unit() { return static_cast<double>((*this)() >> 11) * 0x1p-53; }  // [0, 1)
};

inline std::uint64_t mix_seed(std::uint64_t base, std::initializer_list<std::uint64_t> parts) {
  std::uint64_t s = splitmix64(base);
  for (std::uint64_t p : parts) s = splitmix64(s ^ splitmix64(p + 0x632be59bd9b4e019ull));
  return s;
}

// A fresh seed per run (std::random_device), or HOPWISE_TEST_SEED to replay a failure.
inline std::uint64_t base_seed() {
  static const std::uint64_t seed = [] {
    if (const char* s = std::getenv("HOPWISE_TEST_SEED"); s != nullptr && *s != '\0')
      return static_cast<std::uint64_t>(std::strtoull(s, nullptr, 0));
    std::random_device rd;
    return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  }();
  return seed;
}

inline std::string seed_note(std::uint64_t seed) {
  return fmt::format("seed {} (replay with HOPWISE_TEST_SEED={})", seed, seed);
}

// What f() threw, or "<no exception>": for tests that check an error's wording.
template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "<no exception>";
}

inline bool is_half(DataType dt) { return dt == DataType::kFloat16 || dt == DataType::kBFloat16; }

inline std::vector<ReduceOp> ops_for(DataType dt) {
  std::vector<ReduceOp> v;
  for (ReduceOp op : hopwise::kAllReduceOps)
    if (op != ReduceOp::kAvg || hopwise::is_floating(dt)) v.push_back(op);
  return v;
}

// ---- element access ----
inline double load_f(DataType dt, const void* p, std::size_t i) {
  switch (dt) {
    case DataType::kFloat32: {
      float v;
      std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4);
      return v;
    }
    case DataType::kFloat64: {
      double v;
      std::memcpy(&v, static_cast<const char*>(p) + 8 * i, 8);
      return v;
    }
    case DataType::kFloat16: {
      std::uint16_t h;
      std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
      return hopwise::fp16_to_float(h);
    }
    case DataType::kBFloat16: {
      std::uint16_t h;
      std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
      return hopwise::bf16_to_float(h);
    }
    default: break;
  }
  std::abort();
}

// Stores a value that is exactly representable in dt (the generators only make such values).
inline void store_f(DataType dt, void* p, std::size_t i, double v) {
  switch (dt) {
    case DataType::kFloat32: {
      float f = static_cast<float>(v);
      std::memcpy(static_cast<char*>(p) + 4 * i, &f, 4);
      return;
    }
    case DataType::kFloat64: std::memcpy(static_cast<char*>(p) + 8 * i, &v, 8); return;
    case DataType::kFloat16: {
      std::uint16_t h = hopwise::float_to_fp16(static_cast<float>(v));
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
      return;
    }
    case DataType::kBFloat16: {
      std::uint16_t h = hopwise::float_to_bf16(static_cast<float>(v));
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
      return;
    }
    default: break;
  }
  std::abort();
}

// Raw integer element, zero-extended.
inline std::uint64_t load_u(DataType dt, const void* p, std::size_t i) {
  const std::size_t es = hopwise::dtype_size(dt);
  std::uint64_t v = 0;
  std::memcpy(&v, static_cast<const char*>(p) + es * i, es);  // little endian
  return v;
}
inline std::int64_t load_i(DataType dt, const void* p, std::size_t i) {
  const std::uint64_t u = load_u(dt, p, i);
  switch (dt) {
    case DataType::kInt32: return static_cast<std::int32_t>(static_cast<std::uint32_t>(u));
    case DataType::kInt64: return static_cast<std::int64_t>(u);
    default: return static_cast<std::int64_t>(u);  // uint8
  }
}
inline void store_u(DataType dt, void* p, std::size_t i, std::uint64_t v) {
  const std::size_t es = hopwise::dtype_size(dt);
  std::memcpy(static_cast<char*>(p) + es * i, &v, es);
}

inline std::string show(DataType dt, const void* p, std::size_t i) {
  if (hopwise::is_floating(dt)) {
    const std::size_t es = hopwise::dtype_size(dt);
    return fmt::format("{:.17g} (bits 0x{:x})", load_f(dt, p, i),
                       load_u(es == 2   ? DataType::kFloat16
                              : es == 4 ? DataType::kInt32
                                        : DataType::kInt64,
                              p, i));
  }
  return fmt::format("{}", load_i(dt, p, i));
}

// ---- inputs ----
// Rank `rank`'s input of `count` elements for a reduction `op` over `ranks` ranks (see the header comment).
inline Bytes make_input(DataType dt, ReduceOp op, std::size_t count, int rank, int ranks, std::uint64_t seed) {
  Bytes b(count * hopwise::dtype_size(dt));
  Rng rng(mix_seed(seed, {static_cast<std::uint64_t>(rank), 77}));
  if (!hopwise::is_floating(dt)) {
    for (std::size_t i = 0; i < count; ++i) store_u(dt, b.data(), i, rng());
    return b;
  }
  if (op == ReduceOp::kProd) {
    if (is_half(dt)) {
      // Exact: factors +-1, and on at most 8 ranks per element +-2 or +-0.5, so that every partial product of
      // any order lies in [2^-8, 2^8].
      const int stride = std::max(1, (ranks + 7) / 8);
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t r = rng();
        double v = 1.0;
        if ((i * 7 + static_cast<std::size_t>(rank)) % static_cast<std::size_t>(stride) == 0) {
          const int pick = static_cast<int>((r >> 8) % 3);
          v = pick == 0 ? 1.0 : pick == 1 ? 2.0 : 0.5;
        }
        store_f(dt, b.data(), i, (r & 1) ? -v : v);
      }
    } else {
      for (std::size_t i = 0; i < count; ++i) {
        const std::uint64_t r = rng();
        const double v = 0.5 + 1.5 * static_cast<double>(r >> 11) * 0x1p-53;  // [0.5, 2)
        store_f(dt, b.data(), i, (r & 1) ? -v : v);
      }
    }
    return b;
  }
  static constexpr double kScale[9] = {0.0625, 0.125, 0.25, 0.5, 1, 2, 4, 8, 16};
  static constexpr double kSpecial[5] = {0.0, -0.0, 1.0, -1.0, 0.5};
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t r = rng();
    double v;
    if ((r & 15) == 0) {
      v = kSpecial[(r >> 4) % 5];
    } else {
      // A value in (-1, 1) scaled by 2^-4 .. 2^4; the low bits of r pick the scale, the high bits the value.
      v = (static_cast<double>(r >> 11) * 0x1p-52 - 1.0) * kScale[(r >> 4) % 9];
    }
    // Round to the dtype first so that the stored value is the value the reference uses.
    switch (dt) {
      case DataType::kFloat32: v = static_cast<float>(v); break;
      case DataType::kFloat16: v = hopwise::fp16_to_float(hopwise::float_to_fp16(static_cast<float>(v))); break;
      case DataType::kBFloat16: v = hopwise::bf16_to_float(hopwise::float_to_bf16(static_cast<float>(v))); break;
      default: break;
    }
    store_f(dt, b.data(), i, v);
  }
  return b;
}

// Arbitrary bytes for buffers that a collective must overwrite (broadcast receivers, outputs).
inline Bytes make_garbage(std::size_t bytes, std::uint64_t seed) {
  Bytes b(bytes);
  Rng rng(seed);
  for (std::size_t i = 0; i < bytes; i += 8) {
    const std::uint64_t r = rng();
    std::memcpy(b.data() + i, &r, std::min<std::size_t>(8, bytes - i));
  }
  return b;
}

// ---- references ----
struct Expected {
  DataType dt = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int ranks = 1;
  Bytes exact;                     // integers: the exact result bytes
  std::vector<double> value, tol;  // floating: the reference and the allowed |error| per element
};

inline double unit_roundoff(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return std::ldexp(1.0, -24);
    case DataType::kFloat64: return std::ldexp(1.0, -53);
    case DataType::kFloat16: return std::ldexp(1.0, -11) * (1 + std::ldexp(1.0, -12));  // + the float32 step
    case DataType::kBFloat16: return std::ldexp(1.0, -8) * (1 + std::ldexp(1.0, -15));
    default: return 0;
  }
}
inline double subnormal_quantum(DataType dt) {
  switch (dt) {
    case DataType::kFloat32: return std::ldexp(1.0, -149);
    case DataType::kFloat64: return std::ldexp(1.0, -1074);
    case DataType::kFloat16: return std::ldexp(1.0, -24);
    case DataType::kBFloat16: return std::ldexp(1.0, -133);
    default: return 0;
  }
}

// The reduction of inputs[0..n) (each `count` elements, starting at element `first`).
inline Expected reference(DataType dt, ReduceOp op, const std::vector<const void*>& inputs, std::size_t first,
                          std::size_t count) {
  Expected e;
  e.dt = dt;
  e.op = op;
  const int n = static_cast<int>(inputs.size());
  e.ranks = n;
  if (!hopwise::is_floating(dt)) {
    e.exact.resize(count * hopwise::dtype_size(dt));
    for (std::size_t i = 0; i < count; ++i) {
      std::uint64_t acc = load_u(dt, inputs[0], first + i);
      std::int64_t sacc = load_i(dt, inputs[0], first + i);
      for (int r = 1; r < n; ++r) {
        const std::uint64_t x = load_u(dt, inputs[static_cast<std::size_t>(r)], first + i);
        const std::int64_t sx = load_i(dt, inputs[static_cast<std::size_t>(r)], first + i);
        switch (op) {
          case ReduceOp::kSum: acc += x; break;
          case ReduceOp::kProd: acc *= x; break;
          case ReduceOp::kMin:
            if (sx < sacc) {
              sacc = sx;
              acc = x;
            }
            break;
          case ReduceOp::kMax:
            if (sx > sacc) {
              sacc = sx;
              acc = x;
            }
            break;
          case ReduceOp::kAvg: std::abort();
        }
      }
      store_u(dt, e.exact.data(), i, acc);  // truncates to the width: wrap-around
    }
    return e;
  }
  const double u = unit_roundoff(dt), q = subnormal_quantum(dt);
  e.value.resize(count);
  e.tol.resize(count);
  const bool exact_prod = op == ReduceOp::kProd && is_half(dt);
  for (std::size_t i = 0; i < count; ++i) {
    long double acc = load_f(dt, inputs[0], first + i), s = std::fabs(acc);
    for (int r = 1; r < n; ++r) {
      const long double x = load_f(dt, inputs[static_cast<std::size_t>(r)], first + i);
      s += std::fabs(x);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += x; break;
        case ReduceOp::kProd: acc *= x; break;
        case ReduceOp::kMin: acc = std::min(acc, x); break;
        case ReduceOp::kMax: acc = std::max(acc, x); break;
      }
    }
    double tol = 0;
    switch (op) {
      case ReduceOp::kSum: tol = n * u * static_cast<double>(s) + n * q; break;
      case ReduceOp::kAvg:
        acc /= n;
        tol = u * static_cast<double>(s) + 3 * u * std::fabs(static_cast<double>(acc)) + (n + 1) * q;
        break;
      case ReduceOp::kProd: tol = exact_prod ? 0 : (n + 1) * u * std::fabs(static_cast<double>(acc)); break;
      default: break;  // min/max: exact
    }
    e.value[i] = static_cast<double>(acc);
    e.tol[i] = tol;
  }
  return e;
}

// "" when `got` (count elements) matches e at elements [offset, offset + count); else a description.
inline std::string compare(const Expected& e, const void* got, std::size_t offset, std::size_t count) {
  std::size_t bad = 0;
  std::string first;
  for (std::size_t i = 0; i < count; ++i) {
    bool ok;
    std::string want;
    if (!e.exact.empty() || !hopwise::is_floating(e.dt)) {
      ok = load_u(e.dt, got, i) == load_u(e.dt, e.exact.data(), offset + i);
      if (!ok) want = show(e.dt, e.exact.data(), offset + i);
    } else {
      const double g = load_f(e.dt, got, i), w = e.value[offset + i], t = e.tol[offset + i];
      ok = std::fabs(g - w) <= t;  // NaN never passes
      if (!ok) want = fmt::format("{:.17g} +- {:.3g}", w, t);
    }
    if (!ok) {
      if (bad == 0) first = fmt::format("element {}: got {}, expected {}", offset + i, show(e.dt, got, i), want);
      ++bad;
    }
  }
  if (bad == 0) return {};
  return fmt::format("{} of {} elements wrong ({} {} over {} ranks); first: {}", bad, count, hopwise::to_string(e.dt),
                     hopwise::to_string(e.op), e.ranks, first);
}

inline std::string compare_bytes(const void* got, const void* want, std::size_t bytes) {
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < bytes; ++i)
    if (g[i] != w[i]) {
      if (bad++ == 0) first = i;
    }
  if (bad == 0) return {};
  return fmt::format("{} of {} bytes differ; first at byte {}: got 0x{:02x}, expected 0x{:02x}", bad, bytes, first,
                     g[first], w[first]);
}

// Counts worth testing for `ranks` ranks: small, prime, and one block per rank but one.
inline std::vector<std::size_t> small_counts(int ranks) {
  std::vector<std::size_t> v{0, 1, 2, 7, 13};
  if (ranks > 1) v.push_back(static_cast<std::size_t>(ranks - 1));
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

}  // namespace hwtest
