// The ring allreduce of DeviceAlgorithm::kRing: reduce-scatter then allgather along the planned ring order, each
// step one NCCL group of a send to the next rank and a receive from the previous one, in chunks of at most
// ring_chunk_bytes, received chunks combined on the stream by hopwise::cuda::reduce_into. Cost: 2 (n - 1) steps
// of count / n elements each, cut into the host ring's blocks (algo::Blocks, algorithms/ring.cpp).
#include <algorithm>

#include "../algorithms/algorithms.h"
#include "device_impl.h"
#include "hopwise/common/cuda_reduce.h"

namespace hopwise::comm {

using Impl = detail::DeviceCommunicatorImpl;

void Impl::group_send_recv(const void* sbuf, std::size_t scount, int dst, void* rbuf, std::size_t rcount, int src,
                           DataType dt, const std::string& what) {
  if (scount == 0 && rcount == 0) return;
  const ncclResult_t g = ncclGroupStart();
  if (g != ncclSuccess) fail_nccl(g, what);
  ncclResult_t r = ncclSuccess;
  if (scount > 0) r = ncclSend(sbuf, scount, nccl_dtype(dt), dst, comm, stream);
  if (rcount > 0 && (r == ncclSuccess || r == ncclInProgress))
    r = ncclRecv(rbuf, rcount, nccl_dtype(dt), src, comm, stream);
  const ncclResult_t e = ncclGroupEnd();  // always close the group, even after an error inside it
  if (r != ncclSuccess && r != ncclInProgress) fail_nccl(r, what);
  settle(e, what);
}

void Impl::ring_allreduce(const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                          const std::string& what) {
  if (count == 0) return;
  const std::size_t es = dtype_size(dt);
  auto* o = static_cast<char*>(out);
  if (in != out)
    cuda::check(cudaMemcpyAsync(out, in, count * es, cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync (ring allreduce input)", rank);
  const int n = size;
  if (n == 1) return;  // one rank: sum, min, max, prod and avg are the input itself
  const int pos = algo::position_of(ring, rank);
  const int next = ring[static_cast<std::size_t>((pos + 1) % n)];
  const int prev = ring[static_cast<std::size_t>((pos + n - 1) % n)];
  // The host ring's blocks: near-equal, the first count % n one element longer (block 0 the longest).
  const algo::Blocks blocks = algo::Blocks::even(count, n);
  auto mod = [n](int x) { return ((x % n) + n) % n; };
  auto start = [&](int b) { return blocks.off(b); };
  auto len = [&](int b) { return blocks.len(b); };
  const std::size_t chunk = std::max<std::size_t>(1, options.ring_chunk_bytes / es);
  const std::size_t max_block = blocks.len(0);
  // Workspaces first: growing one drains the stream, which must not happen halfway through the ring.
  char* tmp = static_cast<char*>(grow(ring_tmp, std::min(max_block, chunk) * es, what));
  const ReduceOp combine = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
  // One step: send block sb to next while receiving block rb from prev (chunk by chunk, so that both ends of a
  // link cut a block the same way); `reduce`: combine what arrives into rb, else overwrite rb.
  auto step = [&](int sb, int rb, bool reduce) {
    const std::size_t slen = len(sb), rlen = len(rb);
    char* sbuf = o + start(sb) * es;
    char* rbuf = o + start(rb) * es;
    for (std::size_t off = 0; off < std::max(slen, rlen); off += chunk) {
      const std::size_t sl = off < slen ? std::min(chunk, slen - off) : 0;
      const std::size_t rl = off < rlen ? std::min(chunk, rlen - off) : 0;
      group_send_recv(sbuf + off * es, sl, next, reduce ? tmp : rbuf + off * es, rl, prev, dt, what);
      if (reduce && rl > 0) cuda::reduce_into(dt, combine, rbuf + off * es, rbuf + off * es, tmp, rl, stream);
    }
  };
  for (int s = 0; s < n - 1; ++s) step(mod(pos - s), mod(pos - s - 1), true);
  // This rank now holds the complete block pos + 1.
  if (op == ReduceOp::kAvg) {
    const int own = mod(pos + 1);
    scale_down(dt, o + start(own) * es, len(own));
  }
  for (int s = 0; s < n - 1; ++s) step(mod(pos + 1 - s), mod(pos - s), false);
}

}  // namespace hopwise::comm
