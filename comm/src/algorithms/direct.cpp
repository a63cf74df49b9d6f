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
  // Small messages go below the transport's eager threshold (Open MPI's shared-memory BTL: 4 KiB) in pieces.
  const std::size_t piece = std::min<std::size_t>(c.chunk_bytes, 2048);
  char* others = static_cast<char*>(c.workspace.get(Scratch::kWork, bytes * static_cast<std::size_t>(p) + 64));
  std::vector<Request> reqs;
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
  auto input = [&](int r) { return r == me ? static_cast<const char*>(in) : others + static_cast<std::size_t>(r) * bytes; };
  if (p == 1) {
    if (out != in) std::memmove(out, in, bytes);
  } else {
    reduce_into(dt, op, out, input(0), input(1), count);
    for (int r = 2; r < p; ++r) reduce_into(dt, op, out, out, input(r), count);
  }
  if (scale != 1.0) scale_by(dt, out, count, scale);
}

}  // namespace hopwise::comm::algo
