// AVX2 + F16C kernels; built with -mavx2 -mf16c -mfma, called only where the CPU has them.
#include <immintrin.h>
#define HOPWISE_ISA avx2
#define HOPWISE_ISA_HAS_F16C 1
#define HOPWISE_VEC_HALF 8
#define HOPWISE_CVTPH_PS(p) _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))
#define HOPWISE_CVTPS_PH(p, v) \
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT))
#define HOPWISE_MIN_PS(x, y) _mm256_min_ps((y), (x))
#define HOPWISE_MAX_PS(x, y) _mm256_max_ps((y), (x))
#include "reduce_kernels.inc"
