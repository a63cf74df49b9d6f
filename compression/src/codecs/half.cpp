// fp16 and bf16: each float rounded to nearest even in a 16-bit float. Aggregatable; payload: n float16
// (relative error <= 2^-11) or n bfloat16 (<= 2^-8), 2 B/element, summed in that dtype.
#include <cstdint>

#include "codec_internal.h"
#include "hopwise/common/half.h"
#include "hopwise/common/reduce.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HOPWISE_CODEC_F16C 1
#endif

namespace hopwise::compression::detail {

namespace {

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
    _mm_storeu_si128(reinterpret_cast<__m128i*>(h + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(g + i), _MM_FROUND_TO_NEAREST_INT));
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

template <bool BF16>
class HalfCodec final : public RowCodec {
 public:
  using RowCodec::RowCodec;
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

template <bool BF16>
std::unique_ptr<Codec> make(const CodecRow& row, std::string name, const ParamValues&) {
  return std::make_unique<HalfCodec<BF16>>(row, std::move(name));
}

constexpr ParamDef kParams[] = {ef_param("0")};

}  // namespace

extern constinit const CodecRow kFp16Row{"fp16",     kParams, std::size(kParams), Pattern::kAggregatable, &make<false>,
                                         {0, false}, true};
extern constinit const CodecRow kBf16Row{"bf16",     kParams, std::size(kParams), Pattern::kAggregatable, &make<true>,
                                         {0, false}, true};

}  // namespace hopwise::compression::detail
