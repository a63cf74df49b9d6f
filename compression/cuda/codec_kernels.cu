// The element-wise codec kernels: grid-stride loops, one element per thread per turn, so that a warp's loads
// are 128 contiguous bytes. The per-element arithmetic is codec_math.h's, shared with the CPU codecs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <string>

#include "codec_kernels.h"
#include "hopwise/common/error.h"

namespace hopwise::compression::cuda::kernels {

using detail::Stream;

unsigned grid_for(std::size_t n, unsigned threads) {
  const std::size_t want = (n + threads - 1) / threads;
  // Enough blocks to fill any current GPU several times over; more only adds scheduling.
  return static_cast<unsigned>(want < 8192 ? (want == 0 ? 1 : want) : 8192);
}

namespace {

constexpr unsigned kThreads = 256;

__device__ __forceinline__ std::size_t first_index() {
  return blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
}
__device__ __forceinline__ std::size_t grid_stride() { return static_cast<std::size_t>(gridDim.x) * blockDim.x; }

template <Out M>
__device__ __forceinline__ void put(float* out, std::size_t i, float v) {
  if constexpr (M == Out::kAssign)
    out[i] = v;
  else if constexpr (M == Out::kAdd)
    out[i] += v;
  else
    out[i] -= v;
}

// i / block in 32 bits where it fits (a 64-bit division costs a GPU dozens of instructions per element).
__device__ __forceinline__ std::size_t block_of(std::size_t i, std::size_t block) {
  if ((i | block) <= 0xffffffffu) return static_cast<std::uint32_t>(i) / static_cast<std::uint32_t>(block);
  return i / block;
}

__device__ __forceinline__ float load_header(const std::byte* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  const unsigned bits = static_cast<unsigned>(b[0]) | static_cast<unsigned>(b[1]) << 8 |
                        static_cast<unsigned>(b[2]) << 16 | static_cast<unsigned>(b[3]) << 24;
  return __uint_as_float(bits);
}
__device__ __forceinline__ void store_header(std::byte* p, float f) {
  const unsigned bits = __float_as_uint(f);
  auto* b = reinterpret_cast<unsigned char*>(p);
  for (int k = 0; k < 4; ++k) b[k] = static_cast<unsigned char>(bits >> (8 * k));
}

// Launches kernel<Out> for a run-time mode.
#define HOPWISE_LAUNCH_OUT(kernel, mode, grid, s, ...)                                         \
  switch (mode) {                                                                              \
    case Out::kAssign: kernel<Out::kAssign><<<grid, kThreads, 0, s>>>(__VA_ARGS__); break;     \
    case Out::kAdd: kernel<Out::kAdd><<<grid, kThreads, 0, s>>>(__VA_ARGS__); break;           \
    case Out::kSubtract: kernel<Out::kSubtract><<<grid, kThreads, 0, s>>>(__VA_ARGS__); break; \
  }

// ---- none, error feedback ----

__global__ void add_into_kernel(float* r, const float* g, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) r[i] += g[i];
}

template <Out M>
__global__ void floats_into_kernel(const float* x, std::size_t n, float* out) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) put<M>(out, i, x[i]);
}

// ---- fp16 / bf16 ----

template <bool BF16>
__global__ void half_encode_kernel(const float* g, std::size_t n, std::uint16_t* h) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    if constexpr (BF16)
      h[i] = __bfloat16_as_ushort(__float2bfloat16_rn(g[i]));
    else
      h[i] = __half_as_ushort(__float2half_rn(g[i]));
  }
}

template <Out M, bool BF16>
__device__ __forceinline__ void half_decode_body(const std::uint16_t* h, std::size_t n, float* out) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float v;
    if constexpr (BF16)
      v = __bfloat162float(__ushort_as_bfloat16(h[i]));
    else
      v = __half2float(__ushort_as_half(h[i]));
    put<M>(out, i, v);
  }
}
template <Out M>
__global__ void fp16_decode_kernel(const std::uint16_t* h, std::size_t n, float* out) {
  half_decode_body<M, false>(h, n, out);
}
template <Out M>
__global__ void bf16_decode_kernel(const std::uint16_t* h, std::size_t n, float* out) {
  half_decode_body<M, true>(h, n, out);
}

// ---- int8 ----

