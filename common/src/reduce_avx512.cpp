// AVX-512 (F + BW) kernels; built with -mavx512f -mavx512bw, called only where the CPU has them.
// GCC warns "'__Y' may be used uninitialized" inside its own AVX-512 intrinsics (_mm512_undefined_*) once they are
// inlined into the kernels: its header's warning, not the kernels'.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#define HOPWISE_ISA avx512
#define HOPWISE_ISA_HAS_F16C 1
#define HOPWISE_VEC_HALF 16
#define HOPWISE_CVTPH_PS(p) _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))
#define HOPWISE_CVTPS_PH(p, v) \
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph((v), _MM_FROUND_TO_NEAREST_INT))
#define HOPWISE_MIN_PS(x, y) _mm512_min_ps((y), (x))
#define HOPWISE_MAX_PS(x, y) _mm512_max_ps((y), (x))
#include "reduce_kernels.inc"
