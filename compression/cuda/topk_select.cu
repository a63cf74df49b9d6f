// Top-k on the GPU with the CPU codec's exact answer: the k largest |x|, ties to the lower index, written as
// ascending indices and their values. No sort of n keys and no host round trip:
//   1. radix select of the k-th largest magnitude M (31 bits: passes over bits 30-20, 19-10, 9-0; each a
//      histogram of the elements still matching the chosen prefix and a one-block pick of the bin);
//   2. per 4096-element tile, counts of |x| > M and |x| == M; an exclusive scan of the tiles' counts;
//   3. each tile writes its elements with |x| > M, and those with |x| == M while fewer than `need` equal ones lie
//      before them, at their rank among the kept elements: the output is in index order by construction.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "codec_kernels.h"

namespace hopwise::compression::cuda::kernels {

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kRounds = 16;
constexpr std::size_t kTile = kThreads * kRounds;
constexpr unsigned kMaxBins = 2048;

struct Pass {
  unsigned shift, bits;
};
constexpr Pass kPasses[3] = {{20, 11}, {10, 10}, {0, 10}};

// Device-side selection state: the magnitude prefix chosen so far and how many of the k are still to be found
// among the elements that match it.
struct Selection {
  std::uint32_t prefix;
  std::uint32_t remaining;
};

__device__ __forceinline__ std::uint32_t magnitude(const float* g, std::size_t i) {
  return __float_as_uint(g[i]) & 0x7fffffffu;  // |x| as ordered bits; NaN above inf, as on the CPU
}

__global__ void start_kernel(Selection* sel, std::uint32_t k) {
  sel->prefix = 0;
  sel->remaining = k;
}

__global__ void histogram_kernel(const float* g, std::size_t n, Pass pass, const Selection* sel, std::uint32_t* hist) {
  __shared__ std::uint32_t local[kMaxBins];
  const unsigned bins = 1u << pass.bits;
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const std::uint32_t prefix = sel->prefix;
  const unsigned high = pass.shift + pass.bits;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t m = magnitude(g, i);
    if ((high >= 32 ? 0u : m >> high) == prefix) atomicAdd(&local[(m >> pass.shift) & (bins - 1)], 1u);
  }
  __syncthreads();
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x)
    if (local[b]) atomicAdd(&hist[b], local[b]);
}

// Bins in descending order, 8 per thread: an exclusive sum gives the count above each bin; the bin where the
// remaining k falls is the one with above < remaining <= above + count. Zeroes the histogram for the next pass.
__global__ void pick_kernel(std::uint32_t* hist, Pass pass, Selection* sel) {
  constexpr int kPer = kMaxBins / kThreads;
  using Scan = cub::BlockScan<std::uint32_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const unsigned bins = 1u << pass.bits;
  std::uint32_t count[kPer], above[kPer];
  for (int j = 0; j < kPer; ++j) {
    const unsigned slot = threadIdx.x * kPer + j;  // slot 0 = the highest bin
    count[j] = slot < bins ? hist[bins - 1 - slot] : 0u;
  }
  Scan(tmp).ExclusiveSum(count, above);
  const std::uint32_t remaining = sel->remaining;
  const std::uint32_t prefix = sel->prefix;
  __syncthreads();  // every thread has read sel before the winner writes it
  for (int j = 0; j < kPer; ++j) {
    const unsigned slot = threadIdx.x * kPer + j;
    if (slot < bins && above[j] < remaining && remaining <= above[j] + count[j]) {
      sel->prefix = (prefix << pass.bits) | (bins - 1 - slot);
      sel->remaining = remaining - above[j];
    }
  }
  for (unsigned b = threadIdx.x; b < bins; b += blockDim.x) hist[b] = 0;
}

// Counts per tile, packed as (greater << 32) | equal: neither exceeds 2^32 - 1 (n < 2^32).
__global__ void tile_count_kernel(const float* g, std::size_t n, const Selection* sel, std::uint64_t* tiles) {
  using Reduce = cub::BlockReduce<std::uint64_t, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const std::uint32_t M = sel->prefix;
  const std::size_t base = blockIdx.x * kTile;
  std::uint64_t c = 0;
  for (unsigned r = 0; r < kRounds; ++r) {
    const std::size_t i = base + r * kThreads + threadIdx.x;
    if (i < n) {
      const std::uint32_t m = magnitude(g, i);
      c += (m > M ? (std::uint64_t{1} << 32) : 0) + (m == M ? 1 : 0);
    }
  }
  const std::uint64_t total = Reduce(tmp).Sum(c);
  if (threadIdx.x == 0) tiles[blockIdx.x] = total;
}

// In-place exclusive scan of the tiles' packed counts, one block, a chunk of kThreads * 4 tiles per turn.
__global__ void tile_scan_kernel(std::uint64_t* tiles, std::size_t count) {
  constexpr int kPer = 4;
  using Scan = cub::BlockScan<std::uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  std::uint64_t carry = 0;
  for (std::size_t base = 0; base < count; base += kThreads * kPer) {
    std::uint64_t v[kPer], out[kPer];
    for (int j = 0; j < kPer; ++j) {
      const std::size_t t = base + threadIdx.x * kPer + j;
      v[j] = t < count ? tiles[t] : 0;
    }
    std::uint64_t chunk = 0;
    Scan(tmp).ExclusiveSum(v, out, chunk);
    for (int j = 0; j < kPer; ++j) {
      const std::size_t t = base + threadIdx.x * kPer + j;
      if (t < count) tiles[t] = carry + out[j];
    }
    carry += chunk;
    __syncthreads();  // tmp is reused by the next chunk
  }
}