// One thread block per codec block of `block` elements (grid-stride over codec blocks).
__global__ void block_max_abs_kernel(const float* g, const float* r, std::size_t n, std::size_t block,
                                     std::size_t blocks, float* scales) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
    float m = 0.0f;
    for (std::size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
      const float v = r ? r[i] + g[i] : g[i];
      m = fmaxf(m, fabsf(v));
    }
    m = Reduce(tmp).Reduce(m, [](float a, float c) { return fmaxf(a, c); });
    if (threadIdx.x == 0) scales[b] = m;
    __syncthreads();  // tmp is reused by the next codec block
  }
}

template <bool Stochastic>
__device__ __forceinline__ std::int8_t int8_of(float v, float inv, int q, const Stream& rs, std::size_t i) {
  if constexpr (Stochastic)
    return detail::int8_stochastic(v, inv, q, rs.uniform(i));
  else
    return detail::int8_nearest(v, inv, q);
}

// Elements [begin, n), one per thread per turn: the tail after int8_encode4_kernel, or unaligned buffers.
template <bool Stochastic>
__global__ void int8_encode_kernel(const float* g, std::size_t begin, std::size_t n, std::size_t block,
                                   const float* scales, int q, Stream rs, std::int8_t* out) {
  for (std::size_t i = begin + first_index(); i < n; i += grid_stride())
    out[i] = int8_of<Stochastic>(g[i], detail::safe_ratio(static_cast<float>(q), scales[block_of(i, block)]), q, rs, i);
}

// Four elements per thread per turn: a 16-byte load and a 4-byte store (one byte per thread left the stores a
// quarter of a warp's transaction; the kernel ran at 28% of a copy's speed on an H200).
template <bool Stochastic>
__global__ void int8_encode4_kernel(const float4* g, std::size_t quads, std::size_t block, const float* scales, int q,
                                    Stream rs, char4* out) {
  const bool shared_scale = block % 4 == 0;  // the four elements lie in one codec block
  for (std::size_t j = first_index(); j < quads; j += grid_stride()) {
    const float4 v = g[j];
    const std::size_t i = 4 * j;
    float inv[4];
    inv[0] = detail::safe_ratio(static_cast<float>(q), scales[block_of(i, block)]);
    for (int k = 1; k < 4; ++k)
      inv[k] = shared_scale ? inv[0] : detail::safe_ratio(static_cast<float>(q), scales[block_of(i + k, block)]);
    out[j] = make_char4(int8_of<Stochastic>(v.x, inv[0], q, rs, i), int8_of<Stochastic>(v.y, inv[1], q, rs, i + 1),
                        int8_of<Stochastic>(v.z, inv[2], q, rs, i + 2), int8_of<Stochastic>(v.w, inv[3], q, rs, i + 3));
  }
}

template <Out M>
__global__ void int8_decode_kernel(const std::int8_t* in, std::size_t n, std::size_t block, const float* scales, int q,
                                   float* out) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    put<M>(out, i, static_cast<float>(in[i]) * (scales[block_of(i, block)] / static_cast<float>(q)));
}

// ---- int4, fp8: a scale at the head of each block of the payload (block b at b * stride) ----

// One thread block per codec block (grid-stride over codec blocks), as block_max_abs_kernel; the scale is written
// byte by byte (a block's head is at any offset).
template <bool Fp8>
__global__ void block_scale_kernel(const float* g, std::size_t n, std::size_t block, std::size_t blocks,
                                   std::size_t stride, std::byte* payload) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  for (std::size_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const std::size_t i0 = b * block, i1 = i0 + block < n ? i0 + block : n;
    float m = 0.0f;
    for (std::size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) m = fmaxf(m, fabsf(g[i]));
    m = Reduce(tmp).Reduce(m, [](float a, float c) { return fmaxf(a, c); });
    if (threadIdx.x == 0) store_header(payload + b * stride, Fp8 ? detail::fp8_scale(m) : m);
    __syncthreads();  // tmp is reused by the next codec block
  }
}

template <bool Stochastic>
__device__ __forceinline__ std::uint32_t int4_of(float v, float s, const Stream& rs, std::size_t i) {
  if constexpr (Stochastic)
    return detail::int4_stochastic(v, s, rs.uniform(i));
  else
    return detail::int4_nearest(v, s);
}

