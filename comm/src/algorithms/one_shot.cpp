// One-shot allreduce ("one_shot", formerly "direct") for small messages: every rank makes its whole buffer available to
// every other rank and reduces all p inputs itself. One round of latency instead of the ring's 2(p-1) or
// halving-doubling's 2 log p, at the price of (p-1)·n bytes per rank, so the cost model picks it only for small n.
// Every rank reduces in rank order, so every rank ends with the same bits.
//
// Where the transport offers shared slots (all ranks on one host), there are no messages at all: each rank
// copies its input into its slot and raises its sequence flag; once every flag is up, each reads all slots.
#include <sched.h>

#include <fmt/core.h>
#include <fmt/ranges.h>
#include <atomic>
#include <chrono>
#include <cstring>

#include <functional>
#include "hopwise/common/error.h"
#include "shared_flags.h"

#include "algorithms.h"
#include "hopwise/comm/cost_model.h"
#include "hopwise/common/reduce.h"

namespace hopwise::comm::algo {

namespace {

void reduce_inputs(int p, DataType dt, ReduceOp op, void* out, std::size_t count,
                   const std::function<const char*(int)>& input) {
  if (p == 1) {
    if (out != input(0)) copy_bytes(out, input(0), count * dtype_size(dt));
    return;
  }
  reduce_into(dt, op, out, input(0), input(1), count);
  for (int r = 2; r < p; ++r) reduce_into(dt, op, out, out, input(r), count);
}

}  // namespace

bool one_shot_allreduce_shared(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                               double scale) {
  Transport& t = c.transport;
  SharedSlots* sh = t.shared_slots();
  const std::size_t bytes = count * dtype_size(dt);
  if (sh == nullptr || bytes > sh->slot_bytes) return false;
  const std::uint64_t seq = ++sh->seq;
  const std::size_t which = SharedSlots::kHeader + (seq % 2) * sh->slot_bytes;
  // This buffer was last read in call seq-2; a rank's flag reaches seq-1 only after it finished that call.
  wait_for_flags(t, *sh, seq - 1);
  char* mine = sh->base[static_cast<std::size_t>(t.rank())];
  if (bytes != 0) copy_bytes(mine + which, in, bytes);
  sh->bytes_in.fetch_add(bytes, std::memory_order_relaxed);
  publish_stamp(t, mine, seq);
  flag_of(mine).store(seq, std::memory_order_release);
  wait_for_flags(t, *sh, seq);
  compare_stamps(t, *sh, seq);
  reduce_inputs(t.size(), dt, op, out, count, [&](int r) { return sh->base[static_cast<std::size_t>(r)] + which; });
  if (scale != 1.0) scale_by(dt, out, count, scale);
  return true;
}

void one_shot_allreduce(const Context& c, const void* in, void* out, std::size_t count, DataType dt, ReduceOp op,
                        double scale) {
  if (one_shot_allreduce_shared(c, in, out, count, dt, op, scale)) return;
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
      reqs.push_back(
          t.irecv(others + static_cast<std::size_t>(r) * bytes + j, std::min(piece, bytes - j), r, kTagOneShot));
  }
  for (int k = 1; k < p; ++k) {
    const int r = (me + k) % p;  // stagger the destinations so that not everyone writes to rank 0 first
    for (std::size_t j = 0; j < bytes; j += piece)
      reqs.push_back(t.isend(static_cast<const char*>(in) + j, std::min(piece, bytes - j), r, kTagOneShot));
  }
  t.wait_all(reqs);
  // In place, the first reductions into out would overwrite this rank's input before its turn: keep a copy.
  const char* mine = static_cast<const char*>(in);
  if (in == out && p > 2 && bytes != 0) {
    copy_bytes(others + static_cast<std::size_t>(me) * bytes, in, bytes);
    mine = others + static_cast<std::size_t>(me) * bytes;
  }
  reduce_inputs(p, dt, op, out, count,
                [&](int r) { return r == me ? mine : others + static_cast<std::size_t>(r) * bytes; });
  if (scale != 1.0) scale_by(dt, out, count, scale);
}

AlgorithmInfo one_shot_row() {
  AlgorithmInfo r;
  r.name = "one_shot";
  r.aliases = {"one-shot", "direct", "oneshot"};
  r.collectives = {Collective::kAllreduce};
  r.summary = "one-shot: every rank reads every input and reduces all p itself (shared slots, else eager messages)";
  r.estimate = [](const CostQuery& q) {
    const CostParams& m = *q.params;
    const double n = static_cast<double>(q.bytes), P = q.ranks;
    // Through shared slots: one copy in, no messages. Else (p-1) whole buffers arrive as 2 KiB eager pieces.
    if (m.alpha_shared > 0 && n <= m.shared_slot_bytes) return m.alpha_shared + n * m.beta + (P - 1) * n * m.gamma;
    return m.alpha + (P - 1) * n * (beta_for(m, 0) + m.gamma);
  };
  r.run = [](AlgorithmContext& a, const CollectiveCall& c) {
    one_shot_allreduce(context_of(a), c.in, c.out, c.count, c.dt, c.op, c.scale);
  };
  return r;
}

}  // namespace hopwise::comm::algo