__global__ void tile_write_kernel(const float* g, std::size_t n, const Selection* sel, const std::uint64_t* tiles,
                                  std::size_t k, std::uint32_t* indices, float* values) {
  using Scan = cub::BlockScan<std::uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const std::uint32_t M = sel->prefix;
  const std::uint64_t need = sel->remaining;  // equal magnitudes to keep (the lowest indices among them)
  const std::uint64_t start = tiles[blockIdx.x];
  std::uint64_t greater_before = start >> 32, equal_before = start & 0xffffffffu;
  const std::size_t base = blockIdx.x * kTile;
  for (unsigned r = 0; r < kRounds; ++r) {
    const std::size_t i = base + r * kThreads + threadIdx.x;
    std::uint32_t m = 0;
    bool gt = false, eq = false;
    if (i < n) {
      m = magnitude(g, i);
      gt = m > M;
      eq = m == M;
    }
    const std::uint64_t flag = (gt ? (std::uint64_t{1} << 32) : 0) + (eq ? 1 : 0);
    std::uint64_t before = 0, round_total = 0;
    Scan(tmp).ExclusiveSum(flag, before, round_total);
    const std::uint64_t g_before = greater_before + (before >> 32);
    const std::uint64_t e_before = equal_before + (before & 0xffffffffu);
    if (gt || (eq && e_before < need)) {
      const std::uint64_t pos = g_before + (e_before < need ? e_before : need);
      if (pos < k) {  // always true; guards the payload against a broken invariant
        indices[pos] = static_cast<std::uint32_t>(i);
        values[pos] = g[i];
      }
    }
    greater_before += round_total >> 32;
    equal_before += round_total & 0xffffffffu;
    __syncthreads();  // tmp is reused by the next round
  }
}

__global__ void topk_decode_kernel(const std::uint32_t* indices, const float* values, std::size_t n, std::size_t k,
                                   float* out, bool subtract, int* bad) {
  for (std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; j < k;
       j += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    const std::uint32_t i = indices[j];
    if (i >= n) {
      atomicAdd(bad, 1);
      continue;
    }
    // Our payloads' indices are distinct; atomics keep a foreign payload with repeated indices adding up as on
    // the CPU.
    atomicAdd(out + i, subtract ? -values[j] : values[j]);
  }
}

std::size_t tile_count(std::size_t n) { return (n + kTile - 1) / kTile; }

}  // namespace

std::size_t topk_workspace_bytes(std::size_t n) {
  return kMaxBins * sizeof(std::uint32_t) + sizeof(Selection) + 8 /* alignment */ + tile_count(n) * 8;
}

void topk_encode(const float* g, std::size_t n, std::size_t k, std::byte* payload, void* workspace, cudaStream_t s) {
  if (k == 0) return;
  auto* hist = static_cast<std::uint32_t*>(workspace);
  auto* sel = reinterpret_cast<Selection*>(hist + kMaxBins);
  auto* tiles = reinterpret_cast<std::uint64_t*>(static_cast<std::byte*>(workspace) + kMaxBins * 4 + 8);
  check(cudaMemsetAsync(hist, 0, kMaxBins * sizeof(std::uint32_t), s), "cudaMemsetAsync");
  start_kernel<<<1, 1, 0, s>>>(sel, static_cast<std::uint32_t>(k));
  const unsigned grid = grid_for(n, kThreads);
  for (const Pass& pass : kPasses) {
    histogram_kernel<<<grid, kThreads, 0, s>>>(g, n, pass, sel, hist);
    pick_kernel<<<1, kThreads, 0, s>>>(hist, pass, sel);
  }
  const std::size_t tiles_n = tile_count(n);
  tile_count_kernel<<<static_cast<unsigned>(tiles_n), kThreads, 0, s>>>(g, n, sel, tiles);
  tile_scan_kernel<<<1, kThreads, 0, s>>>(tiles, tiles_n);
  auto* indices = reinterpret_cast<std::uint32_t*>(payload);
  auto* values = reinterpret_cast<float*>(payload + 4 * k);
  tile_write_kernel<<<static_cast<unsigned>(tiles_n), kThreads, 0, s>>>(g, n, sel, tiles, k, indices, values);
  check(cudaGetLastError(), "topk select kernels");
}

void topk_decode(const std::byte* payload, std::size_t n, std::size_t k, float* out, Out mode, int* bad,
                 cudaStream_t s) {
  if (n == 0) return;
  if (mode == Out::kAssign) check(cudaMemsetAsync(out, 0, n * sizeof(float), s), "cudaMemsetAsync");
  if (k == 0) return;
  const auto* indices = reinterpret_cast<const std::uint32_t*>(payload);
  const auto* values = reinterpret_cast<const float*>(payload + 4 * k);
  topk_decode_kernel<<<grid_for(k, kThreads), kThreads, 0, s>>>(indices, values, n, k, out, mode == Out::kSubtract,
                                                                bad);
  check(cudaGetLastError(), "topk decode kernel");
}

}  // namespace hopwise::compression::cuda::kernels