// One thread per payload byte (two elements of one codec block; `per` = ceil(block / 2) bytes a full block).
template <bool Stochastic>
__global__ void int4_encode_kernel(const float* g, std::size_t n, std::size_t block, std::size_t bytes,
                                   std::byte* payload, Stream rs) {
  const std::size_t per = (block + 1) / 2;
  for (std::size_t t = first_index(); t < bytes; t += grid_stride()) {
    const std::size_t b = block_of(t, per), j = t - b * per;
    const std::size_t i = b * block + 2 * j, end = b * block + block < n ? b * block + block : n;
    std::byte* head = payload + b * (4 + per);
    const float s = load_header(head);
    std::uint32_t code = int4_of<Stochastic>(g[i], s, rs, i);
    if (i + 1 < end) code |= int4_of<Stochastic>(g[i + 1], s, rs, i + 1) << 4;
    reinterpret_cast<std::uint8_t*>(head + 4)[j] = static_cast<std::uint8_t>(code);
  }
}

template <Out M>
__global__ void int4_decode_kernel(const std::byte* payload, std::size_t n, std::size_t block, float* out) {
  const std::size_t per = (block + 1) / 2;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t b = block_of(i, block), k = i - b * block;
    const std::byte* head = payload + b * (4 + per);
    const std::uint32_t byte = reinterpret_cast<const std::uint8_t*>(head + 4)[k / 2];
    put<M>(out, i, detail::int4_value(byte >> (4 * (k % 2)), load_header(head)));
  }
}

__global__ void fp8_encode_kernel(const float* g, std::size_t n, std::size_t block, std::byte* payload) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t b = block_of(i, block);
    std::byte* head = payload + b * (4 + block);
    reinterpret_cast<std::uint8_t*>(head + 4)[i - b * block] =
        detail::fp8_e4m3(detail::safe_ratio(g[i], load_header(head)));
  }
}

template <Out M>
__global__ void fp8_decode_kernel(const std::byte* payload, std::size_t n, std::size_t block, float* out) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t b = block_of(i, block);
    const std::byte* head = payload + b * (4 + block);
    const std::uint32_t code = reinterpret_cast<const std::uint8_t*>(head + 4)[i - b * block];
    put<M>(out, i, detail::fp8_e4m3_value(code) * load_header(head));
  }
}

// ---- header scalars ----

template <HeaderStat S>
__device__ __forceinline__ double stat_of(float x) {
  if constexpr (S == HeaderStat::kL2Norm)
    return static_cast<double>(x * x);  // squared in float, as on the CPU
  else
    return static_cast<double>(fabsf(x));
}

template <HeaderStat S>
__global__ void partials_kernel(const float* g, std::size_t n, double* partials) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double acc = 0.0;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const double v = stat_of<S>(g[i]);
    acc = S == HeaderStat::kMaxAbs ? fmax(acc, v) : acc + v;
  }
  const double total = S == HeaderStat::kMaxAbs ? Reduce(tmp).Reduce(acc, [](double a, double c) { return fmax(a, c); })
                                                : Reduce(tmp).Sum(acc);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

template <HeaderStat S>
__global__ void finish_header_kernel(const double* partials, unsigned count, std::size_t n, std::byte* header) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double acc = 0.0;
  for (unsigned i = threadIdx.x; i < count; i += blockDim.x)
    acc = S == HeaderStat::kMaxAbs ? fmax(acc, partials[i]) : acc + partials[i];
  const double total = S == HeaderStat::kMaxAbs ? Reduce(tmp).Reduce(acc, [](double a, double c) { return fmax(a, c); })
                                                : Reduce(tmp).Sum(acc);
  if (threadIdx.x != 0) return;
  float v = 0.0f;
  if constexpr (S == HeaderStat::kL2Norm)
    v = static_cast<float>(sqrt(total));
  else if constexpr (S == HeaderStat::kMaxAbs)
    v = static_cast<float>(total);  // exact: a float widened
  else
    v = n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
  store_header(header, v);
}

// ---- qsgd, terngrad, sign ----

__global__ void qsgd_encode_kernel(const float* g, std::size_t n, std::byte* payload, int levels, Stream rs) {
  const float inv = detail::safe_ratio(static_cast<float>(levels), load_header(payload));
  auto* out = reinterpret_cast<std::int8_t*>(payload + 4);
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = detail::qsgd_level(g[i], inv, levels, rs.uniform(i));
}

