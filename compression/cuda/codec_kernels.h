// Internal to hopwise_compression_cuda: the CUDA kernels behind DeviceCodec (device_codec.cu), one launcher per
// kernel, asynchronous on `s`. Payload layouts are those of the CPU codecs (compression/src/codecs/); headers
// (a float32 at the payload's first 4 bytes) are written and read byte by byte, since gathered payloads sit at any
// offset of the gather buffer.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "codec_math.h"
#include "hopwise/common/cuda_check.h"

namespace hopwise::compression::cuda::kernels {

// How decoded values land in `out`: out = v, out += v, or out -= v (the error-feedback residual update).
enum class Out : int { kAssign, kAdd, kSubtract };

using hopwise::cuda::check;
unsigned grid_for(std::size_t n, unsigned threads);

// r[i] += g[i]
void add_into(float* r, const float* g, std::size_t n, cudaStream_t s);
// out (Out) x, elementwise: the "none" codec's decode.
void floats_into(const float* x, std::size_t n, float* out, Out mode, cudaStream_t s);

// fp16 / bf16, round to nearest even.
void half_encode(bool bf16, const float* g, std::size_t n, std::uint16_t* h, cudaStream_t s);
void half_decode(bool bf16, const std::uint16_t* h, std::size_t n, float* out, Out mode, cudaStream_t s);

// int8: scales[b] = max |g + r| over block b of `block` elements (r may be null).
void block_max_abs(const float* g, const float* r, std::size_t n, std::size_t block, float* scales, cudaStream_t s);
void int8_encode(const float* g, std::size_t n, std::size_t block, const float* scales, int q, bool stochastic,
                 detail::Stream rs, std::int8_t* out, cudaStream_t s);
void int8_decode(const std::int8_t* in, std::size_t n, std::size_t block, const float* scales, int q, float* out,
                 Out mode, cudaStream_t s);

// int4 and fp8: per block of `block` elements, [float32 scale][the block's codes] (int4: ceil(m / 2) bytes of
// nibbles; fp8: m e4m3 bytes); encode writes each block's scale (int4: max |x|, fp8: fp8_scale(max |x|)) and then
// the codes, which read it back.
void int4_encode(const float* g, std::size_t n, std::size_t block, bool stochastic, detail::Stream rs,
                 std::byte* payload, cudaStream_t s);
void int4_decode(const std::byte* payload, std::size_t n, std::size_t block, float* out, Out mode, cudaStream_t s);
void fp8_encode(const float* g, std::size_t n, std::size_t block, std::byte* payload, cudaStream_t s);
void fp8_decode(const std::byte* payload, std::size_t n, std::size_t block, float* out, Out mode, cudaStream_t s);

// Header scalars of the gather codecs, written to header[0..4): sqrt(sum x^2) (qsgd), max |x| (terngrad),
// sum |x| / n (sign); sums in double as on the CPU. `partials` holds kReducePartials doubles.
constexpr unsigned kReducePartials = 1024;
enum class HeaderStat : int { kL2Norm, kMaxAbs, kMeanAbs };
void write_header(HeaderStat stat, const float* g, std::size_t n, std::byte* header, double* partials, cudaStream_t s);

// qsgd: [norm][n x int8 level]; terngrad: [max|x|][2 bits each]; sign: [mean|x|][1 bit each, set = negative].
void qsgd_encode(const float* g, std::size_t n, std::byte* payload, int levels, detail::Stream rs, cudaStream_t s);
void qsgd_decode(const std::byte* payload, std::size_t n, int levels, float* out, Out mode, cudaStream_t s);
void terngrad_encode(const float* g, std::size_t n, std::byte* payload, detail::Stream rs, cudaStream_t s);
void terngrad_decode(const std::byte* payload, std::size_t n, float* out, Out mode, cudaStream_t s);
void sign_encode(const float* g, std::size_t n, std::byte* payload, cudaStream_t s);
void sign_decode(const std::byte* payload, std::size_t n, float* out, Out mode, cudaStream_t s);

// randomk: k values at the indices drawn from `key` (detail::randomk_index).
void randomk_encode(const float* g, std::size_t n, std::size_t k, std::uint64_t key, float* out, cudaStream_t s);
void randomk_decode(const float* in, std::size_t n, std::size_t k, std::uint64_t key, float* out, Out mode,
                    cudaStream_t s);

// topk: [k x uint32 index, ascending][k x float32 value]. encode needs topk_workspace_bytes(n) of scratch;
// decode counts indices >= n in *bad (device int, zeroed by the caller) and skips them.
std::size_t topk_workspace_bytes(std::size_t n);
void topk_encode(const float* g, std::size_t n, std::size_t k, std::byte* payload, void* workspace, cudaStream_t s);
void topk_decode(const std::byte* payload, std::size_t n, std::size_t k, float* out, Out mode, int* bad,
                 cudaStream_t s);

}  // namespace hopwise::compression::cuda::kernels
