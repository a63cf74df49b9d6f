// One-shot allreduce for small messages: every rank sends its whole buffer to every other rank and reduces all
// p inputs itself. One round of latency instead of the ring's 2(p-1) or halving-doubling's 2 log p, at the price
// of (p-1)·n bytes per rank, so the cost model picks it only for small n. Every rank reduces in rank order, so
// every rank ends with the same bits.
#include <cstring>

#include "algorithm.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

void direct_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                      double scale) {
  Transport& t = c.transport;
  const int p = t.size(), me = t.rank();
  const std::size_t es = dtype_size(dt), bytes = count * es;
  // Small buffers go in pieces below the transport's eager threshold (Open MPI's shared-memory BTL: 4 KiB), so
  // that no handshake is needed; large ones (where the cost model would not pick this) in the usual chunks.
  const std::size_t piece = bytes <= 16384 ? std::min<std::size_t>(c.chunk_bytes, 2048) : c.chunk_bytes;
  char* others = static_cast<char*>(c.workspace.get(Scratch::kWork, bytes * static_cast<std::size_t>(p) + 64));
  Requests reqs(t);
  for (int r = 0; r < p; ++r) {
    if (r == me) continue;
    for (std::size_t j = 0; j < bytes; j += piece)
      reqs.push_back(t.irecv(others + static_cast<std::size_t>(r) * bytes + j, std::min(piece, bytes - j), r, kTagDirect));
  }
  for (int k = 1; k < p; ++k) {
    const int r = (me + k) % p;  // stagger the destinations so that not everyone writes to rank 0 first
    for (std::size_t j = 0; j < bytes; j += piece)
      reqs.push_back(t.isend(static_cast<const char*>(in) + j, std::min(piece, bytes - j), r, kTagDirect));
  }
  t.wait_all(reqs);
  // In place, the first reductions into out would overwrite this rank's input before its turn: keep a copy.
  const char* mine = static_cast<const char*>(in);
  if (in == out && p > 2 && bytes != 0) {
    std::memcpy(others + static_cast<std::size_t>(me) * bytes, in, bytes);
    mine = others + static_cast<std::size_t>(me) * bytes;
  }
  auto input = [&](int r) { return r == me ? mine : others + static_cast<std::size_t>(r) * bytes; };
  if (p == 1) {
    if (out != in) std::memmove(out, in, bytes);
  } else {
    reduce_into(dt, op, out, input(0), input(1), count);
    for (int r = 2; r < p; ++r) reduce_into(dt, op, out, out, input(r), count);
  }
  if (scale != 1.0) scale_by(dt, out, count, scale);
}

}  // namespace hopwise::comm::algo