template <Out M>
__global__ void qsgd_decode_kernel(const std::byte* payload, std::size_t n, int levels, float* out) {
  const float f = load_header(payload) / static_cast<float>(levels);
  const auto* in = reinterpret_cast<const std::int8_t*>(payload + 4);
  for (std::size_t i = first_index(); i < n; i += grid_stride()) put<M>(out, i, static_cast<float>(in[i]) * f);
}

// One thread per payload byte (4 elements).
__global__ void terngrad_encode_kernel(const float* g, std::size_t n, std::byte* payload, Stream rs) {
  const float inv = detail::safe_ratio(1.0f, load_header(payload));
  auto* out = reinterpret_cast<std::uint8_t*>(payload + 4);
  const std::size_t bytes = (n + 3) / 4;
  for (std::size_t j = first_index(); j < bytes; j += grid_stride()) {
    std::uint32_t b = 0;
    for (std::uint32_t k = 0; k < 4; ++k) {
      const std::size_t i = 4 * j + k;
      if (i < n) b |= detail::terngrad_code(g[i], inv, rs.uniform(i)) << (2 * k);
    }
    out[j] = static_cast<std::uint8_t>(b);
  }
}

template <Out M>
__global__ void terngrad_decode_kernel(const std::byte* payload, std::size_t n, float* out) {
  const float s = load_header(payload);
  const auto* in = reinterpret_cast<const std::uint8_t*>(payload + 4);
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::uint32_t c = (in[i / 4] >> (2 * (i % 4))) & 3u;
    put<M>(out, i, c == 1u ? s : (c == 2u ? -s : 0.0f));
  }
}

// A warp takes 32 consecutive elements: the ballot of their signs is 4 payload bytes, written by lanes 0-3.
__global__ void sign_encode_kernel(const float* g, std::size_t n, std::byte* payload) {
  auto* out = reinterpret_cast<std::uint8_t*>(payload + 4);
  const unsigned lane = threadIdx.x % 32;
  const std::size_t bytes = (n + 7) / 8;
  // Every lane of a warp runs the same turns (the loop bound is the warp's), as the ballot needs.
  for (std::size_t base = first_index() - lane; base < n; base += grid_stride()) {
    const std::size_t i = base + lane;
    const unsigned bits = __ballot_sync(0xffffffffu, i < n && g[i] < 0.0f);
    if (lane < 4 && base / 8 + lane < bytes) out[base / 8 + lane] = static_cast<std::uint8_t>(bits >> (8 * lane));
  }
}

template <Out M>
__global__ void sign_decode_kernel(const std::byte* payload, std::size_t n, float* out) {
  const float s = load_header(payload);
  const auto* in = reinterpret_cast<const std::uint8_t*>(payload + 4);
  for (std::size_t i = first_index(); i < n; i += grid_stride()) put<M>(out, i, ((in[i / 8] >> (i % 8)) & 1u) ? -s : s);
}

// ---- randomk ----

__global__ void randomk_encode_kernel(const float* g, std::size_t n, std::size_t k, std::uint64_t key, float* out) {
  for (std::size_t j = first_index(); j < k; j += grid_stride()) out[j] = g[detail::randomk_index(key, j, n, k)];
}

// Indices of distinct strata differ, so the scatter needs no atomics. kAssign zeroes `out` first (a memset).
template <Out M>
__global__ void randomk_decode_kernel(const float* in, std::size_t n, std::size_t k, std::uint64_t key, float* out) {
  for (std::size_t j = first_index(); j < k; j += grid_stride())
    put<M == Out::kSubtract ? Out::kSubtract : Out::kAdd>(out, detail::randomk_index(key, j, n, k), in[j]);
}

}  // namespace

void add_into(float* r, const float* g, std::size_t n, cudaStream_t s) {
  if (n == 0) return;
  add_into_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(r, g, n);
  check(cudaGetLastError(), "add_into kernel");
}

void floats_into(const float* x, std::size_t n, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  if (mode == Out::kAssign) {
    if (x != out) check(cudaMemcpyAsync(out, x, n * sizeof(float), cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync");
    return;
  }
  HOPWISE_LAUNCH_OUT(floats_into_kernel, mode, grid_for(n, kThreads), s, x, n, out);
  check(cudaGetLastError(), "none decode kernel");
}

void half_encode(bool bf16, const float* g, std::size_t n, std::uint16_t* h, cudaStream_t s) {
  if (n == 0) return;
  if (bf16)
    half_encode_kernel<true><<<grid_for(n, kThreads), kThreads, 0, s>>>(g, n, h);
  else
    half_encode_kernel<false><<<grid_for(n, kThreads), kThreads, 0, s>>>(g, n, h);
  check(cudaGetLastError(), "half encode kernel");
}

void half_decode(bool bf16, const std::uint16_t* h, std::size_t n, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  if (bf16) {
    HOPWISE_LAUNCH_OUT(bf16_decode_kernel, mode, grid_for(n, kThreads), s, h, n, out);
  } else {
    HOPWISE_LAUNCH_OUT(fp16_decode_kernel, mode, grid_for(n, kThreads), s, h, n, out);
  }
  check(cudaGetLastError(), "half decode kernel");
}

void block_max_abs(const float* g, const float* r, std::size_t n, std::size_t block, float* scales, cudaStream_t s) {
  if (n == 0) return;
  const std::size_t blocks = (n + block - 1) / block;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  block_max_abs_kernel<<<grid, kThreads, 0, s>>>(g, r, n, block, blocks, scales);
  check(cudaGetLastError(), "int8 scales kernel");
}

void int8_encode(const float* g, std::size_t n, std::size_t block, const float* scales, int q, bool stochastic,
                 Stream rs, std::int8_t* out, cudaStream_t s) {
  if (n == 0) return;
  const bool aligned = reinterpret_cast<std::uintptr_t>(g) % 16 == 0 && reinterpret_cast<std::uintptr_t>(out) % 4 == 0;
  const std::size_t quads = aligned ? n / 4 : 0, begin = 4 * quads;
  const auto* g4 = reinterpret_cast<const float4*>(g);
  auto* out4 = reinterpret_cast<char4*>(out);
  if (quads > 0) {
    if (stochastic)
      int8_encode4_kernel<true><<<grid_for(quads, kThreads), kThreads, 0, s>>>(g4, quads, block, scales, q, rs, out4);
    else
      int8_encode4_kernel<false><<<grid_for(quads, kThreads), kThreads, 0, s>>>(g4, quads, block, scales, q, rs, out4);
  }
  if (begin < n) {
    const unsigned grid = grid_for(n - begin, kThreads);
    if (stochastic)
      int8_encode_kernel<true><<<grid, kThreads, 0, s>>>(g, begin, n, block, scales, q, rs, out);
    else
      int8_encode_kernel<false><<<grid, kThreads, 0, s>>>(g, begin, n, block, scales, q, rs, out);
  }
  check(cudaGetLastError(), "int8 encode kernel");
}

void int8_decode(const std::int8_t* in, std::size_t n, std::size_t block, const float* scales, int q, float* out,
                 Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(int8_decode_kernel, mode, grid_for(n, kThreads), s, in, n, block, scales, q, out);
  check(cudaGetLastError(), "int8 decode kernel");
}

namespace {

template <bool Fp8>
void block_scales(const float* g, std::size_t n, std::size_t block, std::size_t stride, std::byte* payload,
                  cudaStream_t s) {
  const std::size_t blocks = (n + block - 1) / block;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
  block_scale_kernel<Fp8><<<grid, kThreads, 0, s>>>(g, n, block, blocks, stride, payload);
  check(cudaGetLastError(), Fp8 ? "fp8 scales kernel" : "int4 scales kernel");
}

}  // namespace

void int4_encode(const float* g, std::size_t n, std::size_t block, bool stochastic, Stream rs, std::byte* payload,
                 cudaStream_t s) {
  if (n == 0) return;
  const std::size_t per = (block + 1) / 2, bytes = n / block * per + (n % block + 1) / 2;
  block_scales<false>(g, n, block, 4 + per, payload, s);
  if (stochastic)
    int4_encode_kernel<true><<<grid_for(bytes, kThreads), kThreads, 0, s>>>(g, n, block, bytes, payload, rs);
  else
    int4_encode_kernel<false><<<grid_for(bytes, kThreads), kThreads, 0, s>>>(g, n, block, bytes, payload, rs);
  check(cudaGetLastError(), "int4 encode kernel");
}

void int4_decode(const std::byte* payload, std::size_t n, std::size_t block, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(int4_decode_kernel, mode, grid_for(n, kThreads), s, payload, n, block, out);
  check(cudaGetLastError(), "int4 decode kernel");
}

void fp8_encode(const float* g, std::size_t n, std::size_t block, std::byte* payload, cudaStream_t s) {
  if (n == 0) return;
  block_scales<true>(g, n, block, 4 + block, payload, s);
  fp8_encode_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(g, n, block, payload);
  check(cudaGetLastError(), "fp8 encode kernel");
}

void fp8_decode(const std::byte* payload, std::size_t n, std::size_t block, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(fp8_decode_kernel, mode, grid_for(n, kThreads), s, payload, n, block, out);
  check(cudaGetLastError(), "fp8 decode kernel");
}

void write_header(HeaderStat stat, const float* g, std::size_t n, std::byte* header, double* partials, cudaStream_t s) {
  const unsigned grid = n == 0 ? 1 : std::min(grid_for(n, kThreads), kReducePartials);
  switch (stat) {
    case HeaderStat::kL2Norm:
      partials_kernel<HeaderStat::kL2Norm><<<grid, kThreads, 0, s>>>(g, n, partials);
      finish_header_kernel<HeaderStat::kL2Norm><<<1, kThreads, 0, s>>>(partials, grid, n, header);
      break;
    case HeaderStat::kMaxAbs:
      partials_kernel<HeaderStat::kMaxAbs><<<grid, kThreads, 0, s>>>(g, n, partials);
      finish_header_kernel<HeaderStat::kMaxAbs><<<1, kThreads, 0, s>>>(partials, grid, n, header);
      break;
    case HeaderStat::kMeanAbs:
      partials_kernel<HeaderStat::kMeanAbs><<<grid, kThreads, 0, s>>>(g, n, partials);
      finish_header_kernel<HeaderStat::kMeanAbs><<<1, kThreads, 0, s>>>(partials, grid, n, header);
      break;
  }
  check(cudaGetLastError(), "header reduction kernel");
}

void qsgd_encode(const float* g, std::size_t n, std::byte* payload, int levels, Stream rs, cudaStream_t s) {
  if (n == 0) return;
  qsgd_encode_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(g, n, payload, levels, rs);
  check(cudaGetLastError(), "qsgd encode kernel");
}

void qsgd_decode(const std::byte* payload, std::size_t n, int levels, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(qsgd_decode_kernel, mode, grid_for(n, kThreads), s, payload, n, levels, out);
  check(cudaGetLastError(), "qsgd decode kernel");
}

void terngrad_encode(const float* g, std::size_t n, std::byte* payload, Stream rs, cudaStream_t s) {
  if (n == 0) return;
  terngrad_encode_kernel<<<grid_for((n + 3) / 4, kThreads), kThreads, 0, s>>>(g, n, payload, rs);
  check(cudaGetLastError(), "terngrad encode kernel");
}

void terngrad_decode(const std::byte* payload, std::size_t n, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(terngrad_decode_kernel, mode, grid_for(n, kThreads), s, payload, n, out);
  check(cudaGetLastError(), "terngrad decode kernel");
}

void sign_encode(const float* g, std::size_t n, std::byte* payload, cudaStream_t s) {
  if (n == 0) return;
  sign_encode_kernel<<<grid_for(n, kThreads), kThreads, 0, s>>>(g, n, payload);
  check(cudaGetLastError(), "sign encode kernel");
}

void sign_decode(const std::byte* payload, std::size_t n, float* out, Out mode, cudaStream_t s) {
  if (n == 0) return;
  HOPWISE_LAUNCH_OUT(sign_decode_kernel, mode, grid_for(n, kThreads), s, payload, n, out);
  check(cudaGetLastError(), "sign decode kernel");
}

void randomk_encode(const float* g, std::size_t n, std::size_t k, std::uint64_t key, float* out, cudaStream_t s) {
  if (k == 0) return;
  randomk_encode_kernel<<<grid_for(k, kThreads), kThreads, 0, s>>>(g, n, k, key, out);
  check(cudaGetLastError(), "randomk encode kernel");
}

void randomk_decode(const float* in, std::size_t n, std::size_t k, std::uint64_t key, float* out, Out mode,
                    cudaStream_t s) {
  if (n == 0) return;
  if (mode == Out::kAssign) check(cudaMemsetAsync(out, 0, n * sizeof(float), s), "cudaMemsetAsync");
  if (k == 0) return;
  HOPWISE_LAUNCH_OUT(randomk_decode_kernel, mode, grid_for(k, kThreads), s, in, n, k, key, out);
  check(cudaGetLastError(), "randomk decode kernel");
}

}  // namespace hopwise::compression::cuda::kernels
